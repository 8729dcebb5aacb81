"""Tests of difffn/ops/_recurrent.py: df.ops.lstm and df.ops.gru against flax.nnx's cells."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import assert_tree_allclose
from jax.test_util import check_grads

import difffn as df

H, C, B, T = 4, 3, 2, 5


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _lstm_params(dtype=jnp.float32):
    return (
        _randn((C, 4 * H), seed=1, dtype=dtype) / 2,
        _randn((H, 4 * H), seed=2, dtype=dtype) / 2,
        _randn((4 * H,), seed=3, dtype=dtype),
    )


def _gru_params(bias_blocks=3, dtype=jnp.float32):
    return (
        _randn((C, 3 * H), seed=1, dtype=dtype) / 2,
        _randn((H, 3 * H), seed=2, dtype=dtype) / 2,
        _randn((bias_blocks * H,), seed=3, dtype=dtype),
    )


def nnx_lstm(x, h0, c0, w, r, b, **cell_options):
    """flax.nnx's LSTMCell under nnx.RNN with MATLAB's gates copied in (batch-major x)."""
    cell = nnx.LSTMCell(C, H, rngs=nnx.Rngs(0), **cell_options)
    inputs = (cell.ii, cell.if_, cell.ig, cell.io)
    recurrent = (cell.hi, cell.hf, cell.hg, cell.ho)
    for k, (dense_i, dense_h) in enumerate(zip(inputs, recurrent, strict=True)):
        block = slice(k * H, (k + 1) * H)
        dense_i.kernel[...] = w[:, block]
        dense_h.kernel[...] = r[:, block]
        dense_h.bias[...] = b[block]
    (c, h), y = nnx.RNN(cell, return_carry=True)(x, initial_carry=(c0, h0))
    return y, h, c


def nnx_gru(x, h0, w, r, b):
    """flax.nnx's GRUCell (reset gate after the recurrent multiplication) with MATLAB's weights."""
    cell = nnx.GRUCell(C, H, rngs=nnx.Rngs(0))
    cell.dense_i.kernel[...] = w
    cell.dense_i.bias[...] = b
    cell.dense_h.kernel[...] = r
    h, y = nnx.RNN(cell, return_carry=True)(x, initial_carry=h0)
    return y, h


def gru_loop(x, h, w, r, b, mode):
    """MATLAB's GRU formulas for the other two reset-gate modes, one Python step per time step."""
    wr, wz, wh = (w[:, k * H : (k + 1) * H] for k in range(3))
    rr, rz, rh = (r[:, k * H : (k + 1) * H] for k in range(3))
    bw = [b[None, k * H : (k + 1) * H] for k in range(3)]
    br = [b[None, (k + 3) * H : (k + 4) * H] for k in range(3)] if b.shape[0] == 6 * H else [0] * 3
    ys = []
    for t in range(x.shape[1]):
        xt = x[:, t]
        reset = jax.nn.sigmoid(xt @ wr + bw[0] + h @ rr + br[0])
        update = jax.nn.sigmoid(xt @ wz + bw[1] + h @ rz + br[1])
        if mode == "before-multiplication":
            candidate = jnp.tanh(xt @ wh + bw[2] + (reset * h) @ rh)
        else:
            candidate = jnp.tanh(xt @ wh + bw[2] + reset * (h @ rh + br[2]))
        h = (1 - update) * candidate + update * h
        ys.append(h)
    return jnp.stack(ys, axis=1), h


def test_lstm_matches_nnx_lstm_cell():
    x, h0, c0 = _randn((B, T, C), seed=4), _randn((B, H), seed=5), _randn((B, H), seed=6)
    params = _lstm_params()
    y, h, c = df.ops.lstm(df.dlarray(x, "BTC"), h0, c0, *params)
    assert (y.format, y.shape, h.shape, c.shape) == ("BTC", (B, T, H), (B, H), (B, H))
    assert_tree_allclose((y.data, h, c), nnx_lstm(x, h0, c0, *params), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("options", "cell_options"),
    [
        (dict(state_activation_function="softsign"), dict(activation_fn=jax.nn.soft_sign)),
        (
            dict(gate_activation_function="hard-sigmoid"),
            dict(gate_fn=lambda z: jnp.clip(0.2 * z + 0.5, 0, 1)),
        ),
    ],
)
def test_lstm_activation_options_match_nnx(options, cell_options):
    x, h0, c0 = _randn((B, T, C), seed=7) * 3, jnp.zeros((B, H)), jnp.zeros((B, H))
    params = _lstm_params()
    got = df.ops.lstm(x, h0, c0, *params, fmt="BTC", **options)
    assert_tree_allclose(got, nnx_lstm(x, h0, c0, *params, **cell_options), rtol=1e-5, atol=1e-6)


def test_gru_after_multiplication_matches_nnx_gru_cell():
    x, h0 = _randn((B, T, C), seed=8), _randn((B, H), seed=9)
    params = _gru_params()
    y, h = df.ops.gru(df.dlarray(x, "BTC"), h0, *params)
    assert (y.format, y.shape, h.shape) == ("BTC", (B, T, H), (B, H))
    assert_tree_allclose((y.data, h), nnx_gru(x, h0, *params), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("mode", "bias_blocks"),
    [("before-multiplication", 3), ("recurrent-bias-after-multiplication", 6)],
)
def test_gru_reset_gate_modes_match_the_formulas(mode, bias_blocks):
    x, h0 = _randn((B, T, C), seed=10), _randn((B, H), seed=11)
    params = _gru_params(bias_blocks)
    got = df.ops.gru(x, h0, *params, fmt="BTC", reset_gate_mode=mode)
    assert_tree_allclose(got, gru_loop(x, h0, *params, mode), rtol=1e-5, atol=1e-6)


def test_recurrent_bias_with_zero_recurrent_part_is_after_multiplication():
    x, h0 = _randn((B, T, C), seed=12), _randn((B, H), seed=13)
    w, r, b = _gru_params()
    with_zeros = jnp.concatenate([b, jnp.zeros(3 * H)])
    plain = df.ops.gru(x, h0, w, r, b, fmt="BTC")
    recurrent = df.ops.gru(
        x, h0, w, r, with_zeros, fmt="BTC", reset_gate_mode="recurrent-bias-after-multiplication"
    )
    assert_tree_allclose(recurrent, plain, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fmt", ["TBC", "CBT", "CTB"])
def test_any_axis_order_gives_the_same_sequence(fmt):
    x = df.dlarray(_randn((B, T, C), seed=14), "BTC")
    params = _lstm_params()
    y, h, _ = df.ops.lstm(x, jnp.zeros(H), jnp.zeros(H), *params)
    y2, h2, _ = df.ops.lstm(df.permute(x, fmt), jnp.zeros(H), jnp.zeros(H), *params)
    assert y2.format == fmt
    assert_tree_allclose((df.permute(y2, "BTC").data, h2), (y.data, h), rtol=1e-6, atol=1e-7)


def test_unbatched_single_step_and_plain_inputs():
    x = _randn((B, T, C), seed=15)
    params = _gru_params()
    y, h = df.ops.gru(df.dlarray(x, "BTC"), jnp.zeros(H), *params)
    one, h_one = df.ops.gru(df.dlarray(x[0], "TC"), jnp.zeros(H), *params)
    assert (one.format, one.shape, h_one.shape) == ("TC", (T, H), (1, H))
    np.testing.assert_allclose(one.data, y.data[0], rtol=1e-6, atol=1e-7)
    step, _ = df.ops.gru(df.dlarray(x[:, 0], "BC"), jnp.zeros(H), *params)
    assert (step.format, step.shape) == ("BC", (B, H))
    np.testing.assert_allclose(step.data, y.data[:, 0], rtol=1e-6, atol=1e-7)
    plain, _ = df.ops.gru(x, jnp.zeros(H), *params, fmt="BTC")
    assert not isinstance(plain, df.FormattedArray)
    np.testing.assert_allclose(plain, y.data, rtol=1e-6)


def test_formatted_states_keep_their_format():
    x = df.dlarray(_randn((B, T, C), seed=16), "BTC")
    h0 = _randn((B, H), seed=17)
    params = _lstm_params()
    _, h, c = df.ops.lstm(x, df.dlarray(h0.T, "CB"), df.dlarray(h0, "BC"), *params)
    _, h_plain, c_plain = df.ops.lstm(x, h0, h0, *params)
    assert (h.format, h.shape, c.format) == ("CB", (H, B), "BC")
    assert_tree_allclose((h.data.T, c.data), (h_plain, c_plain), rtol=1e-6)
    _, h_vec = df.ops.gru(df.dlarray(x.data[0], "TC"), df.dlarray(jnp.zeros(H), "C"),
                          *_gru_params())  # fmt: skip
    assert (h_vec.format, h_vec.shape) == ("C", (H,))


def test_jit_and_vmap():
    x = _randn((B, T, C), seed=18)
    params = _lstm_params()
    eager = df.ops.lstm(df.dlarray(x, "BTC"), jnp.zeros(H), jnp.zeros(H), *params)
    jitted = jax.jit(df.ops.lstm, static_argnames="fmt")(
        x, jnp.zeros(H), jnp.zeros(H), *params, fmt="BTC"
    )
    assert_tree_allclose(jitted, (eager[0].data, *eager[1:]), rtol=1e-6, atol=1e-7)
    one = lambda seq: df.ops.lstm(seq, jnp.zeros(H), jnp.zeros(H), *params, fmt="TC")  # noqa: E731
    y, h, c = jax.vmap(one)(x)
    assert_tree_allclose((y, h[:, 0], c[:, 0]), (eager[0].data, *eager[1:]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["lstm", "gru-before", "gru-recurrent-bias"])
def test_gradients_float64_match_finite_differences(x64, op):
    x = _randn((B, 3, C), seed=19, dtype=jnp.float64)
    h0 = _randn((B, H), seed=20, dtype=jnp.float64)
    if op == "lstm":
        args = (x, h0, h0 / 2, *_lstm_params(jnp.float64))

        def f(x, h0, c0, w, r, b):
            y, h, c = df.ops.lstm(x, h0, c0, w, r, b, fmt="BTC")
            return jnp.sum(jnp.sin(y)) + jnp.sum(h * c)

    else:
        mode = "before-multiplication" if op == "gru-before" else (
            "recurrent-bias-after-multiplication")  # fmt: skip
        args = (x, h0, *_gru_params(6 if op == "gru-recurrent-bias" else 3, jnp.float64))

        def f(x, h0, w, r, b):
            y, h = df.ops.gru(x, h0, w, r, b, fmt="BTC", reset_gate_mode=mode)
            return jnp.sum(jnp.sin(y)) + jnp.sum(h**2)

    check_grads(jax.jit(f), args, order=1, modes=("rev",), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_grad_of_a_formatted_input_has_its_format():
    x = df.dlarray(_randn((B, T, C), seed=21), "TBC")
    params = _gru_params()
    grad = jax.grad(lambda x: jnp.sum(df.ops.gru(x, jnp.zeros(H), *params)[0].data))(x)
    assert (grad.format, grad.shape) == ("TBC", (B, T, C))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda p: df.ops.lstm(jnp.ones((2, 5, C)), *p), df.FormatError,
         r"df\.ops\.lstm: x is a plain array of shape \(2, 5, 3\) without a format.*fmt="),
        (lambda p: df.ops.lstm(df.dlarray(jnp.ones((2, 4, 4, C)), "BSSC"), *p), df.FormatError,
         r"df\.ops\.lstm: the input format 'BSSC' does not fit; expected a 'C' axis"),
        (lambda p: df.ops.lstm(df.dlarray(jnp.ones((2, 5, C)), "BTC"), *p, fmt="BTC"),
         df.FormatError, r"already formatted \('BTC'\), so fmt='BTC' is ambiguous"),
        (lambda p: df.ops.lstm(jnp.ones((2, 5, 7)), *p, fmt="BTC"), df.OpError,
         r"df\.ops\.lstm: weights has shape \(3, 16\); expected \(7, 16\)"),
        (lambda p: df.ops.lstm(jnp.ones((2, 5, C)), *p[:3], p[3][:, :5], p[4], fmt="BTC"),
         df.OpError, r"recurrent_weights has shape \(4, 5\); expected \(H, 4 \* H\)"),
        (lambda p: df.ops.lstm(jnp.ones((3, 5, C)), jnp.zeros((2, H)), *p[1:], fmt="BTC"),
         df.OpError, r"hidden_state has shape \(2, 4\); expected .*batch = 3"),
        (lambda p: df.ops.lstm(jnp.ones((2, 5, C)), *p, fmt="BTC",
                               gate_activation_function="relu"),
         df.OpError, r"gate_activation_function must be one of 'sigmoid' \| 'hard-sigmoid'"),
        (lambda p: df.ops.gru(jnp.ones((2, 5, C)), p[0], *_gru_params(), fmt="BTC",
                              reset_gate_mode="recurrent-bias-after-multiplication"),
         df.OpError, r"df\.ops\.gru: bias has shape \(12,\); expected \(24,\).*recurrent biases"),
    ],
)  # fmt: skip
def test_errors_name_the_op_and_the_fix(call, error, match):
    params = (jnp.zeros(H), jnp.zeros(H), *_lstm_params())
    with pytest.raises(error, match=match):
        call(params)
