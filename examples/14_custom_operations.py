"""10: custom operations at full JAX strength: pytrees, keys, second order, batching.

This script
1. writes a dense layer as a ``df.DifferentiableFunction`` over a NamedTuple of parameters:
   ``compute_gradients`` mirrors the parameters, so a step that trains only the bias never
   computes the weight gradient; it fits a small regression with a jitted step;
2. adds noise from a typed PRNG key, an input that is never differentiated;
3. solves ``x = f(a, x)`` by iteration and differentiates it implicitly (the JAX guide's
   fixed-point solver): its backward solves the adjoint with the same class, so the second
   derivative of the solver's square root matches ``jnp.sqrt``'s;
4. gives a host kernel a batching rule (the ``vmap`` method), so ``jax.vmap`` calls it once per
   batch while ``jax.grad`` still uses the hand-written backward;
5. marks a backward that is not differentiable code ``once_differentiable``: second order is
   then a ``df.HigherOrderError`` instead of a silently wrong number.

Run: ``python examples/14_custom_operations.py [--small]``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df


class Params(NamedTuple):
    w: Any  # an array; in a gradient, None stands for a zero leaf
    b: Any


class Dense(df.DifferentiableFunction):
    """y = x w + b, with one gradient per parameter leaf, only where asked for."""

    save_inputs_for_backward = True
    computed: list = []  # which gradients the backward computed, for the printout

    def forward(self, x, params):
        return x @ params.w + params.b[None, :]

    def backward(self, dy, compute_gradients, x, params):
        needs_x, needs = compute_gradients
        Dense.computed[:] = [name for name, flag in zip(("w", "b"), needs, strict=True) if flag]
        return (
            dy @ params.w.T if needs_x else None,
            Params(x.T @ dy if needs.w else None, jnp.sum(dy, axis=0) if needs.b else None),
        )


class Noise(df.DifferentiableFunction):
    """x + scale * N(0, 1) drawn from ``key`` (a typed key: an input, never differentiated)."""

    def forward(self, x, key, scale=0.01):
        return x + scale * jax.random.normal(key, x.shape, x.dtype)

    def backward(self, dy, compute_gradients):
        return dy, None, None


def fit_bias_only(key, steps):
    k1, k2, k3 = jax.random.split(key, 3)
    x = jax.random.normal(k1, (64, 3))
    true = Params(jax.random.normal(k2, (3, 2)), jnp.array([1.0, -2.0]))
    target = x @ true.w + true.b[None, :]
    params = Params(true.w, jnp.zeros(2))  # the weights are known: learn the bias

    @jax.jit
    def step(b, i):
        def loss(b):
            y = Noise()(Dense()(x, params._replace(b=b)), jax.random.fold_in(k3, i))
            return jnp.mean((y - target) ** 2)

        value, grad = jax.value_and_grad(loss)(b)
        return b - 0.5 * grad, value

    b, first, value = params.b, None, jnp.nan
    for i in range(steps):
        b, value = step(b, i)
        first = float(value) if first is None else first
    assert first is not None
    return first, float(value), b


def tolerance(x):
    return 8 * jnp.finfo(x.dtype).eps * (1 + jnp.max(jnp.abs(x)))


@dataclasses.dataclass(frozen=True)
class AdjointStep:
    """u -> v + (df/dx)^T u at the fixed point: the adjoint equation, itself a fixed point."""

    f: Callable[..., Any]

    def __call__(self, packed, u):
        a, x_star, v = packed
        _, vjp_x = jax.vjp(lambda x: self.f(a, x), x_star)
        return v + vjp_x(u)[0]


class FixedPoint(df.DifferentiableFunction):
    """x* = f(a, x*) by iteration (a while_loop), differentiated implicitly."""

    save_inputs_for_backward = True
    save_outputs_for_backward = True

    def __init__(self, f):
        self.f = f

    def forward(self, a, x_guess):
        def not_converged(carry):
            previous, x = carry
            return jnp.max(jnp.abs(previous - x)) > tolerance(x)

        def step(carry):
            return carry[1], self.f(a, carry[1])

        return jax.lax.while_loop(not_converged, step, (x_guess, self.f(a, x_guess)))[1]

    def backward(self, dx_star, compute_gradients, a, x_guess, x_star):
        _, vjp_a = jax.vjp(lambda a: self.f(a, x_star), a)
        w = FixedPoint(AdjointStep(self.f))((a, x_star, dx_star), dx_star)
        return (vjp_a(w)[0] if compute_gradients[0] else None), None


def newton_sqrt_step(a, x):
    return 0.5 * (x + a / x)


HOST_CALLS = [0]


def host_norms(x):
    """Row norms on the host (stands for an external kernel that wants the whole batch)."""

    def host(x):
        HOST_CALLS[0] += 1
        return np.linalg.norm(np.asarray(x), axis=-1).astype(x.dtype)

    return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape[:-1], x.dtype), x)


class Norm(df.DifferentiableFunction):
    """|x| of one vector; under jax.vmap, one host call for the whole batch."""

    save_inputs_for_backward = True
    save_outputs_for_backward = True

    def forward(self, x):
        return host_norms(x)

    def backward(self, dy, compute_gradients, x, norm):
        return dy * x / norm

    def vmap(self, axis_size, in_batched, x):
        (batched,) = in_batched
        x = x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))
        return host_norms(x), True


class HostCube(df.DifferentiableFunction):
    """x**3 whose backward runs on the host: first-order only."""

    save_inputs_for_backward = True
    once_differentiable = True

    def forward(self, x):
        return x**3

    def backward(self, dy, compute_gradients, x):
        def host(dy, x):
            return (3 * np.asarray(x) ** 2 * np.asarray(dy)).astype(dy.dtype)

        return jax.pure_callback(host, jax.ShapeDtypeStruct(dy.shape, dy.dtype), dy, x)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings (the test suite)")
    args = parser.parse_args(argv)
    key = jax.random.key(0)

    first, last, b = fit_bias_only(key, steps=20 if args.small else 100)
    print(f"1-2. Dense + Noise, training the bias only: loss {first:.4f} -> {last:.4f}")
    print(f"     backward computed the gradients of {Dense.computed} (not w); b = {b}")
    assert Dense.computed == ["b"] and last < first

    with jax.enable_x64(True):
        a = jnp.array(2.0)

        def sqrt(a):
            return FixedPoint(newton_sqrt_step)(a, jnp.ones_like(a))

        derivatives = [sqrt, jax.grad(sqrt), jax.grad(jax.grad(sqrt))]
        references = [jnp.sqrt, jax.grad(jnp.sqrt), jax.grad(jax.grad(jnp.sqrt))]
        print("3. fixed-point sqrt(2) and its derivatives vs jnp.sqrt:")
        for order, (ours, theirs) in enumerate(zip(derivatives, references, strict=True)):
            print(
                f"     order {order}: {float(ours(a)):+.12f}  (jnp.sqrt: {float(theirs(a)):+.12f})"
            )
            assert abs(float(ours(a)) - float(theirs(a))) < 1e-9

    xs = jax.random.normal(key, (16 if args.small else 256, 3))
    HOST_CALLS[0] = 0
    norms = jax.vmap(Norm())(xs)
    forward_calls, HOST_CALLS[0] = HOST_CALLS[0], 0
    grads = jax.grad(lambda xs: jnp.sum(jax.vmap(Norm())(xs)))(xs)
    print(
        f"4. {len(xs)} norms with {forward_calls} host call; their gradient with "
        f"{HOST_CALLS[0]} (the backward is JAX code); unit-norm gradient rows:",
        bool(jnp.allclose(jnp.linalg.norm(grads, axis=1), 1.0, atol=1e-5)),
    )
    assert forward_calls == 1 and bool(jnp.allclose(norms, jnp.linalg.norm(xs, axis=1), rtol=1e-5))

    print(f"5. once_differentiable: d/dx x^3 at 2 = {float(jax.grad(HostCube())(2.0))}")
    try:
        jax.grad(jax.grad(HostCube()))(2.0)
    except df.HigherOrderError as error:
        print(f"     second order: HigherOrderError: {str(error).split(',')[0]}")
    else:
        raise AssertionError("second order of a once_differentiable function did not raise")


if __name__ == "__main__":
    main()
