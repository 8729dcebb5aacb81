"""Several steps per call: trainnet's ``steps_per_execution`` 1 against ``"auto"``.

``TrainingOptions(steps_per_execution="auto")`` runs up to 16 iterations in one compiled call
on one CPU device (``difffn/_training/_chunk.py``; ``docs/performance.md``, "Several steps per
call"). This times ``df.trainnet`` on the models of ``bench_models`` (the same network, data
and options) with one iteration per call and with ``"auto"``, fed two ways: in-memory arrays
(gathered inside the loop) and a list of mini-batches (an iterable: read ahead and stacked).

Method: for each case, a short run (one mini-batch) and a long run (``BATCHES`` mini-batches)
back to back; the time per step is their difference over the extra steps, free of the setup
(and, after the first round, of compilation: trainnet's steps are shared by runs of the same
network and options). Rounds alternate the cases; the first round is dropped. Printed: each
round's time per step, the speed-up of the best rounds and of the medians (the best round is
the smallest of the per-round differences, not ``bench_models``' fastest long run less its
fastest short one), the number of compiled calls of each long run, and the losses' largest
difference between ``"auto"`` and one per call (which must be zero or float32 rounding).

``python -m benchmarks.bench_steps_per_call [--model transformer] [--rounds 3] [--quick]``
(``--quick``: the small models of ``bench_models`` and three batches, a smoke run whose times
are noise, even negative; the calls and losses are still checked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import numpy as np

import difffn as df

from . import bench_models
from ._timing import table

BATCHES = {False: 33, True: 3}
ROUNDS = {False: 3, True: 2}
FEEDS = ("arrays", "iterable")
SETTINGS = (1, "auto")


def _train(model, sizes, net, X, T, feed: str, setting, batches: int):
    """One trainnet run on the first ``batches`` mini-batches: (seconds, losses, calls)."""
    n = batches * sizes.batch
    options = bench_models.difffn_options(sizes).replace(max_epochs=1, steps_per_execution=setting)
    start = time.perf_counter()
    if feed == "arrays":
        trained, info = df.trainnet(X[:n], T[:n], net, "crossentropy", options)
    else:
        data = [(X[i : i + sizes.batch], T[i : i + sizes.batch]) for i in range(0, n, sizes.batch)]
        trained, info = df.trainnet(data, net, "crossentropy", options)
    jax.block_until_ready(jax.tree.leaves(trained))
    history = info.training_history  # the rows of one call share its time_elapsed
    calls = len(set(np.asarray(history["time_elapsed"]).tolist()))
    return time.perf_counter() - start, np.asarray(history["loss"]), calls


def measure(model_name: str, quick: bool = False, rounds: int | None = None) -> dict:
    """``{(feed, setting): {"step_s": [per round], "losses": array, "calls": int}}`` for one
    model (``calls``: the compiled calls of the long run)."""
    model = bench_models.MODELS[model_name]
    sizes = model.QUICK if quick else model.FULL
    batches = BATCHES[quick]
    X, T = model.data(sizes, batches)
    net = model.difffn_network(sizes)
    rounds = rounds or ROUNDS[quick]
    out: dict = {(f, s): {"step_s": []} for f in FEEDS for s in SETTINGS}
    for r in range(rounds + 1):  # the first round compiles; dropped
        for feed in FEEDS:
            for setting in SETTINGS:
                short, _, _ = _train(model, sizes, net, X, T, feed, setting, 1)
                long, losses, calls = _train(model, sizes, net, X, T, feed, setting, batches)
                if r:
                    out[feed, setting]["step_s"].append((long - short) / (batches - 1))
                out[feed, setting].update(losses=losses, calls=calls)
    return out


def report(model_name: str, result: dict) -> str:
    rows = []
    for feed in FEEDS:
        one, auto = result[feed, 1], result[feed, "auto"]
        best_one, best_auto = min(one["step_s"]), min(auto["step_s"])
        diff = float(np.max(np.abs(one["losses"] - auto["losses"])))
        rows.append(
            [
                f"{model_name}, {feed} ({one['calls']} / {auto['calls']} calls)",
                " / ".join(f"{v * 1e3:.1f}" for v in one["step_s"]),
                " / ".join(f"{v * 1e3:.1f}" for v in auto["step_s"]),
                f"{best_one / best_auto:.2f}x",
                f"{statistics.median(one['step_s']) / statistics.median(auto['step_s']):.2f}x",
                f"{diff:.1e}",
            ]
        )
    header = [
        "model, data",
        "1 per call, ms/step (rounds)",
        '"auto", ms/step (rounds)',
        "speed-up (best rounds)",
        "(medians)",
        "losses, largest difference",
    ]
    return table(rows, header)


def run(quick: bool = False) -> None:
    for name in ("resnet", "transformer"):
        print(report(name, measure(name, quick)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_steps_per_call")
    parser.add_argument("--model", action="append", choices=sorted(bench_models.MODELS))
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    for name in args.model or ("resnet", "transformer"):
        print(report(name, measure(name, args.quick, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
