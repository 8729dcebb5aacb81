"""Timing that survives a noisy, shared machine.

Candidates are timed in interleaved rounds (every round runs every candidate once, in a shuffled
order), so a burst of load from elsewhere hits all of them alike. Each round runs a candidate
enough times to last ``min_round_s``. We report the median per-call time and, as the noise
figure, the interquartile range of the rounds divided by the median.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax


@dataclass(frozen=True)
class Timing:
    name: str
    median_s: float
    noise: float  # (q3 - q1) / median over rounds
    rounds: int
    calls_per_round: int

    def ratio_to(self, baseline: Timing) -> float:
        return self.median_s / baseline.median_s


def _run(fn: Callable[[], object]) -> None:
    jax.block_until_ready(fn())


def compare(
    candidates: dict[str, Callable[[], object]],
    *,
    rounds: int = 15,
    min_round_s: float = 0.05,
    seed: int = 0,
) -> dict[str, Timing]:
    """Time thunks (compiled, warmed up here) in interleaved rounds."""
    calls = {}
    for name, fn in candidates.items():
        _run(fn)  # compile
        _run(fn)
        start = time.perf_counter()
        _run(fn)
        once = max(time.perf_counter() - start, 1e-7)
        calls[name] = max(1, int(min_round_s / once))
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    order = list(candidates)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            fn, n = candidates[name], calls[name]
            start = time.perf_counter()
            for _ in range(n):
                out = fn()
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - start) / n)
    result = {}
    for name, values in samples.items():
        q1, median, q3 = statistics.quantiles(values, n=4)
        result[name] = Timing(name, median, (q3 - q1) / median, rounds, calls[name])
    return result


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:7.3f} s "
    if seconds >= 1e-3:
        return f"{seconds * 1e3:7.3f} ms"
    return f"{seconds * 1e6:7.1f} us"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])
