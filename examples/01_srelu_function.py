"""01: a custom operation with its own backward: SReLU as a DifferentiableFunction.

SReLU (S-shaped rectified linear unit) has, per channel, a left threshold ``tl`` and slope ``al``
and a right threshold ``tr`` and slope ``ar``:

    f(x) = tl + al (x - tl)   if x <= tl
           x                  if tl < x < tr
           tr + ar (x - tr)   if x >= tr

This script
1. writes SReLU as a ``df.DifferentiableFunction`` whose backward follows the derivatives of
   that formula (one gradient per input, in input order: x, tl, al, tr, ar);
2. wraps it in an interface function that re-applies the input's format (formats are stripped
   before ``forward``, as in MATLAB);
3. checks its gradients against JAX autodiff of the plain formula, in float64;
4. fits the four parameters with a jitted gradient step; since only the parameters are
   differentiated, ``compute_gradients`` is ``(False, True, True, True, True)`` and the large
   input gradient is never computed.

Run: ``python examples/01_srelu_function.py [--small]``.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from srelu_sums import srelu_parameter_gradients  # this folder's one-pass sums

import difffn as df


class SReLUFunction(df.DifferentiableFunction):
    """SReLU on data of format ``fmt``; parameters have size 1 on every axis but ``C``."""

    save_inputs_for_backward = True

    def __init__(self, fmt: str):
        self.fmt = fmt

    def forward(self, x, tl, al, tr, ar):
        return jnp.where(x <= tl, tl + al * (x - tl), jnp.where(x >= tr, tr + ar * (x - tr), x))

    def backward(self, dy, compute_gradients, x, tl, al, tr, ar):
        grad_x, grad_tl, grad_al, grad_tr, grad_ar = compute_gradients
        left, right = x <= tl, x >= tr
        dx = dy * jnp.where(left, al, jnp.where(right, ar, 1.0)) if grad_x else None
        if not (grad_tl or grad_al or grad_tr or grad_ar):
            return dx, None, None, None, None

        # The parameters are broadcast over every axis but C, so their gradients are sums over
        # those axes, taken in one pass (srelu_sums.py says how).
        axes = tuple(i for i, label in enumerate(self.fmt) if label != "C")
        grads = srelu_parameter_gradients(axes, x, dy, left, right, tl, al, tr, ar)
        wanted = (grad_tl, grad_al, grad_tr, grad_ar)
        return dx, *(g if w else None for g, w in zip(grads, wanted))


def srelu(x, tl, al, tr, ar):
    """Interface function: run the operation and give the output the input's format back."""
    fmt = df.dims(x)
    y = SReLUFunction(fmt)(x, tl, al, tr, ar)
    return df.dlarray(y, fmt) if fmt else y


def srelu_plain(x, tl, al, tr, ar):
    """The same formula, left to JAX autodiff: the reference for the gradient check."""
    return jnp.where(x <= tl, tl + al * (x - tl), jnp.where(x >= tr, tr + ar * (x - tr), x))


def init_params(channels: int, dtype=jnp.float32):
    ones = jnp.ones((1, 1, 1, channels), dtype)
    return {"tl": -0.5 * ones, "al": 0.1 * ones, "tr": 0.5 * ones, "ar": 0.1 * ones}


def check_gradients(key) -> float:
    """Largest relative difference between the custom backward and autodiff, in float64."""
    with jax.enable_x64(True):
        kx, kg = jax.random.split(key)
        x = jax.random.normal(kx, (4, 6, 6, 3), jnp.float64) * 2
        params = init_params(3, jnp.float64)
        args = (x, params["tl"], params["al"], params["tr"], params["ar"])
        upstream = jax.random.normal(kg, x.shape, jnp.float64)

        def loss(fn):
            return lambda *a: jnp.sum(fn(*a) * upstream)

        custom = jax.grad(
            loss(lambda *a: df.stripdims(srelu(df.dlarray(a[0], "BSSC"), *a[1:]))), argnums=range(5)
        )(*args)
        reference = jax.grad(loss(srelu_plain), argnums=range(5))(*args)
        errors = [
            float(jnp.max(jnp.abs(c - r)) / (jnp.max(jnp.abs(r)) + 1e-30))
            for c, r in zip(custom, reference, strict=True)
        ]
    for name, error in zip(("x", "tl", "al", "tr", "ar"), errors, strict=True):
        print(f"  d/d{name:<2} max relative difference vs autodiff: {error:.2e}")
    return max(errors)


def fit(key, *, steps: int, batch: int) -> tuple[float, float]:
    """Fit SReLU's parameters to a target curve with a jitted gradient step (parameters only)."""
    channels = 3
    target_params = {
        "tl": jnp.full((1, 1, 1, channels), -1.0),
        "al": jnp.full((1, 1, 1, channels), 0.3),
        "tr": jnp.full((1, 1, 1, channels), 1.0),
        "ar": jnp.full((1, 1, 1, channels), 0.5),
    }

    def loss_fn(params, x):
        y = srelu(df.dlarray(x, "BSSC"), params["tl"], params["al"], params["tr"], params["ar"])
        t = srelu_plain(x, **target_params)
        return jnp.mean((df.stripdims(y) - t) ** 2)

    @jax.jit
    def step(params, x):
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        return jax.tree.map(lambda p, g: p - 0.5 * g, params, grads), loss

    params = init_params(channels)
    first: float | None = None
    last = float("nan")
    for i in range(steps):
        x = 2.0 * jax.random.normal(jax.random.fold_in(key, i), (batch, 8, 8, channels))
        params, loss = step(params, x)
        first = float(loss) if first is None else first
        last = float(loss)
    assert first is not None
    return first, last


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings (the test suite)")
    args = parser.parse_args(argv)
    key = jax.random.key(0)

    print("SReLU DifferentiableFunction: gradients against JAX autodiff (float64)")
    worst = check_gradients(key)
    assert worst < 1e-10, f"custom backward disagrees with autodiff: {worst:.3e}"

    steps, batch = (30, 8) if args.small else (300, 64)
    first, last = fit(key, steps=steps, batch=batch)
    print(
        f"Fitting the parameters with a jitted step: loss {first:.4f} -> {last:.4f} ({steps} steps)"
    )
    assert np.isfinite(last) and last < first, "the loss did not decrease"


if __name__ == "__main__":
    main()
