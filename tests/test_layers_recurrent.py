"""Tests of difffn/layers/_recurrent.py and _gru.py: LSTM against a hand-written loop over time,
GRU and BiLSTM against flax.nnx's cells."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df
from difffn._layer._layer import call_layer

L = df.layers


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


H, C = 4, 3


@functools.partial(jax.jit, static_argnames=("gate", "act"))
def lstm_reference(x, w, r, b, h, c, gate=jax.nn.sigmoid, act=jnp.tanh):
    """MATLAB's LSTM on (batch, time, channels), one Python step per time step."""
    n = r.shape[0]
    outputs = []
    for t in range(x.shape[1]):
        z = x[:, t] @ w + h @ r + b[None]
        i, f, g, o = z[:, :n], z[:, n : 2 * n], z[:, 2 * n : 3 * n], z[:, 3 * n :]
        c = gate(f) * c + gate(i) * act(g)
        h = gate(o) * act(c)
        outputs.append(h)
    return jnp.stack(outputs, axis=1), h, c


def _layer(key, **options):
    """A layer with given (numpy-drawn) parameters and a state for a batch of 2."""
    layer = L.LSTM(
        H,
        input_weights=_randn((C, 4 * H), seed=1) / 2,
        recurrent_weights=_randn((H, 4 * H), seed=2) / 2,
        bias=_randn((4 * H,), seed=3),
        hidden_state=_randn((2, H), seed=4),
        cell_state=_randn((2, H), seed=5),
        **options,
    )
    return layer.initialize(df.Layout((None, None, C), "BTC"), key=key)


def _reference_of(layer, x, **kwargs):
    return lstm_reference(
        x,
        layer.input_weights,
        layer.recurrent_weights,
        layer.bias,
        layer.hidden_state,
        layer.cell_state,
        **kwargs,
    )


def test_sequence_output_matches_reference(key):
    layer = _layer(key)
    x = _randn((2, 5, C), seed=4)
    y, h, c = layer(df.dlarray(x, "BTC"))
    ys, h_ref, c_ref = _reference_of(layer, x)
    assert (y.format, y.shape, h.shape, c.shape) == ("BTC", (2, 5, H), (2, H), (2, H))
    assert_tree_allclose((y.data, h, c), (ys, h_ref, c_ref), rtol=1e-5, atol=1e-6)


def test_time_major_and_last_output(key):
    layer = _layer(key)
    x = df.dlarray(_randn((2, 5, C), seed=5), "BTC")
    y, h, _ = layer(x)
    y_tbc, h_tbc, _ = layer(df.permute(x, "TBC"))
    assert y_tbc.format == "TBC"
    assert_tree_allclose((df.permute(y_tbc, "BTC").data, h_tbc), (y.data, h), rtol=1e-6)
    last = layer.replace(output_mode="last")
    y_last, h_last, _ = last(x)
    assert (y_last.format, y_last.shape) == ("BC", (2, H))
    np.testing.assert_allclose(y_last.data, y.data[:, -1], rtol=1e-6)
    y_cb = last(df.permute(x, "CBT"))[0]
    assert (y_cb.format, y_cb.shape) == ("CB", (H, 2))
    plain = layer(x.data)[0]
    assert not isinstance(plain, df.FormattedArray)
    np.testing.assert_allclose(plain, y.data, rtol=1e-6)


def test_running_in_two_halves_with_carried_state_equals_whole(key):
    layer = _layer(key)
    x = df.dlarray(_randn((2, 8, C), seed=6), "BTC")
    y, h, c = layer(x)
    y1, h1, c1 = layer(x[:, :5])
    y2, h2, c2 = layer.replace(hidden_state=h1, cell_state=c1)(x[:, 5:])
    joined = jnp.concatenate([y1.data, y2.data], axis=1)
    assert_tree_allclose((joined, h2, c2), (y.data, h, c), rtol=1e-5, atol=1e-6)


def test_unbatched_and_single_step_inputs(key):
    layer = _layer(key).reset_state()
    x = _randn((2, 5, C), seed=7)
    y, h, _ = layer(df.dlarray(x, "BTC"))
    y_one, h_one, _ = layer(df.dlarray(x[0], "TC"))
    assert (y_one.format, y_one.shape, h_one.shape) == ("TC", (5, H), (1, H))
    np.testing.assert_allclose(y_one.data, y.data[0], rtol=1e-5, atol=1e-6)
    step, _, _ = layer(df.dlarray(x[:, 0], "BC"))
    assert (step.format, step.shape) == ("BC", (2, H))
    np.testing.assert_allclose(step.data, y.data[:, 0], rtol=1e-5, atol=1e-6)
    vector = layer.replace(output_mode="last")(df.dlarray(x[0], "TC"))[0]
    assert (vector.format, vector.shape) == ("C", (H,))


def test_initialize_state_policy_and_reset(key):
    layout = df.Layout((None, None, C), "BTC")
    layer = L.LSTM(H).initialize(layout, key=key)
    assert layer.learnable_names == ("input_weights", "recurrent_weights", "bias")
    assert layer.state_names == ("hidden_state", "cell_state")
    assert layer.input_weights.shape == (C, 4 * H)
    assert layer.recurrent_weights.shape == (H, 4 * H)
    np.testing.assert_array_equal(layer.bias, [0.0] * H + [1.0] * H + [0.0] * 2 * H)
    r = np.asarray(layer.recurrent_weights)
    np.testing.assert_allclose(r @ r.T, np.eye(H), atol=1e-5)
    assert layer.hidden_state.shape == layer.cell_state.shape == (1, H)
    np.testing.assert_array_equal(layer.hidden_state, 0)
    assert layer.initialize(layout, key=jax.random.key(4)) is layer
    _, h, c = layer(jnp.ones((3, 2, C)))
    assert h.shape == c.shape == (3, H)
    carried = layer.replace(hidden_state=h, cell_state=c)
    with pytest.raises(df.LayerError, match=r"hidden_state has batch size 3 .* input has batch "
                       r"size 5\. Fix: layer\.reset_state\(\)"):  # fmt: skip
        carried(jnp.ones((5, 2, C)))
    reset = carried.reset_state()
    assert reset.hidden_state.shape == (1, H)
    np.testing.assert_array_equal(reset.cell_state, 0)
    assert reset(jnp.ones((5, 2, C)))[0].shape == (5, 2, H)
    given = L.LSTM(H, hidden_state=jnp.ones(H))
    assert given.hidden_state.shape == (1, H)


@pytest.mark.parametrize(
    ("options", "gate", "act"),
    [
        (dict(state_activation_function="softsign"), jax.nn.sigmoid, jax.nn.soft_sign),
        (
            dict(gate_activation_function="hard-sigmoid"),
            lambda z: jnp.clip(0.2 * z + 0.5, 0, 1),
            jnp.tanh,
        ),
    ],
)
def test_activation_options(key, options, gate, act):
    layer = _layer(key, **options)
    x = _randn((2, 3, C), seed=8) * 3
    y, h, c = layer(x)
    assert_tree_allclose(
        (y, h, c), _reference_of(layer, x, gate=gate, act=act), rtol=1e-5, atol=1e-6
    )


def test_gradients_float64(x64, key):
    layer = jax.tree.map(lambda a: a.astype(jnp.float64), _layer(key))
    x = _randn((2, 4, C), seed=9, dtype=jnp.float64)

    def loss(layer, x):
        (y,), (h, c) = call_layer(layer, (df.dlarray(x, "BTC"),), training=True)
        return jnp.sum(jnp.sin(y.data)) + jnp.sum(h * c)

    def reference(w, r, b, h0, c0, x):
        y, h, c = lstm_reference(x, w, r, b, h0, c0)
        return jnp.sum(jnp.sin(y)) + jnp.sum(h * c)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(layer, x)
    expected = jax.jit(jax.grad(reference, argnums=tuple(range(6))))(
        layer.input_weights,
        layer.recurrent_weights,
        layer.bias,
        layer.hidden_state,
        layer.cell_state,
        x,
    )
    g = grads[0]
    got = (g.input_weights, g.recurrent_weights, g.bias, g.hidden_state, g.cell_state, grads[1])
    assert_tree_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.LSTM(0), r"LSTM \(layer ''\): num_hidden_units must be a positive int"),
        (lambda: L.LSTM(2, output_mode="all"), r"output_mode must be one of 'sequence' \| 'last'"),
        (lambda: L.LSTM(2, state_activation_function="relu"), "state_activation_function"),
        (lambda: L.LSTM(2, bias_initializer="he"), "bias_initializer must be one of"),
        (lambda: L.LSTM(2, recurrent_weights=jnp.ones((2, 2))), r"shape \(2, 8\)"),
        (lambda: L.LSTM(2, cell_state=jnp.ones((1, 3))), r"cell_state must be an array of shape"),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_format_and_size_errors(key):
    layer = L.LSTM(H, name="lstm")
    with pytest.raises(df.FormatError, match=r"LSTM \(layer 'lstm'\)\.initialize.*'BSSC'"):
        layer.initialize(df.Layout((None, 2, 2, 3), "BSSC"), key=key)
    ready = layer.initialize(df.Layout((None, None, C), "BTC"), key=key)
    with pytest.raises(df.FormatError, match=r"takes sequence data.*got format 'BSSC'"):
        ready(df.dlarray(jnp.ones((1, 2, 2, C)), "BSSC"))
    with pytest.raises(df.FormatError, match=r"plain input only as \(batch, time, channels\)"):
        ready(jnp.ones((2, C)))
    with pytest.raises(df.LayerError, match=r"the input has 5 channels but input_weights"):
        ready(jnp.ones((2, 3, 5)))


# -- GRU and BiLSTM (and what the recurrent layers share) ----------------------------------------


def _nnx_lstm_cell(w, r, b):
    """flax.nnx's LSTMCell with MATLAB's gate blocks (input, forget, candidate, output) copied in."""
    from flax import nnx

    cell = nnx.LSTMCell(w.shape[0], r.shape[0], rngs=nnx.Rngs(0))
    n = r.shape[0]
    pairs = zip((cell.ii, cell.if_, cell.ig, cell.io), (cell.hi, cell.hf, cell.hg, cell.ho))
    for k, (dense_i, dense_h) in enumerate(pairs):
        dense_i.kernel[...] = w[:, k * n : (k + 1) * n]
        dense_h.kernel[...] = r[:, k * n : (k + 1) * n]
        dense_h.bias[...] = b[k * n : (k + 1) * n]
    return cell


def _gru(key, **options):
    layer = L.GRU(
        H,
        input_weights=_randn((C, 3 * H), seed=1) / 2,
        recurrent_weights=_randn((H, 3 * H), seed=2) / 2,
        bias=_randn((3 * H,), seed=3),
        hidden_state=_randn((2, H), seed=4),
        **options,
    )
    return layer.initialize(df.Layout((None, None, C), "BTC"), key=key)


def _bilstm(key, **options):
    layer = L.BiLSTM(
        H,
        input_weights=_randn((C, 8 * H), seed=1) / 2,
        recurrent_weights=_randn((H, 8 * H), seed=2) / 2,
        bias=_randn((8 * H,), seed=3),
        hidden_state=_randn((2, 2 * H), seed=4),
        cell_state=_randn((2, 2 * H), seed=5),
        **options,
    )
    return layer.initialize(df.Layout((None, None, C), "BTC"), key=key)


def test_gru_matches_nnx_gru_cell(key):
    from flax import nnx

    layer = _gru(key)
    cell = nnx.GRUCell(C, H, rngs=nnx.Rngs(0))
    cell.dense_i.kernel[...] = layer.input_weights
    cell.dense_i.bias[...] = layer.bias
    cell.dense_h.kernel[...] = layer.recurrent_weights
    x = _randn((2, 6, C), seed=6)
    h_ref, y_ref = nnx.RNN(cell, return_carry=True)(x, initial_carry=layer.hidden_state)
    y, h = layer(df.dlarray(x, "BTC"))
    assert (y.format, y.shape, h.shape) == ("BTC", (2, 6, H), (2, H))
    assert_tree_allclose((y.data, h), (y_ref, h_ref), rtol=1e-5, atol=1e-6)
    last, h_last = layer.replace(output_mode="last")(df.dlarray(x, "BTC"))
    assert (last.format, last.shape) == ("BC", (2, H))
    assert_tree_allclose((last.data, h_last), (h_ref, h_ref), rtol=1e-5, atol=1e-6)


def test_gru_reset_gate_modes_use_df_ops_gru(key):
    x = df.dlarray(_randn((2, 5, C), seed=7), "TBC")
    for mode, blocks in (("before-multiplication", 3), ("recurrent-bias-after-multiplication", 6)):
        layer = L.GRU(H, reset_gate_mode=mode).initialize(
            df.Layout((None, None, C), "TBC"), key=key
        )
        assert layer.bias.shape == (blocks * H,)
        layer = layer.replace(bias=_randn((blocks * H,), seed=8))
        y, h = layer(x)
        expected = df.ops.gru(
            x, layer.hidden_state, layer.input_weights, layer.recurrent_weights, layer.bias,
            reset_gate_mode=mode,
        )  # fmt: skip
        assert_tree_allclose((y.data, h), (expected[0].data, expected[1]), rtol=1e-6)
    with pytest.raises(df.LayerError, match=r"bias must be an array of shape \(24\)"):
        _gru(key).replace(reset_gate_mode="recurrent-bias-after-multiplication")


def test_bilstm_matches_nnx_bidirectional(key):
    from flax import nnx

    layer = _bilstm(key)
    w, r, b = layer.input_weights, layer.recurrent_weights, layer.bias
    fw, bw = slice(0, 4 * H), slice(4 * H, 8 * H)
    bidirectional = nnx.Bidirectional(
        nnx.RNN(_nnx_lstm_cell(w[:, fw], r[:, fw], b[fw])),
        nnx.RNN(_nnx_lstm_cell(w[:, bw], r[:, bw], b[bw])),
    )
    h0, c0 = layer.hidden_state, layer.cell_state
    x = _randn((2, 6, C), seed=9)
    ((c_f, h_f), (c_b, h_b)), y_ref = bidirectional(
        x,
        initial_carry=((c0[:, :H], h0[:, :H]), (c0[:, H:], h0[:, H:])),
        return_carry=True,
    )
    y, h, c = layer(df.dlarray(x, "BTC"))
    assert (y.format, y.shape, h.shape, c.shape) == ("BTC", (2, 6, 2 * H), (2, 2 * H), (2, 2 * H))
    expected_h, expected_c = jnp.concatenate([h_f, h_b], -1), jnp.concatenate([c_f, c_b], -1)
    assert_tree_allclose((y.data, h, c), (y_ref, expected_h, expected_c), rtol=1e-5, atol=1e-6)
    last = layer.replace(output_mode="last")(df.dlarray(x, "BTC"))[0]
    np.testing.assert_allclose(last.data, expected_h, rtol=1e-5, atol=1e-6)
    # the backward half of the last output is the backward LSTM after the whole sequence
    np.testing.assert_allclose(last.data[:, H:], y_ref[:, 0, H:], rtol=1e-5, atol=1e-6)


def test_bilstm_initialization_and_reset(key):
    layer = L.BiLSTM(H).initialize(df.Layout((None, None, C), "BTC"), key=key)
    assert layer.input_weights.shape == (C, 8 * H)
    assert layer.recurrent_weights.shape == (H, 8 * H)
    forget = np.zeros((2, 4, H))
    forget[:, 1] = 1
    np.testing.assert_array_equal(layer.bias, forget.ravel())
    assert layer.hidden_state.shape == layer.cell_state.shape == (1, 2 * H)
    _, h, c = layer(jnp.ones((3, 4, C)))
    reset = layer.replace(hidden_state=h, cell_state=c).reset_state()
    assert reset.hidden_state.shape == (1, 2 * H)
    np.testing.assert_array_equal(reset.cell_state, 0)


@pytest.mark.parametrize(
    ("make", "layout"),
    [
        (lambda: L.LSTM(3), df.Layout((None, 4, 2), "BTC")),
        (lambda: L.GRU(3, reset_gate_mode="before-multiplication"), df.Layout((None, 4, 2), "TBC")),
        (lambda: L.BiLSTM(3, output_mode="last"), df.Layout((None, 4, 2), "BTC")),
    ],
    ids=["LSTM", "GRU", "BiLSTM"],
)
def test_check_layer_passes(make, layout):
    report = df.check_layer(make(), layout)
    assert report.ok, str(report)


def test_factor_options_set_the_learnables_factors(key):
    layer = L.GRU(H, input_weights_learn_rate_factor=2, bias_l2_factor=0.5, name="gru")
    assert df.get_learn_rate_factor(layer, "input_weights") == 2.0
    assert df.get_learn_rate_factor(layer, "recurrent_weights") == 1.0
    assert df.get_l2_factor(layer, "bias") == 0.5
    assert df.get_l2_factor(L.BiLSTM(H), "bias") == 0.0  # MATLAB's BiasL2Factor default
    initialized = layer.initialize(df.Layout((None, None, C), "BTC"), key=key)
    assert df.get_learn_rate_factor(initialized, "input_weights") == 2.0
    changed = initialized.replace(input_weights_learn_rate_factor=1.0)
    assert df.get_learn_rate_factor(changed, "input_weights") == 1.0
    with pytest.raises(df.LayerError, match=r"GRU \(layer 'gru'\): bias_l2_factor must be a non"):
        layer.replace(bias_l2_factor=-1)


@pytest.mark.parametrize("make", [_gru, _bilstm], ids=["GRU", "BiLSTM"])
def test_gradients_float64_match_finite_differences(x64, key, make):
    from jax.test_util import check_grads

    layer = jax.tree.map(lambda a: a.astype(jnp.float64), make(key))
    x = _randn((2, 3, C), seed=10, dtype=jnp.float64)

    def loss(x, w, r, b):
        (y, *_), _ = call_layer(
            layer.replace(input_weights=w, recurrent_weights=r, bias=b), (x,), training=True
        )
        return jnp.sum(jnp.sin(y))

    args = (x, layer.input_weights, layer.recurrent_weights, layer.bias)
    check_grads(jax.jit(loss), args, order=1, modes=("rev",), eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.GRU(0), r"GRU \(layer ''\): num_hidden_units must be a positive int"),
        (lambda: L.GRU(2, reset_gate_mode="after"), r"reset_gate_mode must be one of"),
        (lambda: L.GRU(2, bias_initializer="unit-forget-gate"), "bias_initializer must be one"),
        (lambda: L.GRU(2, input_weights=jnp.ones((3, 8))), r"input_weights must be .*\(any, 6\)"),
        (lambda: L.BiLSTM(2, recurrent_weights=jnp.ones((2, 8))), r"shape \(2, 16\)"),
        (lambda: L.BiLSTM(2, hidden_state=jnp.ones(2)), r"hidden_state must be an array of shape "
                                                         r"\(4,\), \(1, 4\) or \(batch, 4\)"),
        (lambda: L.BiLSTM(2, output_mode="all"), r"output_mode must be one of"),
    ],
)  # fmt: skip
def test_gru_and_bilstm_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_gru_and_bilstm_format_errors(key):
    for layer in (L.GRU(H, name="g"), L.BiLSTM(H, name="g")):
        name = type(layer).__name__
        with pytest.raises(df.FormatError, match=rf"{name} \(layer 'g'\)\.initialize.*'BSSC'"):
            layer.initialize(df.Layout((None, 2, 2, 3), "BSSC"), key=key)
        ready = layer.initialize(df.Layout((None, None, C), "BTC"), key=key)
        with pytest.raises(df.FormatError, match=r"takes sequence data.*got format 'BCU'"):
            ready(df.dlarray(jnp.ones((1, C, 2)), "BCU"))
        with pytest.raises(df.LayerError, match=r"the input has 5 channels but input_weights"):
            ready(jnp.ones((2, 3, 5)))
