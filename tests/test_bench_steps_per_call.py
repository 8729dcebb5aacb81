"""benchmarks/bench_steps_per_call.py: both feeds, both settings, the same losses.

No timing is asserted (the machines are shared); the quick models check that every case ran
its rounds and that ``"auto"`` trained to the same losses as one iteration per call.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_steps_per_call as bench


@pytest.mark.slow  # 16 trainnet runs of the quick transformer
def test_the_benchmark_runs_every_case_and_checks_the_losses():
    result = bench.measure("transformer", quick=True, rounds=1)
    assert set(result) == {(f, s) for f in bench.FEEDS for s in bench.SETTINGS}
    for case in result.values():
        assert len(case["step_s"]) == 1
        assert len(case["losses"]) == bench.BATCHES[True]
    for feed in bench.FEEDS:
        np.testing.assert_allclose(result[feed, "auto"]["losses"], result[feed, 1]["losses"],
                                   rtol=1e-6)  # fmt: skip
    # one call per iteration, against the first alone and then the rest in one call
    for feed in bench.FEEDS:
        assert result[feed, 1]["calls"] == bench.BATCHES[True], feed
        assert result[feed, "auto"]["calls"] == 2, feed
    text = bench.report("transformer", result)
    assert f"transformer, iterable ({bench.BATCHES[True]} / 2 calls)" in text, text
