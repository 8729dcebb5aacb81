"""DifferentiableFunction: SReLU against a hand-written jax.custom_vjp, plain autodiff and a copy.

Targets (issue 2): overhead against the hand-written custom_vjp <= 1.05x; parameter-only
gradients >= 2x faster than plain autodiff; forward within 1.3x of the copy bandwidth.

GB/s is the *necessary* traffic divided by the time: forward reads x and writes y; the gradient
of all inputs reads x and dL/dY and writes dL/dX; the parameter gradient reads x and dL/dY.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._examples import load
from ._timing import compare, fmt_time, table

SHAPES = [(64, 28, 28, 32), (256, 56, 56, 64)]
QUICK_SHAPES = [(8, 14, 14, 16)]


def hand_written_srelu():
    """The same math and backward as the example, as a plain jax.custom_vjp (no mask)."""

    @jax.custom_vjp
    def srelu(x, tl, al, tr, ar):
        return jnp.where(x <= tl, tl + al * (x - tl), jnp.where(x >= tr, tr + ar * (x - tr), x))

    def fwd(x, tl, al, tr, ar):
        return srelu(x, tl, al, tr, ar), (x, tl, al, tr, ar)

    def bwd(res, dy):
        x, tl, al, tr, ar = res
        left, right = x <= tl, x >= tr
        dx = dy * jnp.where(left, al, jnp.where(right, ar, 1.0))
        dy_left, dy_right = jnp.where(left, dy, 0.0), jnp.where(right, dy, 0.0)
        products = jax.lax.optimization_barrier((dy_left, dy_right, dy_left * x, dy_right * x))
        s_left, s_right, s_left_x, s_right_x = (
            jnp.sum(v.reshape(-1, x.shape[-1]), axis=0).reshape(tl.shape) for v in products
        )
        return (
            dx,
            s_left * (1 - al),
            s_left_x - tl * s_left,
            s_right * (1 - ar),
            s_right_x - tr * s_right,
        )

    srelu.defvjp(fwd, bwd)
    return srelu


def run(*, quick: bool = False) -> None:
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
        forward = {n: jax.jit(f) for n, f in implementations.items()}
        grad_all = {
            n: jax.jit(lambda x, p, dy, f=f: jax.vjp(f, x, *p)[1](dy))
            for n, f in implementations.items()
        }
        grad_params = {
            n: jax.jit(lambda x, p, dy, f=f: jax.vjp(lambda *p: f(x, *p), *p)[1](dy))
            for n, f in implementations.items()
        }
        # default arguments bind this iteration's arrays (the thunks run within the iteration)
        cases = {"copy": (lambda c=copy, x=x: c(x), 2 * nbytes)}
        bound = dict(x=x, p=params, dy=dy)
        for n in implementations:
            cases[f"forward/{n}"] = (lambda f=forward[n], b=bound: f(b["x"], *b["p"]), 2 * nbytes)
            cases[f"grad all/{n}"] = (
                lambda f=grad_all[n], b=bound: f(b["x"], b["p"], b["dy"]),
                3 * nbytes,
            )
            cases[f"grad params/{n}"] = (
                lambda f=grad_params[n], b=bound: f(b["x"], b["p"], b["dy"]),
                2 * nbytes,
            )
        timings = compare({name: fn for name, (fn, _) in cases.items()}, rounds=rounds)

        rows = []
        for name, (_, traffic) in cases.items():
            t = timings[name]
            kind = name.split("/")[0]
            baseline = "copy" if kind == "copy" else f"{kind}/custom_vjp"
            rows.append(
                [
                    name,
                    fmt_time(t.median_s),
                    f"{traffic / t.median_s / 1e9:6.1f}",
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
