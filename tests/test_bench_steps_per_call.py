"""benchmarks/bench_steps_per_call.py: both feeds, both settings, the same losses.

No timing is asserted (the machines are shared); the quick models check that every case ran
its rounds and that ``"auto"`` trained to the same losses as one iteration per call.
"""

from __future__ import annotations

import numpy as np

from benchmarks import bench_steps_per_call as bench


def test_the_benchmark_runs_every_case_and_checks_the_losses():
    result = bench.measure("transformer", quick=True, rounds=1)
    assert set(result) == {(f, s) for f in bench.FEEDS for s in bench.SETTINGS}
    for case in result.values():
        assert len(case["step_s"]) == 1
        assert len(case["losses"]) == bench.BATCHES[True]
    for feed in bench.FEEDS:
        np.testing.assert_allclose(result[feed, "auto"]["losses"], result[feed, 1]["losses"],
                                   rtol=1e-6)  # fmt: skip
    text = bench.report("transformer", result)
    assert "transformer, iterable" in text and "speed-up (fastest)" in text
