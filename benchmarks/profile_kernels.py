"""Kernel-level profile of one training step: difffn's ``trainnet`` (XLA:CPU) against PyTorch eager.

Issue 29 asks where the training gap to PyTorch on CPU lies. This profiles the models of
``bench_models`` (``--model resnet`` or ``transformer``), each side in its own process:

- difffn: ``df.trainnet`` runs once to compile, then ``STEPS`` steps under ``jax.profiler.trace``,
  as a user's run has them: several steps per compiled call (``steps_per_execution="auto"``,
  module ``jit_train_steps``, a loop whose body's thunks each record an event per iteration),
  or one per call (module ``jit_step``). XLA:CPU records one trace event per executed thunk (its
  ``hlo_op``); their durations are summed per HLO instruction of each module, divided by the
  steps trained, and classified from the optimized HLO that ``--xla_dump_to`` writes for it
  (a fusion by the heaviest operation inside it: convolution, dot, reduce-window, reduce,
  transpose, else elementwise; a convolution whose output is a filter,
  ``dim_labels=...->01..``, is a filter gradient).
- PyTorch eager: the same model, parameters and data (``benchmarks/_torch.py``), ``STEPS``
  steps under ``torch.profiler``; each ATen operator's self CPU time.

Both tables give each kernel's time per step and its share of the kernels' total. A thunk's
event lasts as long as the thunk, whatever threads its work used; an ATen operator's self time
likewise is the calling thread's, intra-op threads included; so the two columns compare wall
time spent per kernel, not CPU time.

Run: ``python -m benchmarks.profile_kernels [--model resnet] [--steps 6] [--quick]``. Without
torch in this environment, name a Python that has it (and numpy): ``--torch-python
/path/to/venv/bin/python`` (it imports neither JAX nor difffn).
"""

from __future__ import annotations

import argparse
import collections
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time

STEPS = 6
TOP = 12
_HEAVY = ("convolution", "dot", "reduce-window", "select-and-scatter", "reduce", "transpose")


# -- difffn / XLA:CPU ------------------------------------------------------------------------------


def _entry_instructions(hlo: str) -> dict[str, str]:
    """``{instruction name: its HLO line}`` of the entry computation and every computation
    (names are unique within a module)."""
    out = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def entry_names(hlo: str) -> list[str]:
    """The names of the entry computation's instructions, in order."""
    entry = hlo[hlo.find("ENTRY") :] if "ENTRY" in hlo else ""
    return re.findall(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", entry, re.M)


def _computations(hlo: str) -> dict[str, str]:
    """``{computation name: its body}``."""
    out, name, body = {}, None, []
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if m and not line.startswith(" "):
            name, body = m.group(1), []
        elif line.startswith("}") and name is not None:
            out[name] = "\n".join(body)
            name = None
        elif name is not None:
            body.append(line)
    return out


def _opcode(rest: str) -> str:
    """The opcode of an HLO instruction's right-hand side (``f32[..]{..} convolution(...)``)."""
    m = re.match(r"^(?:\(.*?\)|\S+)\s+([\w\-]+)\(", rest)
    return m.group(1) if m else "?"


def _dims(rest: str) -> tuple[int, ...]:
    """The dimensions of an instruction's (first) result: ``f32[4,8,8,4]{3,2,1,0} ...``."""
    m = re.match(r"^\(?\w+\[([\d,]*)\]", rest)
    return tuple(int(n) for n in m.group(1).split(",") if n) if m else ()


def _shape(dims: tuple[int, ...]) -> str:
    return "[" + "x".join(map(str, dims)) + "]"


def classify(name: str, instructions: dict[str, str], computations: dict[str, str]) -> str:
    """A short description of one thunk: its kind and, for convolutions, which one."""
    rest = instructions.get(name)
    if rest is None:
        return "?"
    lines = [rest]
    for computation in re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", rest):
        lines += _entry_instructions(computations.get(computation, "")).values()
    ops = [_opcode(line) for line in lines]
    kind = next((op for op in _HEAVY if op in ops), ops[0])
    if kind == "convolution":
        # XLA writes every convolution as b01f_01io->b01f (transposes around it), so which one
        # it is shows in its shapes: a filter gradient's window spans the image and its output
        # is the filter's size; the backward pass's ops are named "transpose(jvp())".
        conv = lines[ops.index("convolution")]
        window = re.search(r"window=\{([^}]*)\}", conv)
        size = re.search(r"size=([\dx]+)", window.group(1)) if window else None
        out = _dims(conv)
        what = "conv forward"
        if size and len(out) == 4 and max(out[1:3]) < min(int(n) for n in size.group(1).split("x")):
            what = "conv filter gradient"
        elif "transpose(jvp" in rest + conv:
            what = "conv input gradient"
        where = "" if conv is rest else " (fused)"
        return f"{what} -> {_shape(out)}{where}" + (f" [{window.group(1)}]" if window else "")
    if kind == "dot":
        return f"dot -> {_shape(_dims(lines[ops.index('dot')]))}"
    if kind in ("copy", "transpose"):
        return "transpose/copy (layout)"
    if kind in ("reduce-window", "select-and-scatter"):
        return "pooling"
    if kind == "reduce":
        return "reduction (+ elementwise)"
    if kind == "custom-call":
        return "custom call"
    return "elementwise" if kind in ("fusion", "?") else kind


MODULES = ("jit_step", "jit_train_steps")  # trainnet's step: one per call, several per call


def _step_hlo(dump: str, module: str) -> str:
    """The optimized HLO text of ``module`` in the dump folder (the largest, if several)."""
    # module_0004.jit_train_steps.cpu_after_optimizations.txt, not its -live-range.txt etc.
    files = sorted(glob.glob(os.path.join(dump, f"*.{module}.*_after_optimizations.txt")))
    if not files:
        return ""
    with open(max(files, key=os.path.getsize)) as f:
        return f.read()


def jax_worker(model_name: str, steps: int, quick: bool) -> None:
    """In a process whose ``XLA_FLAGS`` dump the optimized HLO: difffn's kernels per step."""
    import jax

    import difffn as df

    from . import bench_models

    model = bench_models.MODELS[model_name]
    sizes = model.QUICK if quick else model.FULL
    X, T = model.data(sizes, steps)
    net = model.difffn_network(sizes)
    options = bench_models.difffn_options(sizes).replace(max_epochs=1)
    jax.block_until_ready(jax.tree.leaves(df.trainnet(X, T, net, "crossentropy", options)[0]))
    trace = tempfile.mkdtemp(prefix="difffn-trace-")
    start = time.perf_counter()
    with jax.profiler.trace(trace):
        trained, info = df.trainnet(X, T, net, "crossentropy", options)
        jax.block_until_ready(jax.tree.leaves(trained))
    wall = time.perf_counter() - start
    data = jax.profiler.ProfileData.from_file(
        glob.glob(os.path.join(trace, "**", "*.xplane.pb"), recursive=True)[0]
    )
    per_op: dict[tuple[str, str], float] = collections.defaultdict(float)
    calls: dict[str, set] = collections.defaultdict(set)
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                module = stats.get("hlo_module")
                if module not in MODULES or event.name.startswith("end: "):
                    continue
                per_op[module, stats.get("hlo_op", event.name)] += event.duration_ns * 1e-9
                calls[module].add(stats.get("run_id"))
    trained = len(info.training_history)  # iterations, however many calls held them
    rows = []
    for module in calls:
        hlo = _step_hlo(os.environ["PROFILE_KERNELS_DUMP"], module)
        instructions, computations = _entry_instructions(hlo), _computations(hlo)
        for (m, name), seconds in per_op.items():
            if m == module:
                kind = classify(name, instructions, computations)
                group = kind.split(" -> ")[0]
                rows.append({"kernel": name, "kind": kind, "group": group, "s": seconds / trained})
    counts = {m: len(c) for m, c in calls.items()}
    result = {"steps": trained, "calls": counts, "wall_per_step_s": wall / steps, "rows": rows}
    print(json.dumps(result))


# -- PyTorch eager ---------------------------------------------------------------------------------


def torch_worker(model_name: str, path: str, steps: int) -> None:
    """PyTorch eager's ATen operators per step (self CPU time), same model and data."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from . import _torch

    sizes, params, state, X, T = _torch.load(path)
    train = _torch.trainer(model_name, "torch eager", sizes, params, state, X, T)
    train(1)  # warm: allocations, oneDNN primitives
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train(1)
    wall = time.perf_counter() - start
    rows = [
        {"kernel": e.key, "kind": e.key, "s": e.self_cpu_time_total * 1e-6 / steps}
        for e in prof.key_averages()
        if e.self_cpu_time_total > 0
    ]
    print(
        json.dumps(
            {
                "steps": steps,
                "wall_per_step_s": wall / steps,
                "threads": torch.get_num_threads(),
                "rows": rows,
            }
        )
    )


# -- the report ------------------------------------------------------------------------------------


def _run(command: list[str], env=None) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(result: dict, by: str) -> list[tuple[str, float, float]]:
    """``(name, seconds per step, share)`` rows, largest first, grouped by ``by``."""
    grouped: dict[str, float] = collections.defaultdict(float)
    for row in result["rows"]:
        grouped[row[by]] += row["s"]
    total = sum(grouped.values())
    return [(k, v, v / total) for k, v in sorted(grouped.items(), key=lambda kv: -kv[1])]


def _print(title: str, rows, total: float, top: int) -> None:
    print(f"\n{title}: kernels {total * 1e3:.1f} ms per step")
    for name, seconds, share in rows[:top]:
        print(f"  {seconds * 1e3:8.2f} ms {share * 100:5.1f}%  {name}")


def _torch_data(args, folder: str) -> str:
    """The ``.npz`` file of the PyTorch worker: difffn's initial parameters, ``steps`` batches."""
    import dataclasses

    import jax
    import numpy as np

    from . import _torch, bench_models

    model = bench_models.MODELS[args.model]
    sizes = model.QUICK if args.quick else model.FULL
    X, T = model.data(sizes, args.steps)
    net = model.difffn_network(sizes)
    params, state = jax.tree.map(np.asarray, bench_models.parameters(net))
    path = os.path.join(folder, f"{args.model}.npz")
    _torch.save(path, dataclasses.asdict(sizes), params, state, X, T)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_kernels")
    parser.add_argument("--model", default="resnet", choices=("resnet", "transformer"))
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--top", type=int, default=TOP)
    parser.add_argument("--torch-python", default=None, help="a Python with torch and numpy")
    parser.add_argument("--jax-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--torch-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jax_worker:
        jax_worker(args.model, args.steps, args.quick)
        return 0
    if args.torch_worker:
        torch_worker(args.model, args.torch_worker, args.steps)
        return 0

    with tempfile.TemporaryDirectory() as folder:
        dump = os.path.join(folder, "hlo")
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
        env = os.environ | {
            "XLA_FLAGS": flags,
            "PROFILE_KERNELS_DUMP": dump,
            "DIFFFN_COMPILATION_CACHE": "off",  # compile here: the dump needs the compilation
        }
        me = [sys.executable, "-m", "benchmarks.profile_kernels", "--model", args.model]
        me += ["--steps", str(args.steps)] + (["--quick"] if args.quick else [])
        jax_result = _run([*me, "--jax-worker"], env=env)
        torch_python = args.torch_python or (
            sys.executable if importlib.util.find_spec("torch") else None
        )
        torch_result = None
        if torch_python:
            torch_result = _run(
                [torch_python, *me[1:], "--torch-worker", _torch_data(args, folder)]
            )
    print(
        f"{args.model}: difffn trainnet (XLA:CPU), {jax_result['steps']} steps traced in "
        f"{', '.join(f'{n} call(s) of {m}' for m, n in jax_result['calls'].items())}, "
        f"{jax_result['wall_per_step_s'] * 1e3:.1f} ms per step under the profiler"
    )
    by_group = summary(jax_result, "group")
    total = sum(r[1] for r in by_group)
    _print("difffn, by kind of kernel", by_group, total, args.top)
    _print("difffn, the largest kernels by shape", summary(jax_result, "kind"), total, args.top)
    if torch_result is None:
        print("\nPyTorch: not profiled (no torch here; pass --torch-python).")
        return 0
    rows = summary(torch_result, "kernel")
    print(
        f"\nPyTorch eager ({torch_result['threads']} threads), {torch_result['steps']} steps, "
        f"{torch_result['wall_per_step_s'] * 1e3:.1f} ms per step under the profiler"
    )
    _print("PyTorch eager, by ATen operator (self time)", rows, sum(r[1] for r in rows), args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
