"""Models at real sizes: a ResNet-style CNN and a transformer encoder in four frameworks.

The models (``_model_resnet``: 32x32x3 images, three residual stages with batch normalization,
batch 64; ``_model_transformer``: 4 layers, 4 heads, width 128, 128 steps, batch 32) are built in
difffn from its built-in layers as a ``df.Network`` and trained with ``df.trainnet``; the same
models are written by hand (a ``jax.jit`` step with donated buffers over optax), in flax.nnx
(``nnx.jit`` over ``nnx.Optimizer``) and in equinox (``eqx.filter_jit``, per-example modules
under ``vmap``), each starting from difffn's initial learnables. Every loop takes its
mini-batches in the same order from the same device-resident synthetic data (a dynamic slice
inside the compiled step), with SGD with momentum 0.9, learn rate 0.01 and no L2 (difffn's
MATLAB L2 factors, 0 for biases, would otherwise have to be copied into every framework).

Each framework runs in its own subprocess, one after another, so its peak resident memory
(``VmHWM``, see :func:`peak_rss_mib`) is its own and its time to the first step (building the model
and optimizer, compiling, one step; imports excluded) is cold. Steady state is timed in one more
subprocess that holds all four loops: in each of ``ROUNDS`` rounds every loop runs ``EPOCHS`` =
(short, long) epochs in turn; per loop, the difference of the fastest runs of each length over the
difference in steps is the time per step (the median-based figure is printed too; the rounds'
interquartile range over the median is the noise). CPU/step is the process's CPU time per step
(medians, both cores counted), which load from other processes disturbs less than wall time. The
step-0 and step-1 losses of every framework are printed: they agree when the four programs compute
the same thing.

Then two more subprocesses train the difffn model with ``TrainingOptions(compilation_cache=...)``
on one new folder: the second finds the first's compiled programs there, and its time to the
first step is printed against the first's.

Targets (issue 16): difffn >= 1.0x the hand-written loop's steps/s and >= 1.5x flax.nnx's and
equinox's; peak memory <= 1.1x the hand-written loop's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import difffn as df

from . import _model_resnet, _model_transformer, _torch
from ._memory import peak_rss_mib
from ._timing import table

MODELS = {"resnet": _model_resnet, "transformer": _model_transformer}
FRAMEWORKS = ("difffn.trainnet", "jax.jit + optax", "flax.nnx", "equinox")
LEARN_RATE, MOMENTUM = 0.01, 0.9
BATCHES = {False: 3, True: 2}  # mini-batches per epoch (full, quick)
EPOCHS = {False: (1, 3), True: (1, 2)}  # SHORT, LONG
ROUNDS = {False: 9, True: 2}
# a shorter run on a loaded machine: fewer rounds, and only some loops (difffn's and the
# hand-written one are always kept), e.g. BENCH_MODELS_LOOPS="torch eager,torch.compile"
ROUNDS_VARIABLE, LOOPS_VARIABLE = "BENCH_MODELS_ROUNDS", "BENCH_MODELS_LOOPS"
CACHE_VARIABLE = "DIFFFN_COMPILATION_CACHE"  # difffn's persistent cache in the workers


def _rounds(quick: bool) -> int:
    return int(os.environ.get(ROUNDS_VARIABLE) or ROUNDS[quick])


def selected(loops) -> tuple[str, ...]:
    """The loops to run: all, or those ``BENCH_MODELS_LOOPS`` names (and the two baselines)."""
    wanted = os.environ.get(LOOPS_VARIABLE, "")
    if not wanted:
        return tuple(loops)
    names = {n.strip() for n in wanted.split(",")} | {"difffn.trainnet", "jax.jit + optax"}
    return tuple(f for f in loops if f in names)


def parameters(net: df.Network):
    """difffn's learnables and state as ``{layer: {parameter: array}}`` dicts."""
    out = ({}, {})
    for table_, into in zip((net.learnables, net.state), out):
        for path in table_:
            layer, name = path.split("/")
            into.setdefault(layer, {})[name] = jnp.asarray(table_[path])
    return out


def _crossentropy(y, t):
    """difffn's (MATLAB's) crossentropy of probabilities and integer labels."""
    picked = jnp.take_along_axis(y, t[:, None], axis=1)
    return -jnp.sum(jnp.log(jnp.maximum(picked, jnp.finfo(y.dtype).eps))) / y.shape[0]


def _solver():
    return optax.sgd(LEARN_RATE, momentum=MOMENTUM)


def _batch(X, T, b, size):
    return (
        jax.lax.dynamic_slice_in_dim(X, b * size, size),
        jax.lax.dynamic_slice_in_dim(T, b * size, size),
    )


# -- one training loop per framework: trainer(model, sizes, X, T, net, cache) -> train(epochs) --
# train(epochs) returns (the trained leaves, the loss of every step).


_SETUP = {}  # the latest difffn setup's time to build and initialize its network


def difffn_options(sizes, cache=None) -> df.TrainingOptions:
    """difffn's training options in every loop of this benchmark (and its profile)."""
    return df.TrainingOptions(
        mini_batch_size=sizes.batch,
        shuffle="never",
        l2_regularization=0.0,
        verbose=False,
        compilation_cache=cache,
    )


def _difffn(model, sizes, X, T, net, cache=None):
    start = time.perf_counter()
    net = model.difffn_network(sizes)  # building the network is part of difffn's setup
    jax.block_until_ready(jax.tree.leaves(net))
    _SETUP["initialize_s"] = time.perf_counter() - start
    options = difffn_options(sizes, cache)

    def train(epochs):
        trained, info = df.trainnet(X, T, net, "crossentropy", options.replace(max_epochs=epochs))
        return jax.tree.leaves(trained), jnp.asarray(info.training_history["loss"])

    return train


def hand_initializer(like: Any) -> Callable[[jax.Array], Any]:
    """What a JAX user writes to make the parameters: one ``jax.jit`` function drawing every
    leaf of ``like`` (shapes and dtypes) from a key, with ``jax.nn.initializers`` (Glorot for
    arrays of two or more axes, ones for vectors)."""
    leaves, tree = jax.tree.flatten(like)
    glorot = jax.nn.initializers.glorot_uniform(in_axis=-2, out_axis=-1)

    def init(key):
        keys = jax.random.split(key, len(leaves))
        return jax.tree.unflatten(
            tree,
            [
                glorot(k, x.shape, x.dtype) if len(x.shape) >= 2 else jnp.ones(x.shape, x.dtype)
                for k, x in zip(keys, leaves)
            ],
        )

    return jax.jit(init)


def _hand_written(model, sizes, X, T, net, cache=None, initial: Any = None):
    forward = model.hand_written_forward(sizes)
    tx = _solver()

    def step(params, state, opt_state, X, T, b):
        x, t = _batch(X, T, b, sizes.batch)

        def loss_fn(params):
            y, new_state = forward(params, state, x)
            return _crossentropy(y, t), new_state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss

    step = jax.jit(step, donate_argnums=(0, 1, 2))
    Xd, Td = jnp.asarray(X), jnp.asarray(T)
    initial = parameters(net) if initial is None else initial

    def train(epochs):
        params, state = jax.tree.map(jnp.copy, initial)  # donated buffers: a fresh copy per run
        opt_state, losses = tx.init(params), []
        for _ in range(epochs):
            for b in range(len(X) // sizes.batch):
                params, state, opt_state, loss = step(params, state, opt_state, Xd, Td, b)
                losses.append(loss)
        return jax.tree.leaves(params), jnp.stack(losses)

    return train


def _nnx(model, sizes, X, T, net, cache=None):
    from flax import nnx

    @nnx.jit
    def step(module, optimizer, X, T, b):
        x, t = _batch(X, T, b, sizes.batch)
        loss, grads = nnx.value_and_grad(lambda m: _crossentropy(m(x), t))(module)
        optimizer.update(module, grads)
        return loss

    Xd, Td = jnp.asarray(X), jnp.asarray(T)
    params, _ = parameters(net)

    def train(epochs):
        module = model.nnx_model(sizes, params)
        optimizer, losses = nnx.Optimizer(module, _solver(), wrt=nnx.Param), []
        for _ in range(epochs):
            for b in range(len(X) // sizes.batch):
                losses.append(step(module, optimizer, Xd, Td, b))
        return jax.tree.leaves(nnx.state(module)), jnp.stack(losses)

    return train


def _equinox(model, sizes, X, T, net, cache=None):
    import equinox as eqx

    tx = _solver()

    @eqx.filter_jit(donate="all-except-first")
    def step(data, module, state, opt_state):
        X, T, b = data
        x, t = _batch(X, T, b, sizes.batch)

        def loss_fn(module, state):
            batched = jax.vmap(module, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
            y, state = batched(x, state)
            return _crossentropy(y, t), state

        (loss, state), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(module, state)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(module, eqx.is_array))
        return eqx.apply_updates(module, updates), state, opt_state, loss

    Xd, Td = jnp.asarray(model.to_equinox_inputs(X)), jnp.asarray(T)
    params, _ = parameters(net)
    indices = [jnp.asarray(b, jnp.int32) for b in range(len(X) // sizes.batch)]

    def train(epochs):
        # donated buffers: the module gets a fresh copy of the parameters per run
        module, state = model.equinox_model(sizes, jax.tree.map(jnp.copy, params))
        opt_state, losses = tx.init(eqx.filter(module, eqx.is_array)), []
        for _ in range(epochs):
            for b in indices:
                module, state, opt_state, loss = step((Xd, Td, b), module, state, opt_state)
                losses.append(loss)
        return jax.tree.leaves(eqx.filter(module, eqx.is_array)), jnp.stack(losses)

    return train


TRAINERS = dict(zip(FRAMEWORKS, (_difffn, _hand_written, _nnx, _equinox)))
# the hand-written loop's cold first step once more, making its own parameters in its timed part
# (difffn's does, by building and initializing its network); its losses differ (other numbers)
OWN_INIT = "jax.jit + optax, own initializers"


def torch_variants(model_name: str) -> tuple[str, ...]:
    """The PyTorch loops of a model, when torch is installed (else none)."""
    return _torch.VARIANTS[model_name] if _torch.available() else ()


def trainer(model_name: str, framework: str, *, quick: bool, batches: int, cache=None):
    """``train(epochs) -> (leaves, losses)`` of one framework on ``batches`` synthetic batches
    (a PyTorch variant's leaves are None)."""
    model = MODELS[model_name]
    sizes = model.QUICK if quick else model.FULL
    X, T = model.data(sizes, batches)
    net = model.difffn_network(sizes)
    if framework in _torch.VARIANTS[model_name]:
        params, state = jax.tree.map(np.asarray, parameters(net))
        return _torch.trainer(model_name, framework, dataclasses.asdict(sizes), params, state, X, T)
    return TRAINERS[framework](model, sizes, X, T, net, cache)


def _torch_data(model_name: str, quick: bool, folder: str) -> str:
    """The ``.npz`` file a PyTorch worker reads: sizes, difffn's initial parameters, data."""
    model = MODELS[model_name]
    sizes = model.QUICK if quick else model.FULL
    X, T = model.data(sizes, BATCHES[quick])
    params, state = jax.tree.map(np.asarray, parameters(model.difffn_network(sizes)))
    path = os.path.join(folder, f"{model_name}.npz")
    _torch.save(path, dataclasses.asdict(sizes), params, state, X, T)
    return path


# -- one framework in its own process --------------------------------------------------------------


def _worker(model_name, framework, quick, cache):
    """One framework cold in a fresh process: time to the first step, losses, peak memory."""
    jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.zeros(1)))  # start the backend first
    model = MODELS[model_name]
    sizes = model.QUICK if quick else model.FULL
    X, T = model.data(sizes, BATCHES[quick])
    # difffn builds its own network inside the timed part (an initialized network built here
    # would put its initializers' program in the compilation cache before the first run)
    net = None if framework == FRAMEWORKS[0] else model.difffn_network(sizes)
    if framework == OWN_INIT:  # the shapes a user's code states; the values drawn when timed
        like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), parameters(net))
        start, start_cpu = time.perf_counter(), time.process_time()
        initial = hand_initializer(like)(jax.random.key(0))
        train = _hand_written(model, sizes, X[: sizes.batch], T[: sizes.batch], net, None, initial)
        _, losses = jax.block_until_ready(train(1))
        first = {"first_step_s": time.perf_counter() - start, "first_loss": float(losses[0])}
        print(json.dumps(first))
        return
    start, start_cpu = time.perf_counter(), time.process_time()
    # cold: build the model and optimizer, compile, one step
    _, losses = jax.block_until_ready(
        TRAINERS[framework](model, sizes, X[: sizes.batch], T[: sizes.batch], net, cache)(1)
    )
    result = {
        "first_step_s": time.perf_counter() - start,
        "first_step_cpu_s": time.process_time() - start_cpu,  # all threads, both cores
        "first_loss": float(losses[0]),
    }
    if framework == FRAMEWORKS[0]:  # of which building and initializing the network
        result["initialize_s"] = _SETUP["initialize_s"]
    _, losses = jax.block_until_ready(TRAINERS[framework](model, sizes, X, T, net, cache)(1))
    result["losses"] = [float(v) for v in losses[:2]]
    result["maxrss_mib"] = peak_rss_mib()
    print(json.dumps(result))


def _timing_worker(model_name, quick, with_torch=False):
    """Every framework's steady-state time per step, in one process, interleaved.

    Each round runs every framework's short and long run back to back, so a burst of load or a
    change of the machine's speed hits all four alike (timed one process after another, the
    ratios moved by 20-40 % between runs on the shared machine).
    """
    loops = selected(FRAMEWORKS + (torch_variants(model_name) if with_torch else ()))
    trainers = {f: trainer(model_name, f, quick=quick, batches=BATCHES[quick]) for f in loops}
    for train in trainers.values():
        jax.block_until_ready(train(1))  # compiled and warm from here on
    short, long = EPOCHS[quick]
    samples = {f: {short: [], long: []} for f in loops}
    cpu = {f: {short: [], long: []} for f in loops}  # CPU seconds of the whole process
    for _ in range(_rounds(quick)):
        for f, train in trainers.items():
            for epochs, times in samples[f].items():
                start, start_cpu = time.perf_counter(), time.process_time()
                jax.block_until_ready(train(epochs))
                times.append(time.perf_counter() - start)
                cpu[f][epochs].append(time.process_time() - start_cpu)
    steps = (long - short) * BATCHES[quick]
    result = {}
    for f, runs in samples.items():
        cpu_medians = {epochs: statistics.median(t) for epochs, t in cpu[f].items()}
        # the fastest run of each length: the least disturbed one (as timeit does); the
        # medians moved by 20-50 % between runs of the benchmark on the shared 2-core machine
        fastest = {epochs: min(times) for epochs, times in runs.items()}
        medians = {epochs: statistics.median(times) for epochs, times in runs.items()}
        noise = max(
            (q[2] - q[0]) / medians[e]
            for e, q in ((e, statistics.quantiles(t, n=4)) for e, t in runs.items())
        )
        result[f] = {
            "step_s": (fastest[long] - fastest[short]) / steps,
            "step_s_median": (medians[long] - medians[short]) / steps,
            "cpu_step_s": (cpu_medians[long] - cpu_medians[short]) / steps,
            "noise": noise,
        }
    print(json.dumps(result))


def _in_subprocess(*args, module="benchmarks.bench_models", cache=None) -> dict:
    """A worker's result; its difffn compiles with the persistent cache in ``cache`` or none
    (``Network.initialize`` and ``trainnet`` would otherwise use the user's cache folder, and
    the next run of the benchmark would not be cold)."""
    command = [sys.executable, "-m", module, *args]
    env = os.environ | {CACHE_VARIABLE: cache or "off"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_results(
    model_name: str, results: dict, quick: bool, own_init: dict | None = None
) -> None:
    """The table of one model from the workers' results (``{framework: result}``; ``own_init``:
    the hand-written loop's cold first step with its own initializers)."""
    sizes = MODELS[model_name].QUICK if quick else MODELS[model_name].FULL
    base = results["jax.jit + optax"]
    rows = [
        [
            f,
            f"{1 / r['step_s']:7.2f}",
            f"{r['step_s'] * 1e3:8.1f} ms",
            f"{base['step_s'] / r['step_s']:5.2f}x",
            f"{base['step_s_median'] / r['step_s_median']:5.2f}x",
            f"{r['cpu_step_s'] * 1e3:8.1f} ms",
            f"{base['cpu_step_s'] / r['cpu_step_s']:5.2f}x",
            f"{r['maxrss_mib']:6.0f} MiB",
            f"{r['maxrss_mib'] / base['maxrss_mib']:5.2f}x",
            f"{r['first_step_s']:6.2f} s",
            " ".join(f"{v:.6f}" for v in r["losses"]),
            f"{r['noise'] * 100:4.1f}%",
        ]
        for f, r in results.items()
    ]
    short, long = EPOCHS[quick]
    print(f"\n{model_name} {sizes}, {(long - short) * BATCHES[quick]} steps measured per round")
    header = [
        "loop",
        "steps/s",
        "time/step",
        "vs jit+optax",
        "(medians)",
        "CPU/step",
        "vs jit+optax",
        "peak RSS",
        "vs jit+optax",
    ]
    print(table(rows, [*header, "first step", "loss step 0, 1", "noise"]))
    first = {f: np.asarray(r["losses"]) for f, r in results.items()}
    worst = max(
        float(np.max(np.abs(v - first["jax.jit + optax"]) / np.abs(first["jax.jit + optax"])))
        for v in first.values()
    )
    print(
        f"losses at steps 0 and 1 against jit+optax's: largest relative difference {worst:.1e} "
        f"({'equal' if worst <= 1e-4 else 'NOT EQUAL: the loops compute different things'})"
    )
    mine = results["difffn.trainnet"]["step_s"]
    others = "".join(
        f"/ {f} = {results[f]['step_s'] / mine:.2f}x, "
        for f in ("flax.nnx", "equinox")
        if f in results
    )
    print(
        f"targets: difffn / jit+optax steps/s = {base['step_s'] / mine:.2f}x (>= 1.0x), "
        f"{others + '(>= 1.5x); ' if others else ''}"
        f"peak memory {results['difffn.trainnet']['maxrss_mib'] / base['maxrss_mib']:.2f}x "
        "(<= 1.1x)"
    )
    setup = results["difffn.trainnet"].get("initialize_s")
    if setup is not None:
        first = results["difffn.trainnet"]["first_step_s"]
        print(
            f"first step (cold): difffn {first:.2f} s, of which {setup:.2f} s building and "
            f"initializing the network, {first - setup:.2f} s trainnet from the initialized "
            f"network; jit+optax {base['first_step_s']:.2f} s from difffn's parameters (target: "
            f"difffn no slower: {first / base['first_step_s']:.2f}x, from initialized parameters "
            f"{(first - setup) / base['first_step_s']:.2f}x)"
        )
        if own_init is not None:
            own = own_init["first_step_s"]
            print(
                f"first step (cold), both making their parameters: difffn {first:.2f} s, jit+optax "
                f"with its own jitted initializers {own:.2f} s (difffn {first / own:.2f}x)"
            )
    eager = results.get("torch eager")
    if eager is not None:
        best = min(r["step_s"] for f, r in results.items() if f.startswith("torch"))
        print(
            f"against PyTorch: difffn / torch eager steps/s = {eager['step_s'] / mine:.2f}x "
            f"(target >= 1.0x), / fastest PyTorch loop = {best / mine:.2f}x"
        )


def cache_pair(model_name: str, quick: bool) -> None:
    """Two difffn processes, one cache folder: the second's time to the first step."""
    flags = ["--quick"] if quick else []
    with tempfile.TemporaryDirectory() as cache:
        first, second = (
            _in_subprocess(
                "--worker", model_name, FRAMEWORKS[0], *flags, "--cache", cache, cache=cache
            )
            for _ in range(2)
        )
        files = len(os.listdir(cache))
    print(
        f"{model_name} compilation_cache: time to the first step {first['first_step_s']:.2f} s "
        f"(empty cache) -> {second['first_step_s']:.2f} s (its {files} files; "
        f"{second['first_step_s'] / first['first_step_s']:.2f}x); CPU time "
        f"{first['first_step_cpu_s']:.2f} s -> {second['first_step_cpu_s']:.2f} s"
    )


def run(*, quick: bool = False) -> None:
    flags = ["--quick"] if quick else []
    if not _torch.available():
        print(_torch.HOW_TO_ADD)
    for model_name in MODELS:
        frameworks = selected(FRAMEWORKS)
        results = {f: _in_subprocess("--worker", model_name, f, *flags) for f in frameworks}
        own_init = None  # a narrowed run (BENCH_MODELS_LOOPS) times it only when named
        if not os.environ.get(LOOPS_VARIABLE) or OWN_INIT in os.environ[LOOPS_VARIABLE]:
            own_init = _in_subprocess("--worker", model_name, OWN_INIT, *flags)
        variants = selected(torch_variants(model_name))
        with tempfile.TemporaryDirectory() as folder:
            data = _torch_data(model_name, quick, folder) if variants else ""
            for variant in variants:
                results[variant] = _in_subprocess(
                    "--worker", model_name, variant, data, module="benchmarks._torch"
                )
        timings = _in_subprocess("--timing", model_name, *flags, *(["--torch"] if variants else []))
        for f, r in results.items():
            r.update(timings[f])
        print_results(model_name, results, quick, own_init)
        cache_pair(model_name, quick)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_models")
    modes = parser.add_mutually_exclusive_group(required=True)
    modes.add_argument("--worker", nargs=2, metavar=("MODEL", "FRAMEWORK"))
    modes.add_argument("--timing", metavar="MODEL")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cache", default=None)
    parser.add_argument("--torch", action="store_true", help="time the PyTorch loops too")
    args = parser.parse_args(argv)
    if args.timing:
        _timing_worker(args.timing, args.quick, args.torch)
    else:
        _worker(*args.worker, args.quick, args.cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
