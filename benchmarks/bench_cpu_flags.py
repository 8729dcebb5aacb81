"""XLA:CPU options against the training step of the two models of ``bench_models``.

The hand-written training step of each model (``bench_models._hand_written``: the same program
difffn's ``trainnet`` compiles, without difffn's bookkeeping) is lowered once and compiled once per
candidate set of XLA:CPU options (``.compile(compiler_options=...)``: XLA's ``DebugOptions``
fields, the same names as ``XLA_FLAGS`` without the dashes), so every candidate runs in one
process, in interleaved rounds. Each is timed per step (the median and the spread of
``ROUNDS`` rounds of ``STEPS`` steps) and its losses over ``STEPS`` steps from the same start
are compared with the default's: an option that changes them by more than float32 rounding is
not safe to turn on for users.

Candidates: the oneDNN, XNNPACK and YNNPACK library fusions of matrix products (and
convolutions, eltwise and reductions where the option takes them), fast math, and the thread
and tiling options. ``python -m benchmarks cpu_flags``; ``--quick`` for the small sizes.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from . import bench_models
from ._timing import table

_T = "LIBRARY_FUSION_TYPE_"  # the options take the enum's full names, comma-separated
CANDIDATES = {
    "default": {},
    "onednn dot": {"xla_cpu_experimental_onednn_fusion_type": f"{_T}DOT"},
    "onednn dot+eltwise": {"xla_cpu_experimental_onednn_fusion_type": f"{_T}DOT,{_T}ELTWISE"},
    "xnnpack dot": {"xla_cpu_experimental_xnn_fusion_type": f"{_T}DOT"},
    "xnnpack dot+eltwise+reduce": {
        "xla_cpu_experimental_xnn_fusion_type": f"{_T}DOT,{_T}ELTWISE,{_T}REDUCE"
    },
    "ynnpack dot": {"xla_cpu_experimental_ynn_fusion_type": f"{_T}INDIVIDUAL_DOT"},
    "ynnpack dot+conv": {
        "xla_cpu_experimental_ynn_fusion_type": f"{_T}INDIVIDUAL_DOT,{_T}INDIVIDUAL_CONVOLUTION"
    },
    "ynnpack conv": {"xla_cpu_experimental_ynn_fusion_type": f"{_T}INDIVIDUAL_CONVOLUTION"},
    "fast math": {"xla_cpu_enable_fast_math": True},
    # tried for issue 29 after the first table (docs/performance.md, "XLA:CPU options")
    "512-bit vectors": {"xla_cpu_prefer_vector_width": 512},
    "concurrency scheduler": {"xla_cpu_enable_concurrency_optimized_scheduler": True},
    "onednn (use_onednn)": {"xla_cpu_use_onednn": True},
    "onednn custom calls": {"xla_cpu_experimental_onednn_custom_call": True},
    "xnnpack graph greedy": {
        "xla_cpu_experimental_xnn_graph_fusion_mode": "XNN_GRAPH_FUSION_MODE_GREEDY"
    },
    "ynnpack dot+conv+eltwise+reduce": {
        "xla_cpu_experimental_ynn_fusion_type": (
            f"{_T}INDIVIDUAL_DOT,{_T}INDIVIDUAL_CONVOLUTION,{_T}ELTWISE,{_T}REDUCE"
        )
    },
    "tiling propagation": {"xla_cpu_experimental_enable_tiling_propagation": True},
    "fast min/max": {"xla_cpu_enable_fast_min_max": True},
    # the default's YNNPACK fusions less some (issue 29, the quiet machine: its convolutions)
    "ynnpack off": {"xla_cpu_experimental_ynn_fusion_type": ""},
    "ynnpack reduce": {"xla_cpu_experimental_ynn_fusion_type": f"{_T}REDUCE"},
    "ynnpack dot+reduce": {
        "xla_cpu_experimental_ynn_fusion_type": f"{_T}INDIVIDUAL_DOT,{_T}REDUCE"
    },
    "ynnpack dot+reduce+conv": {
        "xla_cpu_experimental_ynn_fusion_type": (
            f"{_T}INDIVIDUAL_DOT,{_T}REDUCE,{_T}INDIVIDUAL_CONVOLUTION"
        )
    },
}
STEPS = {False: 3, True: 2}
ROUNDS = {False: 3, True: 1}


def _step_and_state(model_name: str, quick: bool):
    """The hand-written jitted step, its initial arguments, and the batches' count."""
    model = bench_models.MODELS[model_name]
    sizes = model.QUICK if quick else model.FULL
    batches = bench_models.BATCHES[quick]
    X, T = model.data(sizes, batches)
    net = model.difffn_network(sizes)
    forward = model.hand_written_forward(sizes)
    tx = bench_models._solver()

    def step(params, state, opt_state, X, T, b):
        x, t = bench_models._batch(X, T, b, sizes.batch)

        def loss_fn(params):
            y, new_state = forward(params, state, x)
            return bench_models._crossentropy(y, t), new_state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
        return params, state, opt_state, loss

    params, state = bench_models.parameters(net)
    start = (params, state, tx.init(params), jnp.asarray(X), jnp.asarray(T))
    return jax.jit(step), start, batches


def measure(model_name: str, quick: bool, candidates=None) -> dict:
    """``{candidate: {"step_s", "cpu_step_s", "spread", "loss_diff"} or {"error"}}`` for one
    model (``CANDIDATES`` by default, or a subset of its names)."""
    candidates = CANDIDATES if candidates is None else candidates
    if not isinstance(candidates, dict):
        candidates = {name: CANDIDATES[name] for name in ("default", *candidates)}
    step, start, batches = _step_and_state(model_name, quick)
    lowered = step.lower(*start, 0)
    compiled, errors = {}, {}
    for name, options in candidates.items():
        try:
            compiled[name] = lowered.compile(compiler_options=options or None)
        except Exception as error:  # noqa: BLE001 - an option this jaxlib rejects is a result
            errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"

    def run(fn, steps):
        params, state, opt_state, X, T = jax.tree.map(jnp.copy, start)
        losses = []
        for i in range(steps):
            params, state, opt_state, loss = fn(params, state, opt_state, X, T, i % batches)
            losses.append(loss)
        return np.asarray(jax.block_until_ready(jnp.stack(losses)))

    losses = {name: run(fn, STEPS[quick]) for name, fn in compiled.items()}  # also warms up
    times = {name: [] for name in compiled}
    cpu = {name: [] for name in compiled}  # the process's CPU time: less disturbed by load
    for _ in range(ROUNDS[quick]):
        for name, fn in compiled.items():
            begin, begin_cpu = time.perf_counter(), time.process_time()
            run(fn, STEPS[quick])
            times[name].append((time.perf_counter() - begin) / STEPS[quick])
            cpu[name].append((time.process_time() - begin_cpu) / STEPS[quick])
    reference = losses.get("default")
    result = {}
    for name in candidates:
        if name in errors:
            result[name] = {"error": errors[name]}
            continue
        t = times[name]
        diff = (
            float(np.max(np.abs(losses[name] - reference) / np.abs(reference)))
            if reference is not None
            else float("nan")
        )
        result[name] = {
            "step_s": statistics.median(t),
            "cpu_step_s": statistics.median(cpu[name]),
            "spread": (max(t) - min(t)) / statistics.median(t),
            "loss_diff": diff,
        }
    return result


def run(*, quick: bool = False, candidates=None, models=None) -> None:
    """Print each model's table (``candidates``: names of `CANDIDATES`, default all)."""
    for model_name in models or bench_models.MODELS:
        result = measure(model_name, quick, candidates)
        base, base_cpu = result["default"]["step_s"], result["default"]["cpu_step_s"]
        rows = []
        for name, r in result.items():
            if "error" in r:
                rows.append([name, "-", "-", "-", "-", "-", "-", r["error"]])
                continue
            rows.append([
                name,
                f"{r['step_s'] * 1e3:8.1f} ms",
                f"{base / r['step_s']:5.2f}x",
                f"{r['spread'] * 100:4.0f}%",
                f"{r['cpu_step_s'] * 1e3:8.1f} ms",
                f"{base_cpu / r['cpu_step_s']:5.2f}x",
                f"{r['loss_diff']:.1e}",
                "",
            ])  # fmt: skip
        print(f"\n{model_name}: hand-written step, {STEPS[quick]} steps x {ROUNDS[quick]} rounds")
        header = ["XLA:CPU options", "time/step", "vs default", "spread", "CPU/step", "vs default"]
        print(table(rows, [*header, "loss rel. diff", "error"]))


if __name__ == "__main__":
    # python -m benchmarks.bench_cpu_flags [--quick] [--model resnet] [CANDIDATE ...]
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_cpu_flags")
    parser.add_argument("candidates", nargs="*", help=f"names of {list(CANDIDATES)}")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", action="append", choices=list(bench_models.MODELS))
    args = parser.parse_args()
    run(quick=args.quick, candidates=args.candidates or None, models=args.model)
