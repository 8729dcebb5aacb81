"""``df.ops.conv``'s convolution with canonical gradients (``ops/_conv_layouts.py``).

Compared with ``jax.lax.conv_general_dilated`` differentiated by JAX itself: values, reverse and
forward mode, second derivatives, ``vmap``; and XLA:CPU's compiled program of a training step in
a ``lax.scan``, whose every convolution must be in the layout its fast kernels take.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df
from difffn._training import _chunk
from difffn.ops import _conv_layouts

CASES = [
    # spec, data shape, kernel shape, strides, pads, dilation
    ("NHWC", (2, 7, 6, 3), (3, 2, 3, 4), (1, 1), ((1, 1), (0, 1)), (1, 1)),
    ("NHWC", (2, 9, 8, 3), (3, 3, 3, 5), (2, 2), ((1, 1), (1, 1)), (1, 1)),
    ("HWCN", (8, 7, 3, 2), (2, 3, 3, 4), (1, 2), ((2, 0), (1, 1)), (2, 1)),
    ("NHC", (3, 11, 4), (3, 4, 2), (1,), ((2, 0),), (2,)),
    ("CNHW", (3, 2, 6, 6), (3, 3, 3, 2), (1, 1), ((0, 0), (0, 0)), (1, 1)),
]


def _lax(x, w, strides, pads, dilation, spec):
    letters = spec.replace("N", "").replace("C", "")
    return jax.lax.conv_general_dilated(
        x, w, strides, pads, rhs_dilation=dilation,
        dimension_numbers=(spec, letters + "IO", spec),
        precision=jax.lax.Precision.HIGHEST,
    )  # fmt: skip


def _ours(x, w, strides, pads, dilation, spec):
    return _conv_layouts.conv(x, w, strides, pads, dilation, spec)


def _operands(case, dtype=jnp.float64):
    spec, xs, ws, *_ = case
    kx, kw = jax.random.split(jax.random.key(len(spec) + sum(xs)))
    return jax.random.normal(kx, xs, dtype), jax.random.normal(kw, ws, dtype)


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


@pytest.mark.parametrize("case", CASES, ids=[c[0] + str(c[3]) for c in CASES])
def test_values_and_both_gradients_match_lax(case, x64):
    spec, _, _, strides, pads, dilation = case
    x, w = _operands(case)
    args = (strides, pads, dilation, spec)
    np.testing.assert_allclose(_ours(x, w, *args), _lax(x, w, *args), rtol=1e-12, atol=1e-12)

    def loss(f):
        return lambda x, w: jnp.sum(jnp.sin(f(x, w, *args)))

    for got, want in zip(
        jax.grad(loss(_ours), (0, 1))(x, w), jax.grad(loss(_lax), (0, 1))(x, w), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", CASES[:3], ids=[c[0] + str(c[3]) for c in CASES[:3]])
def test_forward_mode_and_second_derivatives_match_lax(case, x64):
    spec, _, _, strides, pads, dilation = case
    x, w = _operands(case)
    args = (strides, pads, dilation, spec)
    tx, tw = jax.tree.map(lambda a: jnp.cos(a), (x, w))
    got = jax.jvp(lambda x, w: _ours(x, w, *args), (x, w), (tx, tw))
    want = jax.jvp(lambda x, w: _lax(x, w, *args), (x, w), (tx, tw))
    for g, v in zip(got, want, strict=True):
        np.testing.assert_allclose(g, v, rtol=1e-10, atol=1e-10)

    def loss(f):  # the Hessian along w, through a nonlinearity
        return lambda w: jnp.sum(jnp.tanh(f(x, w, *args)) ** 2)

    hess = jax.hessian(loss(_ours))(w)
    np.testing.assert_allclose(hess, jax.hessian(loss(_lax))(w), rtol=1e-9, atol=1e-9)
    fwd = jax.jacfwd(jax.grad(loss(_ours)))(w)
    np.testing.assert_allclose(fwd, hess, rtol=1e-9, atol=1e-9)


def test_vmap_matches_lax():
    case = CASES[0]
    spec, _, _, strides, pads, dilation = case
    x, w = _operands(case, jnp.float32)
    ws = jnp.stack([w, 2 * w, -w])

    def grad(conv):
        return jax.grad(lambda w: jnp.sum(jnp.sin(conv(x, w, strides, pads, dilation, spec))))

    np.testing.assert_allclose(
        jax.vmap(grad(_ours))(ws), jax.vmap(grad(_lax))(ws), rtol=1e-4, atol=1e-4
    )


def test_a_term_nobody_differentiates_is_not_computed():
    """The data of a first layer has no gradient: forward and filter gradient only."""
    case = CASES[0]
    spec, _, _, strides, pads, dilation = case
    x, w = _operands(case, jnp.float32)
    loss = lambda w: jnp.sum(_ours(x, w, strides, pads, dilation, spec) ** 2)  # noqa: E731
    assert _chunk.convolutions(jax.make_jaxpr(jax.grad(loss))(w).jaxpr) == 2
    both = lambda x, w: jnp.sum(_ours(x, w, strides, pads, dilation, spec) ** 2)  # noqa: E731
    assert _chunk.convolutions(jax.make_jaxpr(jax.grad(both, (0, 1)))(x, w).jaxpr) == 3


_LABELS = re.compile(r"convolution\(.*dim_labels=([\w>-]+)")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's layouts")
def test_every_convolution_of_a_scanned_training_step_is_canonical():
    """Two df.ops.conv layers (stride 2, "same" padding), their input and filter gradients,
    inside lax.scan: XLA:CPU compiles each in the layout of its fast kernels."""
    x = jax.random.normal(jax.random.key(0), (4, 9, 9, 3))
    w1 = jax.random.normal(jax.random.key(1), (3, 3, 3, 8)) * 0.1
    w2 = jax.random.normal(jax.random.key(2), (3, 3, 8, 4)) * 0.1

    def loss(ws):
        h = df.ops.conv(df.dlarray(x, "BSSC"), ws[0], padding="same", stride=2)
        y = df.ops.conv(df.ops.relu(h), ws[1], padding="same")
        return jnp.mean(y.data**2)

    def steps(ws):
        def body(ws, _):
            return jax.tree.map(lambda w, g: w - 0.1 * g, ws, jax.grad(loss)(ws)), None

        return jax.lax.scan(body, ws, None, length=3)[0]

    text = jax.jit(steps).lower((w1, w2)).compile().as_text()
    labels = _LABELS.findall(text)
    assert len(labels) == 5, labels  # forward twice, one input and two filter gradients
    assert all(lab == "b01f_01io->b01f" for lab in labels), labels
    np.testing.assert_allclose(
        jax.jit(steps)((w1, w2))[1], _reference_steps(x, w1, w2)[1], rtol=2e-5, atol=2e-6
    )


def _reference_steps(x, w1, w2):
    """The same three steps with lax convolutions differentiated by JAX, outside a loop."""

    def loss(ws):
        h = _lax(x, ws[0], (2, 2), ((1, 1), (1, 1)), (1, 1), "NHWC")
        y = _lax(jax.nn.relu(h), ws[1], (1, 1), ((1, 1), (1, 1)), (1, 1), "NHWC")
        return jnp.mean(y**2)

    ws = (w1, w2)
    for _ in range(3):
        ws = jax.tree.map(lambda w, g: w - 0.1 * g, ws, jax.grad(loss)(ws))
    return ws
