"""DifferentiableFunction with pytrees, keys, integer and optional inputs, and porting idioms.

Every gradient is compared with JAX's own ``jax.custom_vjp`` or with autodiff of the same math,
in float64.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df


class Params(NamedTuple):
    w: jax.Array
    b: jax.Array


def dense_reference(x, params):
    """A dict of two outputs from a NamedTuple of parameters: the autodiff ground truth."""
    y = x @ params.w + params.b[None, :]
    return {"y": y, "total": jnp.sum(x)}


class Dense(df.DifferentiableFunction):
    """``dense_reference`` with a hand-written backward that honours every per-leaf flag."""

    save_inputs_for_backward = True
    computed: list = []  # which gradients the backward computed (a log, not configuration)

    def forward(self, x, params):
        return dense_reference(x, params)

    def backward(self, d, compute_gradients, x, params):
        cg_x, cg_p = compute_gradients
        assert isinstance(cg_p, Params) and isinstance(cg_x, bool)
        dy = d["y"]
        dx = dw = db = None
        if cg_x:
            Dense.computed.append("x")
            dx = dy @ params.w.T + d["total"]
        if cg_p.w:
            Dense.computed.append("w")
            dw = x.T @ dy
        if cg_p.b:
            Dense.computed.append("b")
            db = jnp.sum(dy, axis=0)
        return dx, Params(dw, db)


def dense_args(key, dtype=jnp.float64):
    k = jax.random.split(key, 3)
    x = jax.random.normal(k[0], (5, 3), dtype)
    return x, Params(jax.random.normal(k[1], (3, 4), dtype), jax.random.normal(k[2], (4,), dtype))


def dense_loss(fn):
    def loss(x, params):
        out = fn(x, params)
        return jnp.sum(jnp.sin(out["y"]) ** 2) + out["total"] ** 2

    return loss


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, a: jax.grad(dense_loss(f), (0, 1))(*a),
        lambda f, a: jax.jit(jax.grad(dense_loss(f), (0, 1)))(*a),
        lambda f, a: jax.vmap(jax.grad(dense_loss(f), (0, 1)), (0, None))(
            jnp.stack([a[0], 2 * a[0]]), a[1]
        ),
        lambda f, a: jax.grad(
            lambda x, p: jax.lax.scan(
                lambda c, xi: (c + dense_loss(f)(xi, p), None), 0.0, jnp.stack([x, -x])
            )[0],
            (0, 1),
        )(*a),
        lambda f, a: jax.grad(jax.checkpoint(dense_loss(f)), (0, 1))(*a),
        lambda f, a: jax.grad(lambda p: jnp.sum(jax.grad(dense_loss(f))(a[0], p) ** 2))(a[1]),
    ],
    ids=["grad", "jit", "vmap", "scan", "checkpoint", "grad(grad)"],
)
def test_pytree_inputs_and_outputs_match_autodiff(transform, key, x64):
    args = dense_args(key)
    assert_tree_allclose(
        transform(Dense(), args), transform(dense_reference, args), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize(
    "argnums, leaves, computed",
    [
        ((0,), None, ["x"]),
        ((1,), None, ["w", "b"]),
        ((0, 1), None, ["x", "w", "b"]),
        ((1,), "b", ["b"]),
        ((1,), "w", ["w"]),
    ],
)
def test_compute_gradients_mirror_each_input_and_prune_per_leaf(argnums, leaves, computed, key):
    x, params = dense_args(key, jnp.float32)
    Dense.computed.clear()
    if leaves is None:
        jax.grad(dense_loss(Dense()), argnums)(x, params)
    else:  # differentiate one leaf of the NamedTuple only: the other's flag is False
        other = "w" if leaves == "b" else "b"
        jax.grad(lambda v: dense_loss(Dense())(x, params._replace(**{leaves: v})))(
            getattr(params, leaves)
        )
        assert other not in Dense.computed
    assert Dense.computed == computed


def test_none_subtrees_and_leaves_are_zero_gradients(x64):
    class Split(df.DifferentiableFunction):
        save_inputs_for_backward = True

        def forward(self, parts, y):
            return parts["a"] * parts["b"][0] + jnp.sin(y)

        def backward(self, dz, cg, parts, y):
            # None for leaf "a", None for the whole subtree "b", None for y
            return {"a": None, "b": None}, None

    parts = {"a": jnp.array(2.0), "b": (jnp.array(3.0),)}
    grads = jax.grad(lambda p, y: Split()(p, y), (0, 1))(parts, jnp.array(0.5))
    assert_tree_allclose(grads, ({"a": 0.0, "b": (0.0,)}, 0.0))


def test_output_gradients_arrive_with_the_outputs_structure():
    seen = []

    class Pair(df.DifferentiableFunction):
        num_outputs = 2
        save_inputs_for_backward = True

        def forward(self, x):
            return {"s": jnp.sin(x), "c": jnp.cos(x)}, (x, 2 * x)

        def backward(self, d1, d2, cg, x):
            seen.append((jax.tree.structure(d1), jax.tree.structure(d2)))
            return d1["s"] * jnp.cos(x) - d1["c"] * jnp.sin(x) + d2[0] + 2 * d2[1]

    x = jnp.array(0.3)
    g = jax.grad(lambda x: sum(jax.tree.leaves(Pair()(x))))(x)
    np.testing.assert_allclose(g, jnp.cos(x) - jnp.sin(x) + 3.0, rtol=1e-6)
    assert seen == [(jax.tree.structure({"s": 0, "c": 0}), jax.tree.structure((0, 0)))]
    y = Pair()(x)
    assert isinstance(y, tuple) and set(y[0]) == {"s", "c"} and isinstance(y[1], tuple)


def test_formatted_leaves_in_a_pytree_are_stripped(key):
    seen = []

    class Probe(df.DifferentiableFunction):
        def forward(self, inputs):
            seen.append(jax.tree.map(type, inputs))
            return inputs["x"] * inputs["w"]

        def backward(self, dy, cg):
            return {"x": dy, "w": None}

    x = df.dlarray(jax.random.normal(key, (2, 3)), "BC")
    y = Probe()({"x": x, "w": jnp.ones((2, 3))})
    assert not isinstance(y, df.FormattedArray)
    assert all(not issubclass(t, df.FormattedArray) for t in jax.tree.leaves(seen))


# --------------------------------------------------------------------------------------------
# trace-time checks name the class, the input and the pytree path


def test_wrong_gradient_leaf_is_named_by_its_pytree_path(key):
    class Unreduced(Dense):
        def backward(self, d, cg, x, params):
            dx, dp = super().backward(d, cg, x, params)
            return dx, dp._replace(b=d["y"])  # forgot to sum over the batch

    with pytest.raises(
        df.BackwardError,
        match=r"Unreduced\.backward returned the gradient of input 'params' \(2 of 2\) at "
        r"\.b with shape \(5, 4\) and dtype float32; expected shape \(4,\)",
    ):
        jax.grad(dense_loss(Unreduced()), 1)(*dense_args(key, jnp.float32))


def test_gradient_with_the_wrong_structure_shows_both(key):
    class Flat(Dense):
        def backward(self, d, cg, x, params):
            dx, dp = super().backward(d, cg, x, params)
            return dx, {"w": dp.w, "b": dp.b}  # a dict for a NamedTuple input

    with pytest.raises(
        df.BackwardError,
        match=r"input 'params' \(2 of 2\) with structure \{'w': \*, 'b': \*\}; expected "
        r"Params\(w=\*, b=\*\)",
    ):
        jax.grad(dense_loss(Flat()), 1)(*dense_args(key, jnp.float32))


def test_non_array_leaf_in_an_output_is_named():
    class Labelled(df.DifferentiableFunction):
        def forward(self, x):
            return {"value": x, "unit": "m"}

        def backward(self, d, cg):
            return d["value"]

    with pytest.raises(
        df.ForwardError,
        match=r"Labelled\.forward output 1 at \['unit'\] is a str; expected an array",
    ):
        Labelled()(jnp.ones(2))


# --------------------------------------------------------------------------------------------
# typed keys and integer inputs


class Noisy(df.DifferentiableFunction):
    """x plus noise drawn from a typed key: the key is an input, never differentiated."""

    save_inputs_for_backward = True
    flags: list = []

    def forward(self, x, key):
        return x + 0.1 * jax.random.normal(key, x.shape, x.dtype)

    def backward(self, dy, compute_gradients, x, key):
        Noisy.flags.append(compute_gradients)
        return dy, None


def test_typed_keys_are_inputs_with_no_gradient(key, x64):
    x = jnp.linspace(-1.0, 1.0, 4)
    Noisy.flags.clear()
    reference = lambda x, k: x + 0.1 * jax.random.normal(k, x.shape, x.dtype)  # noqa: E731
    np.testing.assert_array_equal(Noisy()(x, key), reference(x, key))
    g = jax.grad(lambda x: jnp.sum(Noisy()(x, key) ** 2))(x)
    np.testing.assert_allclose(g, jax.grad(lambda x: jnp.sum(reference(x, key) ** 2))(x))
    assert Noisy.flags == [(True, False)]
    keys = jax.random.split(key, 3)
    batched = jax.jit(jax.vmap(Noisy(), (None, 0)))(x, keys)
    assert_tree_allclose(batched, jax.vmap(reference, (None, 0))(x, keys))


def test_integer_inputs_get_float0_cotangents_even_with_allow_int():
    class Pick(df.DifferentiableFunction):
        save_inputs_for_backward = True

        def forward(self, x, index):
            return x[index]

        def backward(self, dy, compute_gradients, x, index):
            assert compute_gradients == (True, False)
            return jnp.zeros_like(x).at[index].set(dy), None

    x, index = jnp.arange(4.0), jnp.array(2)
    gx, gi = jax.grad(Pick(), (0, 1), allow_int=True)(x, index)
    np.testing.assert_array_equal(gx, [0.0, 0.0, 1.0, 0.0])
    assert gi.dtype == jax.dtypes.float0


# --------------------------------------------------------------------------------------------
# porting idioms: each works, or gets an error naming the expected signature


class Linear(df.DifferentiableFunction):
    """PyTorch's LinearFunction: an optional bias, gradients only where asked for."""

    save_inputs_for_backward = True

    def forward(self, x, weight, bias=None):
        y = x @ weight.T
        return y if bias is None else y + bias[None, :]

    def backward(self, dy, needs_input_grad, x, weight, bias):
        dx = dy @ weight if needs_input_grad[0] else None
        dw = dy.T @ x if needs_input_grad[1] else None
        db = jnp.sum(dy, axis=0) if bias is not None and needs_input_grad[2] else None
        return dx, dw, db


def linear_reference(x, weight, bias=None):
    y = x @ weight.T
    return y if bias is None else y + bias[None, :]


@pytest.mark.parametrize("with_bias", ["omitted", "None", "array"])
def test_optional_inputs_take_forward_defaults(with_bias, key, x64):
    k = jax.random.split(key, 3)
    x, w, b = (
        jax.random.normal(k[0], (4, 3)),
        jax.random.normal(k[1], (2, 3)),
        jax.random.normal(k[2], (2,)),
    )
    args = {"omitted": (x, w), "None": (x, w, None), "array": (x, w, b)}[with_bias]
    argnums = tuple(i for i, a in enumerate(args) if a is not None)

    def loss(fn):
        return lambda *a: jnp.sum(jnp.tanh(fn(*a)))

    assert_tree_allclose(Linear()(*args), linear_reference(*args), rtol=1e-12)
    assert_tree_allclose(
        jax.grad(loss(Linear()), argnums)(*args),
        jax.grad(loss(linear_reference), argnums)(*args),
        rtol=1e-12,
    )


def test_wrong_input_count_shows_the_signature_with_optional_inputs():
    with pytest.raises(
        df.DifferentiableFunctionError,
        match=r"Linear was called with 1 inputs; its forward takes 2 to 3 \(x, weight, "
        r"bias=<default>\)",
    ):
        Linear()(jnp.ones((2, 3)))


def test_python_scalar_cotangents_are_converted():
    class Double(df.DifferentiableFunction):
        def forward(self, x):
            return 2.0 * x

        def backward(self, dy, compute_gradients):
            assert isinstance(dy, jax.Array)
            return 2.0 * dy

    @jax.custom_vjp
    def double(x):
        return 2.0 * x

    double.defvjp(lambda x: (double(x), None), lambda _, dy: (2.0 * dy,))
    assert jax.vjp(Double(), 4.0)[1](7.0) == jax.vjp(double, 4.0)[1](7.0)


def test_clip_gradient_of_the_jax_guide_returns_none_for_its_bounds():
    """JAX's clip_gradient returns None for lo and hi, which are differentiated (hi = x + 0.1)."""

    class ClipGradient(df.DifferentiableFunction):
        save_inputs_for_backward = True

        def forward(self, lo, hi, x):
            return x

        def backward(self, dy, compute_gradients, lo, hi, x):
            return None, None, jnp.clip(dy, lo, hi)

    @jax.custom_vjp
    def clip_gradient(lo, hi, x):
        return x

    clip_gradient.defvjp(
        lambda lo, hi, x: (x, (lo, hi)), lambda r, g: (None, None, jnp.clip(g, *r))
    )
    for fn in (ClipGradient(), clip_gradient):
        np.testing.assert_allclose(jax.grad(lambda x, fn=fn: fn(-0.1, x + 0.1, x))(0.1), 0.2)


@pytest.mark.parametrize("num_outputs", [1, 2, 3])
def test_flags_set_per_instance_take_effect(num_outputs, x64):
    class Powers(df.DifferentiableFunction):
        def __init__(self, n):
            self.num_outputs = n
            self.save_inputs_for_backward = True

        def forward(self, x):
            powers = tuple(x ** (k + 1) for k in range(self.num_outputs))
            return powers[0] if self.num_outputs == 1 else powers

        def backward(self, *args):
            *dys, _, x = args
            return sum((k + 1) * x**k * d for k, d in enumerate(dys))

    x = jnp.array(1.5)
    out = Powers(num_outputs)(x)
    assert (num_outputs == 1) == (not isinstance(out, tuple))

    def total(fn):
        return lambda x: sum(jnp.sin(v) for v in jax.tree.leaves(fn(x)))

    reference = lambda x: tuple(x ** (k + 1) for k in range(num_outputs))  # noqa: E731
    np.testing.assert_allclose(
        jax.grad(total(Powers(num_outputs)))(x), jax.grad(total(reference))(x)
    )


def test_a_bad_flag_set_per_instance_is_named():
    class Configured(df.DifferentiableFunction):
        def __init__(self):
            self.num_memory_values = -1

        def forward(self, x):
            return x

        def backward(self, dy, cg):
            return dy

    with pytest.raises(
        df.DifferentiableFunctionError,
        match=r"Configured\.num_memory_values is -1; expected a non-negative int",
    ):
        Configured()(jnp.ones(2))


def test_backward_without_compute_gradients_fails_at_class_definition():
    """PyTorch's backward(ctx, grad) has no flags argument: named when the class is defined."""
    with pytest.raises(
        df.DifferentiableFunctionError,
        match=r"Exp\.backward takes 2 arguments after self \(grad, result\); expected 3: "
        r"backward\(self, dLdY, compute_gradients, Y\).*leaves out compute_gradients",
    ):

        class Exp(df.DifferentiableFunction):
            save_outputs_for_backward = True

            def forward(self, x):
                return jnp.exp(x)

            def backward(self, grad, result):
                return grad * result


def test_backward_expecting_unsaved_inputs_is_named_at_first_call():
    class Scaled(df.DifferentiableFunction):
        def __init__(self, factor):
            self.factor = factor  # an __init__: the flags may be per instance, checked on call

        def forward(self, x, w):
            return self.factor * x * w

        def backward(self, dy, cg, x, w):
            return dy * w, dy * x

    with pytest.raises(
        df.DifferentiableFunctionError,
        match=r"Scaled\.backward takes 4 arguments after self \(dy, cg, x, w\); expected 2: "
        r"backward\(self, dLdY, compute_gradients\).*set save_inputs_for_backward = True",
    ):
        Scaled(2.0)(jnp.ones(2), jnp.ones(2))


def test_memory_values_may_hold_python_values(x64):
    class Reduce(df.DifferentiableFunction):
        num_memory_values = 1

        def forward(self, x):
            axis = x.ndim - 1
            return jnp.sum(x**2, axis=axis), {"axis": axis, "x": x, "name": "sum of squares"}

        def backward(self, dy, cg, memory):
            assert isinstance(memory["axis"], int) and memory["name"] == "sum of squares"
            return 2 * memory["x"] * jnp.expand_dims(dy, memory["axis"])

    x = jnp.arange(6.0).reshape(2, 3)
    reference = lambda x: jnp.sum(x**2, axis=1)  # noqa: E731
    for transform in (jax.jacrev, lambda f: jax.jit(jax.jacrev(f))):
        assert_tree_allclose(transform(Reduce())(x), transform(reference)(x))


def test_unhashable_python_value_in_memory_is_named():
    class Keeps(df.DifferentiableFunction):
        num_memory_values = 1

        def forward(self, x):
            return x, {"seen": {1, 2}}

        def backward(self, dy, cg, memory):
            return dy

    with pytest.raises(
        df.ForwardError,
        match=r"Keeps\.forward returned a memory value at \[0\]\['seen'\] that is an unhashable set",
    ):
        Keeps()(jnp.ones(2))
