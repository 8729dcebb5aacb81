"""Issue 23: a DifferentiableFunction is never weaker than jax.custom_vjp with the same rule.

The parity table: six operations (elementwise, reduction, pytree input, two outputs, integer
input, memory values), each written once as a ``df.DifferentiableFunction`` and once as a
``jax.custom_vjp`` whose fwd runs the same forward and keeps the same residuals and whose bwd is
the same backward; then the same with a user ``jvp``, against a ``jax.custom_jvp`` with the
same jvp rule. Each is run through compositions (up to depth three) of ``grad``, ``jacrev``,
``jacfwd``, ``hessian``, ``jvp``, ``linearize``, ``vmap``, ``jit``, ``checkpoint`` and
``scan``, outside and inside ``jax.jit``. Where JAX's reference succeeds, difffn gives the
same numbers (float64); where it fails, difffn raises a named ``df.Error``.

``docs/functions.md`` prints the table this file computes (``test_docs_print_the_table``).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df

pytestmark = pytest.mark.slow

X = np.array([0.3, -0.7, 1.1])
V = np.array([0.5, 1.0, -2.0])
XS = np.array([[0.3, -0.7, 1.1], [0.9, 0.2, -0.4]])
N = np.array([1, 2, 3], dtype=np.int32)


# -- the operations, each as difffn and as JAX's custom_vjp / custom_jvp ------------------------


class Elementwise(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, x):
        return jnp.sin(x)

    def backward(self, dy, cg, x):
        return dy * jnp.cos(x)


class ElementwiseJvp(Elementwise):
    def jvp(self, primals, tangents):
        (x,), (t,) = primals, tangents
        return jnp.sin(x), jnp.cos(x) * t


class Reduction(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, x):
        return jnp.sum(x**3)

    def backward(self, dy, cg, x):
        return dy * 3 * x**2


class ReductionJvp(Reduction):
    def jvp(self, primals, tangents):
        (x,), (t,) = primals, tangents
        return jnp.sum(x**3), jnp.sum(3 * x**2 * t)


class Tree(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, p):
        return p["a"] * jnp.sin(p["b"])

    def backward(self, dy, cg, p):
        return {"a": dy * jnp.sin(p["b"]), "b": dy * p["a"] * jnp.cos(p["b"])}


class TreeJvp(Tree):
    def jvp(self, primals, tangents):
        (p,), (t,) = primals, tangents
        y = p["a"] * jnp.sin(p["b"])
        return y, t["a"] * jnp.sin(p["b"]) + p["a"] * jnp.cos(p["b"]) * t["b"]


class TwoOutputs(df.DifferentiableFunction):
    num_outputs = 2
    save_inputs_for_backward = True

    def forward(self, x):
        return jnp.sin(x), x**2

    def backward(self, dy1, dy2, cg, x):
        return dy1 * jnp.cos(x) + dy2 * 2 * x


class TwoOutputsJvp(TwoOutputs):
    def jvp(self, primals, tangents):
        (x,), (t,) = primals, tangents
        return (jnp.sin(x), x**2), (jnp.cos(x) * t, 2 * x * t)


class IntegerInput(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, x, n):
        return x**2 * n

    def backward(self, dy, cg, x, n):
        return dy * 2 * x * n, None


class IntegerInputJvp(IntegerInput):
    def jvp(self, primals, tangents):
        (x, n), (t, _) = primals, tangents
        return x**2 * n, 2 * x * n * t


class Memory(df.DifferentiableFunction):
    num_memory_values = 1

    def forward(self, x):
        y = jnp.exp(x)
        return y, y

    def backward(self, dy, cg, memory):
        return dy * memory


class MemoryJvp(Memory):
    def jvp(self, primals, tangents):
        (x,), (t,) = primals, tangents
        return jnp.exp(x), jnp.exp(x) * t


def _reference(forward, residuals, backward, jvp):
    """The same rule as ``jax.custom_vjp`` (fwd runs forward itself) and ``jax.custom_jvp``."""
    vjp = jax.custom_vjp(forward)
    vjp.defvjp(lambda *a: (forward(*a), residuals(*a)), backward)
    jvp_ = jax.custom_jvp(forward)
    jvp_.defjvp(jvp)
    return vjp, jvp_


OPS = {
    "elementwise": (
        Elementwise,
        ElementwiseJvp,
        lambda x: (x,),
        _reference(
            jnp.sin,
            lambda x: x,
            lambda x, g: (g * jnp.cos(x),),
            lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]),
        ),
    ),
    "reduction": (
        Reduction,
        ReductionJvp,
        lambda x: (x,),
        _reference(
            lambda x: jnp.sum(x**3),
            lambda x: x,
            lambda x, g: (g * 3 * x**2,),
            lambda p, t: (jnp.sum(p[0] ** 3), jnp.sum(3 * p[0] ** 2 * t[0])),
        ),
    ),
    "pytree input": (
        Tree,
        TreeJvp,
        lambda x: ({"a": x, "b": 2 * x},),
        _reference(
            lambda p: p["a"] * jnp.sin(p["b"]),
            lambda p: p,
            lambda p, g: ({"a": g * jnp.sin(p["b"]), "b": g * p["a"] * jnp.cos(p["b"])},),
            lambda p, t: (
                p[0]["a"] * jnp.sin(p[0]["b"]),
                t[0]["a"] * jnp.sin(p[0]["b"]) + p[0]["a"] * jnp.cos(p[0]["b"]) * t[0]["b"],
            ),
        ),
    ),
    "two outputs": (
        TwoOutputs,
        TwoOutputsJvp,
        lambda x: (x,),
        _reference(
            lambda x: (jnp.sin(x), x**2),
            lambda x: x,
            lambda x, g: (g[0] * jnp.cos(x) + g[1] * 2 * x,),
            lambda p, t: ((jnp.sin(p[0]), p[0] ** 2), (jnp.cos(p[0]) * t[0], 2 * p[0] * t[0])),
        ),
    ),
    "integer input": (
        IntegerInput,
        IntegerInputJvp,
        lambda x: (x, jnp.asarray(N)),
        _reference(
            lambda x, n: x**2 * n,
            lambda x, n: (x, n),
            lambda r, g: (g * 2 * r[0] * r[1], None),
            lambda p, t: (p[0] ** 2 * p[1], 2 * p[0] * p[1] * t[0]),
        ),
    ),
    "memory values": (
        Memory,
        MemoryJvp,
        lambda x: (x,),
        _reference(
            jnp.exp,
            lambda x: jnp.exp(x),
            lambda m, g: (g * m,),
            lambda p, t: (jnp.exp(p[0]), jnp.exp(p[0]) * t[0]),
        ),
    ),
}


def _vector(op, args_of):
    """The operation as ``R^3 -> R^m``: its outputs flattened and joined."""

    def f(x):
        leaves = jax.tree.leaves(op(*args_of(x)))
        return jnp.concatenate([jnp.ravel(leaf) for leaf in leaves])

    return f


def _loss(f):
    return lambda x: jnp.sum(jnp.sin(f(x)))


def _scan(g):
    return lambda xs: jax.lax.scan(lambda c, x: (c, g(x)), 0.0, xs)[1]


# Each composition takes the vector function f and returns what it computes at X (or XS).
COMPOSITIONS = {
    "grad": lambda f: jax.grad(_loss(f))(X),
    "jacrev": lambda f: jax.jacrev(f)(X),
    "jacfwd": lambda f: jax.jacfwd(f)(X),
    "jvp": lambda f: jax.jvp(f, (X,), (V,)),
    "linearize": lambda f: jax.linearize(f, X)[1](V),
    "vmap": lambda f: jax.vmap(f)(XS),
    "scan": lambda f: _scan(f)(XS),
    "grad∘checkpoint": lambda f: jax.grad(jax.checkpoint(_loss(f)))(X),
    "hessian": lambda f: jax.hessian(_loss(f))(X),
    "hessian (linear loss)": lambda f: jax.hessian(lambda x: jnp.sum(f(x)))(X),
    "jacrev∘jacrev": lambda f: jax.jacrev(jax.jacrev(_loss(f)))(X),
    "jvp∘grad": lambda f: jax.jvp(jax.grad(_loss(f)), (X,), (V,)),
    "linearize∘grad": lambda f: jax.linearize(jax.grad(_loss(f)), X)[1](V),
    "jacrev∘jacfwd": lambda f: jax.jacrev(jax.jacfwd(_loss(f)))(X),
    "vmap∘grad": lambda f: jax.vmap(jax.grad(_loss(f)))(XS),
    "grad∘scan": lambda f: jax.grad(lambda x: jnp.sum(_scan(_loss(f))(XS * x[None, :])))(X),
    "vmap∘hessian": lambda f: jax.vmap(jax.hessian(_loss(f)))(XS),
    "hessian∘checkpoint": lambda f: jax.hessian(jax.checkpoint(_loss(f)))(X),
    "hessian∘jit": lambda f: jax.hessian(jax.jit(_loss(f)))(X),
    "grad∘grad∘grad": lambda f: jax.grad(
        lambda x: jax.grad(lambda x: jax.grad(_loss(f))(x) @ V)(x) @ V
    )(X),
    "vmap∘jvp∘grad": lambda f: jax.vmap(lambda x: jax.jvp(jax.grad(_loss(f)), (x,), (V,)))(XS),
}


def _run(composition, f, jit: bool):
    """``("ok", values)`` or ``("error", exception)``."""
    run = COMPOSITIONS[composition]
    try:
        values = jax.jit(lambda: run(f))() if jit else run(f)
        return "ok", jax.tree.map(np.asarray, values)
    except Exception as error:  # noqa: BLE001 - the outcome is what is compared
        return "error", error


@functools.cache
def _table():
    """{(composition, op, with_jvp, jit): (jax outcome, difffn outcome)}; float64 inside."""
    global X, V, XS  # as float64 jax arrays (numpy constants trip JAX's custom_vjp under jit)
    X, V, XS = (jnp.asarray(a) for a in (X, V, XS))
    cells = {}
    for op_name, (cls, jvp_cls, args_of, (ref_vjp, ref_jvp)) in OPS.items():
        for with_jvp in (False, True):
            ours = _vector(jvp_cls() if with_jvp else cls(), args_of)
            theirs = _vector(ref_jvp if with_jvp else ref_vjp, args_of)
            for composition in COMPOSITIONS:
                for jit in (False, True):
                    cells[composition, op_name, with_jvp, jit] = (
                        _run(composition, theirs, jit),
                        _run(composition, ours, jit),
                    )
    return cells


def _cell_text(cells, composition, op_name, with_jvp) -> str:
    outcomes = [cells[composition, op_name, with_jvp, jit] for jit in (False, True)]
    if all(o[0][0] == "ok" for o in outcomes):
        if any(o[1][0] == "error" for o in outcomes):
            return " / ".join(sorted({type(o[1][1]).__name__ for o in outcomes})) + " (†)"
        return "same"
    names = {type(o[1][1]).__name__ for o in outcomes if o[1][0] == "error"}
    return " / ".join(sorted(names)) or "?"


def markdown_table(cells) -> str:
    """The table as docs/functions.md prints it."""
    ops = list(OPS)
    header = "| composition | " + " | ".join(ops) + " | with `jvp` (all six) |"
    lines = [header, "|" + "---|" * (len(ops) + 2)]
    for composition in COMPOSITIONS:
        row = [_cell_text(cells, composition, op, False) for op in ops]
        with_jvp = {_cell_text(cells, composition, op, True) for op in ops}
        lines.append(
            f"| `{composition}` | " + " | ".join(row) + f" | {' / '.join(sorted(with_jvp))} |"
        )
    return "\n".join(lines)


@pytest.fixture
def table(x64):
    return _table()


def _assert_same(expected, got, where):
    flat_expected, tree_expected = jax.tree.flatten(expected)
    flat_got, tree_got = jax.tree.flatten(got)
    assert tree_expected == tree_got, where
    for e, g in zip(flat_expected, flat_got):
        assert e.shape == g.shape and e.dtype == g.dtype, where
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12, err_msg=where)


@pytest.mark.parametrize("op_name", list(OPS))
def test_parity_with_custom_vjp(table, op_name):
    """Where jax.custom_vjp succeeds, the same numbers; where it fails, a named df.Error."""
    for (composition, name, with_jvp, jit), (theirs, ours) in table.items():
        if name != op_name or with_jvp:
            continue
        where = f"{op_name} / {composition} / jit={jit}"
        if theirs[0] == "ok":
            assert ours[0] == "ok", f"{where}: {ours[1]!r}"
            _assert_same(theirs[1], ours[1], where)
        else:
            assert ours[0] == "error", where
            assert isinstance(ours[1], df.Error), f"{where}: raw {ours[1]!r}"
            assert re.search(r"define \w+\.jvp", str(ours[1])), where


@pytest.mark.parametrize("op_name", list(OPS))
def test_with_a_user_jvp_every_cell_succeeds(table, op_name):
    """With ``jvp`` defined, every composition works, as a jax.custom_jvp with that rule."""
    for (composition, name, with_jvp, jit), (theirs, ours) in table.items():
        if name != op_name or not with_jvp:
            continue
        where = f"{op_name} with jvp / {composition} / jit={jit}"
        assert theirs[0] == "ok", f"{where}: the reference failed: {theirs[1]!r}"
        assert ours[0] == "ok", f"{where}: {ours[1]!r}"
        _assert_same(theirs[1], ours[1], where)


# Beyond the table: a third derivative over forward over reverse, with jax.jit or
# jax.checkpoint inside, and jax.vmap inside a second derivative.
BEYOND = {
    "jacfwd∘hessian∘jit": lambda f: jax.jacfwd(jax.hessian(jax.jit(_loss(f))))(X),
    "jacrev∘hessian∘checkpoint": lambda f: jax.jacrev(jax.hessian(jax.checkpoint(_loss(f))))(X),
    "grad∘grad∘checkpoint": lambda f: jax.grad(
        lambda x: jnp.sum(jax.grad(jax.checkpoint(_loss(f)))(x) ** 2)
    )(X),
    "hessian∘vmap": lambda f: jax.hessian(
        lambda x: jnp.sum(jax.vmap(_loss(f))(jnp.stack([x, 2 * x])))
    )(X),
    "grad∘grad∘vmap": lambda f: jax.grad(
        lambda x: jnp.sum(jax.grad(lambda x: jnp.sum(jax.vmap(_loss(f))(jnp.stack([x, -x]))))(x))
    )(X),
}


@pytest.mark.parametrize("composition", list(BEYOND))
def test_deeper_compositions_match_custom_vjp(composition, x64):
    run = BEYOND[composition]
    for op_name, (cls, _, args_of, (ref_vjp, _)) in OPS.items():
        expected = run(_vector(ref_vjp, args_of))
        got = run(_vector(cls(), args_of))
        _assert_same(jax.tree.map(np.asarray, expected), jax.tree.map(np.asarray, got), op_name)


def test_the_reference_fails_somewhere(table):
    """The table is not vacuous: jax.custom_vjp has no forward mode of its own."""
    failed = {c for (c, _, with_jvp, _), (theirs, _) in table.items() if theirs[0] == "error"}
    assert {"jacfwd", "jvp", "linearize", "jacrev∘jacfwd"} <= failed
    assert {"hessian", "vmap∘hessian", "hessian∘jit", "jvp∘grad"}.isdisjoint(failed)


def test_docs_print_the_table(table):
    docs = (Path(__file__).parent.parent / "docs" / "functions.md").read_text()
    assert markdown_table(table) in docs, markdown_table(table)
