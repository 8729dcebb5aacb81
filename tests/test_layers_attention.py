"""Tests of difffn/layers/_attention.py: SelfAttention against flax.nnx.MultiHeadAttention."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import assert_tree_allclose
from jax.test_util import check_grads

import difffn as df
from difffn._layer._layer import call_layer

L = df.layers
HEADS, KEYS, C, T = 2, 8, 6, 5
LAYOUT = df.Layout((None, None, C), "BTC")


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _layer(key, **options):
    layer = L.SelfAttention(HEADS, KEYS, name="attn", **options).initialize(
        *(LAYOUT,) * (2 if options.get("has_padding_mask_input") else 1), key=key
    )
    # non-zero biases, so that a misplaced bias shows
    biases = {n: _randn(getattr(layer, n).shape, seed=i) / 4 for i, n in enumerate(
        ("query_bias", "key_bias", "value_bias", "output_bias"))}  # fmt: skip
    return layer.replace(**biases)


def nnx_reference(layer, x, mask=None):
    """flax.nnx.MultiHeadAttention with the layer's weights (heads split contiguously)."""
    out = layer.output_weights.shape[1]
    module = nnx.MultiHeadAttention(
        HEADS, C, qkv_features=KEYS, out_features=out, decode=False, rngs=nnx.Rngs(0)
    )
    per_head = KEYS // HEADS
    for name in ("query", "key", "value"):
        dense = getattr(module, name)
        dense.kernel[...] = getattr(layer, f"{name}_weights").reshape(C, HEADS, per_head)
        dense.bias[...] = getattr(layer, f"{name}_bias").reshape(HEADS, per_head)
    module.out.kernel[...] = layer.output_weights.reshape(HEADS, per_head, out)
    module.out.bias[...] = layer.output_bias
    return module(x, mask=mask, deterministic=True)


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_matches_nnx_multi_head_attention(key, mask):
    layer = _layer(key, attention_mask=mask)
    x = _randn((3, T, C), seed=5)
    y = layer(df.dlarray(x, "BTC"))
    flax_mask = nnx.make_causal_mask(jnp.ones((3, T))) if mask == "causal" else None
    assert (y.format, y.shape) == ("BTC", (3, T, C))
    np.testing.assert_allclose(y.data, nnx_reference(layer, x, flax_mask), rtol=1e-5, atol=1e-5)


def test_padding_mask_input_and_scores_output(key):
    layer = _layer(key, has_padding_mask_input=True, has_scores_output=True)
    assert (layer.input_names, layer.output_names) == (("in", "mask"), ("out", "scores"))
    x = _randn((2, T, C), seed=6)
    valid = jnp.arange(T)[None, :] < jnp.array([[T], [3]])
    mask = df.dlarray(jnp.broadcast_to(valid[:, :, None], (2, T, C)).astype(jnp.float32), "BTC")
    y, scores = layer(df.dlarray(x, "BTC"), mask)
    flax_mask = nnx.make_attention_mask(jnp.ones((2, T)), valid)
    np.testing.assert_allclose(y.data, nnx_reference(layer, x, flax_mask), rtol=1e-5, atol=1e-5)
    assert (scores.format, scores.shape) == ("BCUU", (2, HEADS, T, T))
    np.testing.assert_allclose(scores.data.sum(-1), 1.0, rtol=1e-5)
    assert float(jnp.abs(scores.data[1, :, :, 3:]).max()) == 0.0  # padded keys get no attention


def test_value_channels_output_size_and_axis_order(key):
    layer = L.SelfAttention(HEADS, 4, num_value_channels=10, output_size=3)
    layer = layer.initialize(df.Layout((None, C, None), "BCT"), key=key)
    assert layer.value_weights.shape == (C, 10) and layer.output_weights.shape == (10, 3)
    x = _randn((2, T, C), seed=7)
    y = layer(df.dlarray(jnp.swapaxes(x, 1, 2), "BCT"))
    assert (y.format, y.shape) == ("BCT", (2, 3, T))
    q, k, v = (x @ getattr(layer, f"{n}_weights") + getattr(layer, f"{n}_bias")[None, None]
               for n in ("query", "key", "value"))  # fmt: skip
    a = df.ops.attention(q, k, v, HEADS, fmt="BTC")
    expected = a @ layer.output_weights + layer.output_bias[None, None]
    np.testing.assert_allclose(jnp.swapaxes(y.data, 1, 2), expected, rtol=1e-5, atol=1e-6)


def test_spatial_input_plain_input_and_attention_mask_array(key):
    allowed = jnp.tril(jnp.ones((T, T)))
    layer = _layer(key, attention_mask=allowed)
    causal = layer.replace(attention_mask="causal")
    x = _randn((2, T, C), seed=8)
    np.testing.assert_allclose(layer(x), causal(x), rtol=1e-6)  # plain: (batch, time, channels)
    y = layer(df.dlarray(x, "BSC"))
    assert y.format == "BSC"
    np.testing.assert_allclose(y.data, causal(x), rtol=1e-6)


def test_training_dropout_needs_a_key_and_predict_never_drops(key):
    layer = _layer(key, dropout_probability=0.5, has_scores_output=True)
    x = df.dlarray(_randn((2, T, C), seed=9), "BTC")
    (_, scores), _ = call_layer(layer, (x,), training=True, key=jax.random.key(1))
    assert 0.3 < float((scores.data == 0).mean()) < 0.7
    predicted = layer(x)[1]
    assert float((predicted.data == 0).mean()) == 0.0
    with pytest.raises(df.LayerError, match=r"SelfAttention \(layer 'attn'\): training-time "
                       r"dropout \(dropout_probability=0\.5\) needs randomness"):  # fmt: skip
        call_layer(layer, (x,), training=True)


def test_check_layer_with_mask_input_and_scores_output():
    layer = L.SelfAttention(2, 4, has_padding_mask_input=True, has_scores_output=True)
    layout = df.Layout((None, 4, 3), "BTC")
    report = df.check_layer(layer, layout, layout)
    assert report.ok, str(report)


def test_gradients_float64_match_finite_differences(x64, key):
    layer = jax.tree.map(lambda a: a.astype(jnp.float64), _layer(key, attention_mask="causal"))
    x = _randn((2, 4, C), seed=10, dtype=jnp.float64)

    def loss(x, wq, wv, bo):
        changed = layer.replace(query_weights=wq, value_weights=wv, output_bias=bo)
        return jnp.sum(jnp.sin(changed(df.dlarray(x, "BTC")).data))

    args = (x, layer.query_weights, layer.value_weights, layer.output_bias)
    check_grads(jax.jit(loss), args, order=1, modes=("rev",), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_jit_matches_eager(key):
    layer = _layer(key, attention_mask="causal")
    x = df.dlarray(_randn((2, T, C), seed=11), "TBC")
    assert_tree_allclose(jax.jit(lambda l, x: l(x))(layer, x), layer(x), rtol=1e-6, atol=1e-6)


def test_factor_options():
    layer = L.SelfAttention(2, 4, weight_learn_rate_factor=0.5, bias_l2_factor=1)
    assert df.get_learn_rate_factor(layer, "output_weights") == 0.5
    assert df.get_learn_rate_factor(layer, "query_bias") == 1.0
    assert df.get_l2_factor(layer, "key_bias") == 1.0
    assert df.get_l2_factor(L.SelfAttention(2, 4), "key_bias") == 0.0


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.SelfAttention(0, 8), r"SelfAttention \(layer ''\): num_heads must be a positive"),
        (lambda: L.SelfAttention(3, 8), r"num_key_channels must be a multiple of num_heads=3"),
        (lambda: L.SelfAttention(2, 8, num_value_channels=5), r"num_value_channels must be a "
                                                               r"multiple of num_heads=2"),
        (lambda: L.SelfAttention(2, 8, output_size=0), r"output_size must be a positive int"),
        (lambda: L.SelfAttention(2, 8, attention_mask="future"), r"attention_mask must be one of"),
        (lambda: L.SelfAttention(2, 8, attention_mask=jnp.ones(3)), r"attention_mask must be "
                                                                    r"'none', 'causal' or a 2-D"),
        (lambda: L.SelfAttention(2, 8, dropout_probability=1), r"dropout_probability must be a "
                                                                r"number in \[0, 1\)"),
        (lambda: L.SelfAttention(2, 8, has_scores_output=1), r"has_scores_output must be True"),
        (lambda: L.SelfAttention(2, 8, key_weights_initializer="unit"), r"key_weights_initiali"),
        (lambda: L.SelfAttention(2, 8, query_weights=jnp.ones((3, 4))), r"query_weights must be "
                                                                        r"an array of shape"),
    ],
)  # fmt: skip
def test_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_format_errors(key):
    layer = L.SelfAttention(2, 4, name="sa")
    with pytest.raises(
        df.FormatError,
        match=r"SelfAttention \(layer 'sa'\)\.initialize: the "
        r"input layout .* format 'BC'; expected a 'C' axis, one 'T' or one 'S'",
    ):
        layer.initialize(df.Layout((None, 4), "BC"), key=key)  # fmt: skip
    with pytest.raises(df.FormatError, match=r"format 'BSSC'"):
        layer.initialize(df.Layout((None, 4, 4, 3), "BSSC"), key=key)
    ready = layer.initialize(df.Layout((None, None, 3), "BTC"), key=key)
    with pytest.raises(df.FormatError, match=r"attends over one sequence or spatial axis.*"
                       r"got format 'BSSC'"):  # fmt: skip
        ready(df.dlarray(jnp.ones((1, 2, 2, 3)), "BSSC"))
    with pytest.raises(df.LayerError, match=r"the input has 5 channels but query_weights"):
        ready(jnp.ones((2, 3, 5)))
    masked = L.SelfAttention(2, 4, has_padding_mask_input=True, name="sa")
    with pytest.raises(df.FormatError, match=r"the 'mask' input's layout .* must have the "):
        masked.initialize(df.Layout((None, None, 3), "BTC"), df.Layout((None, 3), "BC"), key=key)
    ready = masked.initialize(*(df.Layout((None, None, 3), "BTC"),) * 2, key=key)
    x = df.dlarray(jnp.ones((2, 4, 3)), "BTC")
    with pytest.raises(df.FormatError, match=r"the 'mask' input has format 'TBC' but the input"):
        ready(x, df.permute(x, "TBC"))
    with pytest.raises(df.LayerError, match=r"SelfAttention \(layer 'sa'\): df\.ops\.attention: "
                       r"padding_mask has \(batch, steps\) = \(2, 2\)"):  # fmt: skip
        ready(x, x[:, :2])
