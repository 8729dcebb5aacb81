"""Tests of difffn/layers/_embedding.py: Embedding (against nnx.Embed) and the position layers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import difffn as df
from difffn._layer._layer import call_layer

L = df.layers
WORDS, DIM = 10, 4


def _embedding(key, **options):
    layer = L.Embedding(DIM, WORDS, name="emb", **options)
    return layer.initialize(df.Layout((None, None, 1), "BTC"), key=key)


def test_embedding_matches_nnx_embed(key):
    layer = _embedding(key)
    module = nnx.Embed(WORDS, DIM, rngs=nnx.Rngs(0))
    module.embedding[...] = layer.weights
    idx = jnp.asarray(np.random.default_rng(0).integers(0, WORDS, (3, 6)))
    y = layer(df.dlarray(idx[:, :, None].astype(jnp.float32), "BTC"))  # as SequenceInput gives
    assert (y.format, y.shape) == ("BTC", (3, 6, DIM))
    np.testing.assert_array_equal(y.data, module(idx))
    np.testing.assert_array_equal(layer(idx), module(idx))  # plain (batch, time)
    assert layer(df.dlarray(idx, "BT")).format == "BTC"


def test_out_of_vocabulary_modes(key):
    layer = _embedding(key)
    y = layer(df.dlarray(jnp.array([[3, 10, -2, 57]]), "BT"))
    last = layer.weights[WORDS - 1]
    np.testing.assert_array_equal(y.data[0, 1:], jnp.stack([last] * 3))
    strict = layer.replace(oov_mode="error")
    with pytest.raises(df.OpError, match=r"Embedding \(layer 'emb'\): df\.ops\.embed: 1 index"):
        strict(df.dlarray(jnp.array([[3, 10]]), "BT"))
    traced = jax.jit(lambda l, x: l(x))(strict, df.dlarray(jnp.array([[3, 10]]), "BT"))
    assert bool(jnp.isnan(traced.data[0, 1]).all())


def test_embedding_gradient_reaches_only_the_used_rows(key):
    layer = _embedding(key)
    idx = df.dlarray(jnp.array([[1, 4, 1]]), "BT")

    def loss(layer):
        (y,), _ = call_layer(layer, (idx,), training=True)
        return jnp.sum(y.data)

    grad = jax.grad(loss)(layer).weights
    np.testing.assert_array_equal(grad[1], 2.0)
    np.testing.assert_array_equal(grad[4], 1.0)
    assert float(jnp.abs(grad).sum()) == 3 * DIM


def test_position_embedding_is_the_first_rows_broadcast(key):
    layer = L.PositionEmbedding(5, 8).initialize(df.Layout((None, None, 3), "BTC"), key=key)
    x = df.dlarray(jnp.zeros((2, 6, 3)), "BTC")
    y = layer(x)
    assert (y.format, y.shape) == ("BTC", (2, 6, 5))
    np.testing.assert_array_equal(y.data, jnp.broadcast_to(layer.weights[:6], (2, 6, 5)))
    channels_first = layer(df.permute(x, "CTB"))
    assert channels_first.format == "CTB"
    np.testing.assert_array_equal(df.permute(channels_first, "BTC").data, y.data)
    image = layer(df.dlarray(jnp.zeros((2, 4, 3)), "BSC"))  # 1-D images: the S positions
    np.testing.assert_array_equal(image.data[1], layer.weights[:4])


def test_position_embedding_trains_and_rejects_long_sequences(key):
    layer = L.PositionEmbedding(5, 4, name="pos")
    layer = layer.initialize(df.Layout((None, None, 3), "BTC"), key=key)
    grad = jax.grad(lambda l: jnp.sum(l(jnp.zeros((2, 3, 3))) ** 2))(layer).weights
    np.testing.assert_allclose(grad[:3], 4 * layer.weights[:3], rtol=1e-6)
    np.testing.assert_array_equal(grad[3], 0.0)
    with pytest.raises(df.LayerError, match=r"PositionEmbedding \(layer 'pos'\): the input has 6 "
                       r"positions along 'T' but max_position is 4"):  # fmt: skip
        layer(jnp.zeros((1, 6, 3)))
    with pytest.raises(df.FormatError, match=r"position_dimension='temporal' it needs a 'T'"):
        L.PositionEmbedding(5, 4, position_dimension="temporal").initialize(
            df.Layout((None, 4, 3), "BSC"), key=key
        )


def _sinusoid(positions, d):
    """The encoding of "Attention is all you need" (section 3.5), in numpy float64."""
    pe = np.zeros((len(positions), d))
    for p, pos in enumerate(positions):
        for i in range(0, d, 2):
            pe[p, i] = np.sin(pos / 10000 ** (i / d))
            pe[p, i + 1] = np.cos(pos / 10000 ** (i / d))
    return pe


def test_sinusoidal_encoding_of_indices_and_of_values():
    layer = L.SinusoidalPositionEncoding(6)
    y = layer(df.dlarray(jnp.zeros((2, 7, 3)), "BTC"))
    assert (y.format, y.shape) == ("BTC", (2, 7, 6))
    np.testing.assert_allclose(y.data[1], _sinusoid(range(7), 6), rtol=1e-5, atol=1e-6)
    values = jnp.array([[0.5], [3.0], [11.0]])
    by_value = L.SinusoidalPositionEncoding(6, positions="data-values")(df.dlarray(values, "BC"))
    np.testing.assert_allclose(by_value.data, _sinusoid([0.5, 3.0, 11.0], 6), rtol=1e-5, atol=1e-6)
    auto = layer(df.dlarray(values, "BC"))  # no T or S: "auto" encodes the values
    np.testing.assert_array_equal(auto.data, by_value.data)
    spatial = L.SinusoidalPositionEncoding(6, positions="spatial-indices")
    np.testing.assert_allclose(spatial(df.dlarray(jnp.zeros((1, 4, 2)), "BSC")).data[0],
                               _sinusoid(range(4), 6), rtol=1e-5, atol=1e-6)  # fmt: skip


@pytest.mark.parametrize(
    ("layer", "layout"),
    [
        (L.Embedding(3, 5), df.Layout((None, 4, 1), "BTC")),
        (L.PositionEmbedding(3, 6), df.Layout((4, None, 2), "TBC")),
        (L.SinusoidalPositionEncoding(4, positions="data-values"), df.Layout((None, 1), "BC")),
    ],
    ids=["Embedding", "PositionEmbedding", "SinusoidalPositionEncoding"],
)
def test_check_layer_passes(layer, layout):
    report = df.check_layer(layer, layout)
    assert report.ok, str(report)


def test_factor_options():
    layer = L.Embedding(3, 5, weight_learn_rate_factor=0, weight_l2_factor=2)
    assert df.get_learn_rate_factor(layer, "weights") == 0.0
    assert df.get_l2_factor(layer, "weights") == 2.0
    assert df.get_l2_factor(L.PositionEmbedding(3, 5), "weights") == 1.0


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.Embedding(0, 5), r"Embedding \(layer ''\): dimension must be a positive int"),
        (lambda: L.Embedding(3, 5, oov_mode="zero"), r"oov_mode must be one of 'map-to-last'"),
        (lambda: L.Embedding(3, 5, weights=jnp.ones((3, 5))), r"weights must be an array of "
                                                              r"shape \(5, 3\)"),
        (lambda: L.Embedding(3, 5, weights_initializer="unit"), r"weights_initializer must be"),
        (lambda: L.PositionEmbedding(3, 0), r"max_position must be a positive int"),
        (lambda: L.PositionEmbedding(3, 4, position_dimension="time"), r"position_dimension "
                                                                        r"must be one of"),
        (lambda: L.SinusoidalPositionEncoding(5), r"output_size must be an even positive int"),
        (lambda: L.SinusoidalPositionEncoding(4, positions="all"), r"positions must be one of"),
        (lambda: L.Embedding(3, 5, weight_learn_rate_factor=-1), r"weight_learn_rate_factor "
                                                                 r"must be a non-negative"),
    ],
)  # fmt: skip
def test_bad_arguments(make, match):
    with pytest.raises(df.LayerError, match=match):
        make()


def test_format_errors(key):
    with pytest.raises(df.FormatError, match=r"Embedding \(layer ''\)\.initialize: .* format "
                       r"'BTC'; expected word indices: no 'C' axis, or one of size 1"):  # fmt: skip
        L.Embedding(3, 5).initialize(df.Layout((None, 4, 2), "BTC"), key=key)
    with pytest.raises(df.FormatError, match=r"takes plain indices as \(batch, time\)"):
        _embedding(key)(jnp.zeros(3))
    with pytest.raises(df.FormatError, match=r"PositionEmbedding .* format 'BSSC'; with "
                       r"position_dimension='auto' it needs a 'C' axis and a 'T' axis"):  # fmt: skip
        L.PositionEmbedding(3, 6).initialize(df.Layout((None, 4, 4, 2), "BSSC"), key=key)
    with pytest.raises(df.FormatError, match=r"position values need a 'C' axis of size 1"):
        L.SinusoidalPositionEncoding(4)(df.dlarray(jnp.zeros((2, 3)), "BC"))
    with pytest.raises(df.FormatError, match=r"positions='temporal-indices' needs a 'T'"):
        L.SinusoidalPositionEncoding(4, positions="temporal-indices")(
            df.dlarray(jnp.zeros((2, 4, 3)), "BSC")
        )
