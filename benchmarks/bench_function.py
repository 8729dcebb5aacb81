"""DifferentiableFunction: SReLU against a hand-written jax.custom_vjp, plain autodiff and a copy.

Targets (issue 2): overhead against the hand-written custom_vjp <= 1.05x; parameter-only
gradients >= 2x faster than plain autodiff; forward within 1.3x of the copy bandwidth.
Issue 11 adds two rows against the same hand-written rule, also <= 1.05x: the parameters as one
pytree input (a dict), and the gradients under ``jax.checkpoint`` against a custom_vjp with
``optimize_remat=True``; and, for remat, how many times an opaque forward (a counted
``jax.pure_callback`` kernel) executes per gradient under each checkpoint policy (difffn's count
<= the hand-written custom_vjp's).

GB/s is the *necessary* traffic divided by the time: forward reads x and writes y; the gradient
of all inputs reads x and dL/dY and writes dL/dX; the parameter gradient reads x and dL/dY.
"""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df

from ._examples import load
from ._timing import compare, fmt_time, table

SHAPES = [(64, 28, 28, 32), (256, 56, 56, 64)]
QUICK_SHAPES = [(8, 14, 14, 16)]


def srelu_backward(x, tl, al, tr, ar, dy):
    """The example's backward math for every input, as a hand-written rule would have it."""
    left, right = x <= tl, x >= tr
    dx = dy * jnp.where(left, al, jnp.where(right, ar, 1.0))
    sums = load("srelu_sums").srelu_parameter_gradients
    return (dx, *sums((0, 1, 2), x, dy, left, right, tl, al, tr, ar))


def srelu_forward(x, tl, al, tr, ar):
    return jnp.where(x <= tl, tl + al * (x - tl), jnp.where(x >= tr, tr + ar * (x - tr), x))


def hand_written_srelu(*, optimize_remat: bool = False):
    """The same math and backward as the example, as a plain jax.custom_vjp (no mask)."""

    @jax.custom_vjp
    def srelu(x, tl, al, tr, ar):
        return srelu_forward(x, tl, al, tr, ar)

    def fwd(x, tl, al, tr, ar):
        return srelu(x, tl, al, tr, ar), (x, tl, al, tr, ar)

    def bwd(res, dy):
        return srelu_backward(*res, dy)

    srelu.defvjp(fwd, bwd, optimize_remat=optimize_remat)
    return srelu


NAMES = ("tl", "al", "tr", "ar")


def hand_written_srelu_tree():
    """The hand-written custom_vjp with the four parameters as one dict input."""

    @jax.custom_vjp
    def srelu(x, params):
        return srelu_forward(x, *(params[n] for n in NAMES))

    def fwd(x, params):
        return srelu(x, params), (x, params)

    def bwd(res, dy):
        x, params = res
        dx, *dp = srelu_backward(x, *(params[n] for n in NAMES), dy)
        return dx, dict(zip(NAMES, dp, strict=True))

    srelu.defvjp(fwd, bwd)
    return srelu


def tree_function(example):
    """The example's SReLUFunction with the parameters as one dict input (per-leaf flags)."""

    class SReLUTree(example.SReLUFunction):
        def forward(self, x, params):
            return super().forward(x, *(params[n] for n in NAMES))

        def backward(self, dy, compute_gradients, x, params):
            needs_x, needs = compute_gradients
            flags = (needs_x, *(needs[n] for n in NAMES))
            dx, *dp = super().backward(dy, flags, x, *(params[n] for n in NAMES))
            return dx, dict(zip(NAMES, dp, strict=True))

    return SReLUTree("BSSC")


def _cases(implementations, x, params, dy, *, tree=False, checkpoint=False):
    """forward / grad all / grad params thunks per implementation (jitted, arrays bound).

    Each thunk carries ``.compiled``, a zero-argument function giving its compiled program.
    """

    def call(f, x, p):
        return f(x, p) if tree else f(x, *p)

    def vjp_all(f):
        def g(x, p, dy):
            if checkpoint:
                return jax.grad(jax.checkpoint(lambda x, p: jnp.sum(call(f, x, p) * dy)), (0, 1))(
                    x, p
                )
            return jax.vjp(lambda x, p: call(f, x, p), x, p)[1](dy)

        return jax.jit(g)

    def vjp_params(f):
        def g(x, p, dy):
            if checkpoint:
                return jax.grad(jax.checkpoint(lambda p: jnp.sum(call(f, x, p) * dy)))(p)
            return jax.vjp(lambda p: call(f, x, p), p)[1](dy)

        return jax.jit(g)

    def thunk(fn, *args):
        run = lambda: fn(*args)  # noqa: E731
        run.compiled = lambda: fn.lower(*args).compile()
        return run

    cases = {}
    for n, f in implementations.items():
        if not checkpoint:
            cases[f"forward/{n}"] = thunk(jax.jit(lambda x, p, f=f: call(f, x, p)), x, params)
        cases[f"grad all/{n}"] = thunk(vjp_all(f), x, params, dy)
        cases[f"grad params/{n}"] = thunk(vjp_params(f), x, params, dy)
    return cases


def _program(compiled) -> tuple:
    """What a compiled program does: its op histogram, flops and bytes accessed."""
    ops = collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", compiled.as_text()))
    cost = compiled.cost_analysis()
    return ops, cost.get("flops"), cost.get("bytes accessed")


def _ratios(title, cases, timings, kinds, ours, theirs):
    """difffn against a baseline, with whether XLA compiled the same program for both (the same
    ops, flops and bytes accessed: then any time difference is the machine's noise)."""
    rows = []
    for kind in kinds:
        t, base = timings[f"{kind}/{ours}"], timings[f"{kind}/{theirs}"]
        same = _program(cases[f"{kind}/{ours}"].compiled()) == _program(
            cases[f"{kind}/{theirs}"].compiled()
        )
        rows.append(
            [
                kind,
                fmt_time(t.median_s),
                fmt_time(base.median_s),
                f"{t.ratio_to(base):5.2f}x",
                f"{t.noise * 100:4.1f}%",
                "yes" if same else "NO",
            ]
        )
    print(f"\n{title}")
    header = ["case", "difffn", theirs, "ratio (target <= 1.05x)", "noise", "same program"]
    print(table(rows, header))


_KERNEL_RUNS = [0]


def _kernel(x):
    """sin(x) on the host: opaque to XLA, so every execution is counted."""

    def host(x):
        _KERNEL_RUNS[0] += 1
        return np.sin(x)

    return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


class _CountedKernel(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, x, w):
        return _kernel(x) * w

    def backward(self, dy, compute_gradients, x, w):
        return dy * jnp.cos(x) * w, jnp.sum(dy * jnp.sin(x))


def _counted_kernel_custom_vjp():
    @jax.custom_vjp
    def f(x, w):
        return _kernel(x) * w

    def fwd(x, w):
        return f(x, w), (x, w)

    def bwd(residuals, dy):
        x, w = residuals
        return dy * jnp.cos(x) * w, jnp.sum(dy * jnp.sin(x))

    f.defvjp(fwd, bwd, optimize_remat=True)
    return f


def _forward_runs(f, wrap, *, jit: bool) -> int:
    """Executions of the kernel in one gradient of ``wrap(loss)``, jitted or eager."""
    grad = jax.grad(wrap(lambda x, w: jnp.sum(jnp.tanh(f(x, w)))), (0, 1))
    grad = jax.jit(grad) if jit else grad
    x, w = jnp.linspace(0.0, 1.0, 8), jnp.array(2.0)
    jax.block_until_ready(grad(x, w))  # compile (and a first run)
    _KERNEL_RUNS[0] = 0
    jax.block_until_ready(grad(x, w))
    return _KERNEL_RUNS[0]


def remat_counts() -> None:
    """How often the forward executes per gradient, difffn against custom_vjp(optimize_remat)."""
    policies = {
        "no checkpoint": lambda f: f,
        "jax.checkpoint": jax.checkpoint,
        "jax.remat": jax.remat,
        "nothing_saveable": lambda f: jax.checkpoint(
            f, policy=jax.checkpoint_policies.nothing_saveable
        ),
        "dots_saveable": lambda f: jax.checkpoint(f, policy=jax.checkpoint_policies.dots_saveable),
        "everything_saveable": lambda f: jax.checkpoint(
            f, policy=jax.checkpoint_policies.everything_saveable
        ),
    }
    ours, theirs = _CountedKernel(), _counted_kernel_custom_vjp()
    rows = []
    for name, wrap in policies.items():
        counts = [_forward_runs(f, wrap, jit=jit) for jit in (True, False) for f in (ours, theirs)]
        ok = counts[0] <= counts[1] and counts[2] <= counts[3]
        rows.append([name, *map(str, counts), "yes" if ok else "NO"])
    print("\nremat: forward executions per gradient (an opaque, counted pure_callback kernel)")
    header = [
        "policy",
        "jit: difffn",
        "custom_vjp(optimize_remat)",
        "eager: difffn",
        "custom_vjp(optimize_remat)",
        "difffn <= custom_vjp",
    ]
    print(table(rows, header))


def run(*, quick: bool = False) -> None:
    remat_counts()
    example = load("01_srelu_function")
    implementations = {
        "difffn": example.SReLUFunction("BSSC"),
        "custom_vjp": hand_written_srelu(),
        "autodiff": example.srelu_plain,
    }
    rounds = 5 if quick else 15
    for shape in QUICK_SHAPES if quick else SHAPES:
        key = jax.random.key(0)
        x = jax.random.normal(key, shape, jnp.float32)
        dy = jax.random.normal(jax.random.fold_in(key, 1), shape, jnp.float32)
        params = tuple(example.init_params(shape[-1]).values())
        nbytes = x.size * x.dtype.itemsize

        copy = jax.jit(lambda x: x + 0)  # a real read and write; `lambda x: x` would alias
        traffic = {"forward": 2 * nbytes, "grad all": 3 * nbytes, "grad params": 2 * nbytes}
        cases = {"copy": lambda c=copy, x=x: c(x)}
        cases.update(_cases(implementations, x, params, dy))
        timings = compare(cases, rounds=rounds)

        rows = []
        for name in cases:
            t = timings[name]
            kind = name.split("/")[0]
            baseline = "copy" if kind == "copy" else f"{kind}/custom_vjp"
            moved = 2 * nbytes if kind == "copy" else traffic[kind]
            rows.append(
                [
                    name,
                    fmt_time(t.median_s),
                    f"{moved / t.median_s / 1e9:6.1f}",
                    f"{t.ratio_to(timings[baseline]):5.2f}x",
                    f"{t.noise * 100:4.1f}%",
                ]
            )
        print(f"\nshape {shape} float32 ({nbytes / 1e6:.1f} MB per array)")
        print(table(rows, ["case", "time/call", "GB/s", "vs custom_vjp", "noise"]))
        t = timings
        print("targets:")
        for kind in ("forward", "grad all", "grad params"):
            r = t[f"{kind}/difffn"].ratio_to(t[f"{kind}/custom_vjp"])
            print(f"  {kind:<12} difffn / hand-written custom_vjp = {r:5.2f}x  (target <= 1.05x)")
        r = t["grad params/autodiff"].ratio_to(t["grad params/difffn"])
        print(f"  grad params  autodiff / difffn                  = {r:5.2f}x  (target >= 2x)")
        r = t["forward/difffn"].ratio_to(t["copy"])
        print(f"  forward      difffn / copy                      = {r:5.2f}x  (target <= 1.3x)")
        kinds = ("forward", "grad all", "grad params")
        _ratios("array inputs", cases, timings, kinds, "difffn", "custom_vjp")

        tree = _cases(
            {"difffn": tree_function(example), "custom_vjp": hand_written_srelu_tree()},
            x,
            dict(zip(NAMES, params, strict=True)),
            dy,
            tree=True,
        )
        remat_baseline = "custom_vjp(optimize_remat)"
        remat = _cases(
            {
                "difffn": example.SReLUFunction("BSSC"),
                remat_baseline: hand_written_srelu(optimize_remat=True),
            },
            x,
            params,
            dy,
            checkpoint=True,
        )
        timings = compare(
            {
                **{f"tree {k}": v for k, v in tree.items()},
                **{f"remat {k}": v for k, v in remat.items()},
            },
            rounds=rounds,
        )
        tree_t = {k[len("tree ") :]: v for k, v in timings.items() if k.startswith("tree ")}
        remat_t = {k[len("remat ") :]: v for k, v in timings.items() if k.startswith("remat ")}
        _ratios(
            "pytree input: the four parameters as one dict",
            tree,
            tree_t,
            kinds,
            "difffn",
            "custom_vjp",
        )
        _ratios(
            "remat: gradients of jax.checkpoint(loss)",
            remat,
            remat_t,
            kinds[1:],
            "difffn",
            remat_baseline,
        )
