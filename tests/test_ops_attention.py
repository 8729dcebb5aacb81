"""Tests of difffn/ops/_attention.py: df.ops.attention against flax.nnx's dot_product_attention."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.nnx.nn.attention import dot_product_attention_weights
from helpers import assert_tree_allclose
from jax.test_util import check_grads

import difffn as df

B, TQ, TK, N = 2, 5, 7, 2


def _randn(shape, *, seed=0, dtype=jnp.float32):
    """Test data from numpy: no JAX compilation per shape, unlike jax.random."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _qkv(d_key=8, d_value=8, dtype=jnp.float32, tk=TK):
    return (
        _randn((B, TQ, d_key), seed=1, dtype=dtype),
        _randn((B, tk, d_key), seed=2, dtype=dtype),
        _randn((B, tk, d_value), seed=3, dtype=dtype),
    )


def flax_attention(q, k, v, mask=None):
    """flax.nnx.dot_product_attention on (batch, steps, channels), heads split contiguously."""
    split = lambda a: a.reshape(*a.shape[:2], N, -1)  # noqa: E731
    weights = dot_product_attention_weights(split(q), split(k), mask=mask)
    if v.shape[-1] == q.shape[-1]:
        y = nnx.dot_product_attention(split(q), split(k), split(v), mask=mask)
    else:  # flax's dot_product_attention hands equal widths to JAX's, which needs them equal
        y = jnp.einsum("...hqk,...khd->...qhd", weights, split(v))
    return y.reshape(*y.shape[:2], -1), weights


def _padding(valid_steps):
    return (jnp.arange(TK)[None, :] < jnp.asarray(valid_steps)[:, None]).astype(jnp.float32)


@pytest.mark.parametrize("return_weights", [False, True], ids=["output", "with-weights"])
@pytest.mark.parametrize("masks", ["none", "causal", "padding", "both"])
def test_matches_flax(masks, return_weights):
    q, k, v = _qkv(tk=TQ if masks in ("causal", "both") else TK)
    tk = k.shape[1]
    flax_mask, options = None, {}
    if masks in ("causal", "both"):
        options["attention_mask"] = "causal"
        flax_mask = nnx.make_causal_mask(jnp.ones((B, TQ)))
    if masks in ("padding", "both"):
        valid = jnp.arange(tk)[None, :] < jnp.array([[tk], [3]])
        options["padding_mask"] = df.dlarray(valid[:, :, None].astype(jnp.float32), "BTC")
        pad = nnx.make_attention_mask(jnp.ones((B, TQ)), valid)
        flax_mask = pad if flax_mask is None else nnx.combine_masks(flax_mask, pad)
    result = df.ops.attention(
        *(df.dlarray(a, "BTC") for a in (q, k, v)), N, return_weights=return_weights, **options
    )
    y_ref, w_ref = flax_attention(q, k, v, flax_mask)
    if return_weights:
        y, weights = result
        np.testing.assert_allclose(weights, w_ref, rtol=1e-5, atol=1e-6)
    else:
        y = result
    assert (y.format, y.shape) == ("BTC", (B, TQ, 8))
    np.testing.assert_allclose(y.data, y_ref, rtol=1e-5, atol=1e-6)


def test_values_wider_than_keys_and_cross_attention():
    q, k, v = _qkv(d_key=6, d_value=10)
    y = df.ops.attention(q, k, v, N, fmt="BTC")
    np.testing.assert_allclose(y, flax_attention(q, k, v)[0], rtol=1e-5, atol=1e-6)
    assert y.shape == (B, TQ, 10)


def test_scale_and_attention_mask_array():
    q, k, v = _qkv()
    allowed = _randn((TQ, TK), seed=4) > 0
    allowed = allowed.at[:, 0].set(True)
    y = df.ops.attention(q, k, v, N, fmt="BTC", scale=0.3, attention_mask=allowed)
    # flax scales by 1/sqrt(depth): pre-scale the queries to get 0.3 overall
    y_ref, _ = flax_attention(q * 0.3 * np.sqrt(8 // N), k, v, allowed[None, None])
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    per_batch = jnp.stack([allowed, jnp.ones_like(allowed)])
    y2 = df.ops.attention(q, k, v, N, fmt="BTC", attention_mask=per_batch)
    np.testing.assert_allclose(y2[1], df.ops.attention(q, k, v, N, fmt="BTC")[1], rtol=1e-6)


def test_fully_masked_queries_attend_uniformly():
    q, k, v = _qkv()
    mask = jnp.zeros((B, TK, 1)).at[0].set(1.0)  # the second sequence is all padding
    fused = df.ops.attention(q, k, v, N, fmt="BTC", padding_mask=mask)
    written, weights = df.ops.attention(
        q, k, v, N, fmt="BTC", padding_mask=mask, return_weights=True
    )
    np.testing.assert_allclose(weights[1], 1.0 / TK, rtol=1e-6)
    np.testing.assert_allclose(fused, written, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(fused[1], jnp.broadcast_to(v[1].mean(0), (TQ, 8)), rtol=1e-5)


def test_dropout_drops_and_rescales_the_weights():
    q, k, v = _qkv()
    key = jax.random.key(3)
    p = 0.4
    y, dropped = df.ops.attention(
        q, k, v, N, fmt="BTC", dropout_probability=p, key=key, return_weights=True
    )
    _, weights = df.ops.attention(q, k, v, N, fmt="BTC", return_weights=True)
    kept = dropped != 0
    assert 0.25 < 1 - float(kept.mean()) < 0.55
    np.testing.assert_allclose(dropped[kept], (weights / (1 - p))[kept], rtol=1e-6)
    split_v = v.reshape(B, TK, N, -1)
    expected = jnp.einsum("bnts,bsnh->btnh", dropped, split_v).reshape(B, TQ, -1)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    again = df.ops.attention(q, k, v, N, fmt="BTC", dropout_probability=p, key=key)
    np.testing.assert_array_equal(again, y)


@pytest.mark.parametrize("fmt", ["CBT", "TCB", "BSC"])
def test_axis_orders_and_spatial_sequences(fmt):
    q, k, v = _qkv()
    base = df.ops.attention(q, k, v, N, fmt="BTC")
    labels = fmt.replace("S", "T")
    order = ["BTC".index(a) for a in labels]
    moved = [df.dlarray(jnp.transpose(a, order), fmt) for a in (q, k, v)]
    y = df.ops.attention(*moved, N)
    assert y.format == fmt
    np.testing.assert_allclose(jnp.transpose(y.data, np.argsort(order)), base, rtol=1e-5)


def test_unbatched_plain_keys_and_weights_without_batch():
    q, k, v = _qkv()
    y, weights = df.ops.attention(df.dlarray(q[0], "TC"), k[0], v[0], N, return_weights=True)
    base, base_weights = df.ops.attention(q, k, v, N, fmt="BTC", return_weights=True)
    assert (y.format, weights.shape) == ("TC", (N, TQ, TK))
    assert_tree_allclose((y.data, weights), (base[0], base_weights[0]), rtol=1e-5, atol=1e-6)


def test_jit_vmap_and_gradients_with_and_without_weights():
    q, k, v = _qkv()
    attend = lambda q, k, v: df.ops.attention(q, k, v, N, fmt="TC", attention_mask="causal")  # noqa: E731
    q, k, v = (a[:, :TQ] for a in (q, k, v))
    batched = jax.jit(jax.vmap(attend))(q, k, v)
    np.testing.assert_allclose(
        batched, df.ops.attention(q, k, v, N, fmt="BTC", attention_mask="causal"), rtol=1e-6
    )

    def loss(q, k, v, weights):
        out = df.ops.attention(q, k, v, N, fmt="BTC", return_weights=weights)
        y = out[0] if weights else out
        return jnp.sum(jnp.sin(y))

    without = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)(q, k, v, False)
    with_weights = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)(q, k, v, True)
    assert_tree_allclose(without, with_weights, rtol=1e-4, atol=1e-5)


def _split(a):
    return a.reshape(*a.shape[:2], N, -1)


@pytest.mark.parametrize("masks", ["none", "causal", "padding"])
def test_float32_values_and_gradients_match_jax_dot_product_attention(masks):
    """The head-major float32 path (queries scaled, not scores) against JAX's own attention."""
    q, k, v = _qkv(tk=TQ)
    padding = (jnp.arange(TQ)[None, :] < jnp.asarray([TQ, 3])[:, None])[:, None, None, :]
    mask = padding if masks == "padding" else None
    causal = masks == "causal"

    def ours(q, k, v):
        kwargs = {"attention_mask": "causal"} if causal else {}
        if mask is not None:
            kwargs["padding_mask"] = (jnp.arange(TQ)[None, :] < jnp.asarray([TQ, 3])[:, None])[
                :, :, None
            ].astype(jnp.float32)
        return df.ops.attention(q, k, v, N, fmt="BTC", **kwargs)

    def theirs(q, k, v):
        y = jax.nn.dot_product_attention(
            _split(q), _split(k), _split(v), mask=mask, is_causal=causal
        )
        return y.reshape(*y.shape[:2], -1)

    np.testing.assert_allclose(ours(q, k, v), theirs(q, k, v), rtol=1e-5, atol=1e-6)
    cotangent = _randn(q.shape[:2] + (v.shape[2],), seed=9)
    grads = [
        jax.jit(jax.grad(lambda q, k, v, f=f: jnp.vdot(f(q, k, v), cotangent), argnums=(0, 1, 2)))(
            q, k, v
        )
        for f in (ours, theirs)
    ]
    assert_tree_allclose(grads[0], grads[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("masks", ["causal", "padding", "all padding"])
def test_bfloat16_path_agrees_with_float32_values_and_gradients(masks):
    """Below float32, JAX's own attention runs (scores in float32): values and gradients agree
    with the float32 path to bfloat16 rounding, fully masked queries included."""
    q, k, v = _qkv(tk=TQ)
    valid = [TQ, 0] if masks == "all padding" else [TQ, 3]
    kwargs = {"attention_mask": "causal"} if masks == "causal" else {}
    if masks != "causal":
        kwargs["padding_mask"] = (jnp.arange(TQ)[None, :] < jnp.asarray(valid)[:, None])[
            :, :, None
        ].astype(jnp.float32)

    def loss(q, k, v):
        y = df.ops.attention(q, k, v, N, fmt="BTC", **kwargs)
        return jnp.sum(jnp.sin(y.astype(jnp.float32))), y

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))
    (g16, y16), (g32, y32) = (
        grad(*(a.astype(dtype) for a in (q, k, v))) for dtype in (jnp.bfloat16, jnp.float32)
    )
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float32), y32, rtol=0.05, atol=0.05)
    for a, b in zip(g16, g32):
        np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=0.1, atol=0.1)
    if masks == "all padding":
        np.testing.assert_allclose(
            np.asarray(y16[1], np.float32), np.broadcast_to(np.asarray(v[1]).mean(0), (TQ, 8)),
            rtol=0.05, atol=0.05,
        )  # fmt: skip


def test_gradients_float64_match_finite_differences(x64):
    q, k, v = _qkv(d_key=4, d_value=6, dtype=jnp.float64)
    mask = _padding([TK, 4])[:, :, None]

    def f(q, k, v):
        y = df.ops.attention(q, k, v, N, fmt="BTC", padding_mask=mask)
        return jnp.sum(jnp.sin(y))

    assert df.ops.attention(q, k, v, N, fmt="BTC").dtype == jnp.float64
    check_grads(jax.jit(f), (q, k, v), order=1, modes=("rev",), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_formatted_gradients():
    q, k, v = (df.dlarray(a, "BTC") for a in _qkv())
    grads = jax.grad(lambda q: jnp.sum(df.ops.attention(q, k, v, N).data))(q)
    assert (grads.format, grads.shape) == ("BTC", q.shape)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda q, k, v: df.ops.attention(q, k, v, N), df.FormatError,
         r"df\.ops\.attention: queries is a plain array .* without a format"),
        (lambda q, k, v: df.ops.attention(q, k, v, N, fmt="BCU"), df.FormatError,
         r"input format 'BCU' does not fit; expected a 'C' axis, exactly one 'T' or one 'S'"),
        (lambda q, k, v: df.ops.attention(
            df.dlarray(q, "BTC"), df.dlarray(k, "TBC"), v, N), df.FormatError,
         r"keys has format 'TBC' but the first input has 'BTC'"),
        (lambda q, k, v: df.ops.attention(q, k, v, 3, fmt="BTC"), df.OpError,
         r"num_heads=3 does not divide the 8 channels of the queries and keys"),
        (lambda q, k, v: df.ops.attention(q, k[..., :4], v, N, fmt="BTC"), df.OpError,
         r"keys have 4 channels but queries have 8"),
        (lambda q, k, v: df.ops.attention(q, k, v[:, :3], N, fmt="BTC"), df.OpError,
         r"values have 3 steps but keys have 7"),
        (lambda q, k, v: df.ops.attention(q, k, v, N, fmt="BTC", attention_mask="future"),
         df.OpError, r"attention_mask must be 'none', 'causal' or an array"),
        (lambda q, k, v: df.ops.attention(q, k, v, N, fmt="BTC", attention_mask=jnp.ones((7, 5))),
         df.OpError, r"attention_mask has shape \(7, 5\); expected \(num_queries, num_keys\)"),
        (lambda q, k, v: df.ops.attention(q, k, v, N, fmt="BTC", padding_mask=jnp.ones((2, 5, 1))),
         df.OpError, r"padding_mask has \(batch, steps\) = \(2, 5\) but the keys have \(2, 7\)"),
        (lambda q, k, v: df.ops.attention(q, k, v, N, fmt="BTC", dropout_probability=0.1),
         df.OpError, r"dropout_probability=0\.1 needs randomness, but key is None"),
        (lambda q, k, v: df.ops.attention(q, k, v, N, fmt="BTC", scale="sqrt"), df.OpError,
         r"scale must be 'auto' or a number; got 'sqrt'"),
    ],
)  # fmt: skip
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(*_qkv())
