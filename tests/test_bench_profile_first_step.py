"""benchmarks/profile_first_step.py: fresh processes on one cache folder, split by JAX's events."""

from __future__ import annotations

import pytest

from benchmarks import profile_first_step


@pytest.mark.slow
def test_a_second_process_reads_its_programs_from_the_cache(tmp_path, capsys):
    first, second = profile_first_step.run("resnet", 2, True, str(tmp_path / "cache"))
    for r in (first, second):
        assert r["whole"]["trace"] > 0 and r["whole"]["lower"] > 0
        assert 0 < r["initializers"]["lower"] < r["whole"]["lower"]
    # JAX read the second process's programs back: cache reads, none in the first
    assert first["whole"]["of which cache reads"] == 0
    assert second["whole"]["of which cache reads"] > 0
    assert second["initializers"]["of which cache reads"] > 0
    assert "run 2 (cache): imports" in capsys.readouterr().out
