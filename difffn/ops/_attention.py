r"""``df.ops.attention``: MATLAB's ``attention`` function (multi-head scaled dot-product).

Float32 and float64 attention runs the computation written out here, heads-major (``einsum``,
mask, softmax, ``einsum``): on XLA:CPU it is faster than ``jax.nn.dot_product_attention``
(issue 29), it can drop and return attention weights and take values wider than keys, and it
keeps float64 in float64 (JAX's op computes the softmax in float32, which would spoil float64
gradient checks). Below single precision, without dropout or weights and with values as wide as
keys, it goes to ``jax.nn.dot_product_attention``, which keeps the scores in float32. Masked
logits take JAX's value (``-0.7`` times the largest float32), so both paths agree, also for a
query whose keys are all masked (it attends uniformly).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from .._core import Data, OpError, Output
from ._common import softmax_along
from ._format_args import float_dtype, label, read, read_like, require

_FORMAT = (
    "a 'C' axis, exactly one 'T' or one 'S' axis (the sequence) and optionally 'B', in any "
    "order (e.g. 'BTC', 'CBT', 'BSC')"
)


def is_attention_format(fmt: str) -> bool:
    """One ``C``, exactly one ``T`` or ``S``, and otherwise at most one ``B``."""
    return fmt.count("C") == 1 and fmt.count("T") + fmt.count("S") == 1 and set(fmt) <= set("BCTS")


def attention(
    queries: Data,
    keys: Data,
    values: Data,
    num_heads: int,
    *,
    fmt: str | None = None,
    scale: Data | str = "auto",
    padding_mask: jax.Array | None = None,
    attention_mask: jax.Array | str = "none",
    dropout_probability: float = 0.0,
    key: jax.Array | None = None,
    return_weights: bool = False,
) -> Output:
    r"""Multi-head scaled dot-product attention (MATLAB's ``attention`` function).

    The channels of the queries, keys and values are split into ``num_heads`` contiguous
    blocks; per head, $Y = \mathrm{softmax}(s\,Q K^\top + M)\,V$ over the keys
    ($M$: 0 where attention is allowed, a large negative number where a mask forbids it),
    and the heads' results are concatenated along ``C``.

    Args:
      queries: a ``C`` axis, exactly one ``T`` or ``S`` axis and optionally ``B`` (``"BTC"``,
        ``"CBT"``, ``"BSC"``, ...); a plain array needs ``fmt``.
      keys: the queries' format (a plain array is read in it); the same ``B`` size and number
        of channels as ``queries``; any sequence length.
      values: the keys' sequence length; any number of channels divisible by ``num_heads``.
      num_heads: the number of heads; it divides the channels of queries and values.
      fmt: the format of plain ``queries`` (and of plain keys, values and padding mask).
      scale: ``"auto"`` (default: $1/\sqrt{d}$ with ``d`` the key channels per head) or
        a number.
      padding_mask: ``None`` (default) or an array in the keys' format and sizes (any number of
        channels; only the first is used): a query attends to a key step only where it is
        nonzero (MATLAB's ``PaddingMask``).
      attention_mask: ``"none"`` (default), ``"causal"`` (query step ``i`` attends to key steps
        ``j <= i``) or a boolean/0-1 array ``(num_queries, num_keys)`` or
        ``(batch, num_queries, num_keys)``, nonzero where attention is allowed (MATLAB's
        ``AttentionMask``, stored queries-first: MATLAB's is keys-first).
      dropout_probability: the probability of dropping each attention weight, in [0, 1)
        (default 0); kept weights are scaled by ``1 / (1 - p)``. Needs ``key``.
      key: a ``jax.random`` key for the dropout.
      return_weights: also return the attention weights (MATLAB's second output).

    Returns:
      ``y``: the queries' format with the values' channels; with ``return_weights``,
      ``(y, weights)`` where ``weights`` is a plain ``(batch, num_heads, num_queries,
      num_keys)`` array (without ``B`` in the format: ``(num_heads, num_queries, num_keys)``;
      MATLAB's is ``keys x queries x heads x batch``), after dropout.

    Raises:
      FormatError: ``queries`` has no format or one without a single ``T``/``S`` axis, or
        keys, values or the padding mask do not match it.
      OpError: sizes that do not fit (channels, batch, sequence lengths, ``num_heads``, mask
        shapes) or a bad option.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> q = df.dlarray(jax.random.normal(jax.random.key(0), (2, 5, 8)), "BTC")
      >>> y = df.ops.attention(q, q, q, 2, attention_mask="causal")
      >>> y.format, y.shape
      ('BTC', (2, 5, 8))
      >>> y, w = df.ops.attention(q, q, q, 2, return_weights=True)
      >>> w.shape, bool(jnp.allclose(w.sum(-1), 1.0))
      ((2, 2, 5, 5), True)
    """
    q_data, fmt, formatted = read("attention", queries, fmt, argument="queries")
    require("attention", fmt, is_attention_format, _FORMAT)
    k_data = read_like("attention", "keys", keys, fmt)
    v_data = read_like("attention", "values", values, fmt)
    q, k, v = (to_blc(a, fmt) for a in (q_data, k_data, v_data))
    heads = _check_sizes(q, k, v, num_heads)
    d_key, d_value = q.shape[2] // heads, v.shape[2] // heads
    scale = _scale(scale, d_key)
    mask = combined_mask(padding_mask, attention_mask, fmt, q.shape, k.shape)
    p = _probability(dropout_probability, key)
    dtype = float_dtype(q, k, v)
    batch, n_q, n_k = q.shape[0], q.shape[1], k.shape[1]
    q = q.astype(dtype).reshape(batch, n_q, heads, d_key)
    k = k.astype(dtype).reshape(batch, n_k, heads, d_key)
    v = v.astype(dtype).reshape(batch, n_k, heads, d_value)
    causal = isinstance(attention_mask, str) and attention_mask == "causal"
    y, weights = multi_head(
        q, k, v, mask=mask, causal=causal, scale=scale, probability=p, key=key,
        return_weights=return_weights,
    )  # fmt: skip
    y = from_blc(y.reshape(batch, n_q, heads * d_value), fmt)
    y = label(y, fmt, formatted)
    if not return_weights:
        return y
    assert weights is not None  # multi_head returns them when asked
    return y, (weights if "B" in fmt else weights[0])


def multi_head(q, k, v, *, mask, causal, scale, probability, key, return_weights):
    """Attention on split heads: ``(B, Lq, N, dk)``, ``(B, Lk, N, dk)``, ``(B, Lk, N, dv)``.

    The computation itself, after [`attention`][difffn.ops.attention]'s checks (``SelfAttention``
    projects
    straight into heads and calls it too). ``mask`` is boolean, broadcastable to
    ``(B, N, Lq, Lk)``, or ``None``. Returns ``(y, weights)``, ``weights`` ``None`` when not
    asked for and the fused path ran.

    Float32 and float64 attention is written out head-major (below); bfloat16 and float16
    without dropout or weights take ``jax.nn.dot_product_attention``, which keeps their scores
    in float32.
    """
    n_q, n_k = q.shape[1], k.shape[1]
    fused = (
        not return_weights
        and probability == 0
        and q.shape[3] == v.shape[3]
        and jnp.finfo(q.dtype).bits < 32
    )
    if fused:
        y = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=causal)
        return y, None
    if causal:
        tril = jnp.tril(jnp.ones((n_q, n_k), bool))[None, None]
        mask = tril if mask is None else jnp.logical_and(mask, tril)
    return _attend(q, k, v, mask, scale, probability, key)


def _attend(q, k, v, mask, scale, p, key):
    """Attention weights and output, written out in the heads-major layout ``(B, N, L, d)``.

    Issue 29 measured this against ``jax.nn.dot_product_attention`` (which multiplies
    ``(B, L, N, d)`` arrays as they come) on XLA:CPU, forward and backward at the benchmark
    transformer's sizes: one transpose less and 1.15-1.25x faster. In float32 the queries are
    scaled rather than the scores: a ``(B, Lq, N, dk)`` array is ``Lk / dk`` times smaller, and
    XLA:CPU writes out a score-sized array of the scale to multiply the scores by.
    """
    logits_dtype = jnp.promote_types(q.dtype, jnp.float32)
    if q.dtype == jnp.float32:
        q, scale = q * jnp.asarray(scale, q.dtype), 1.0
    qh, kh, vh = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))
    logits = jnp.einsum("bnth,bnsh->bnts", qh, kh, preferred_element_type=logits_dtype)
    if scale != 1.0:
        logits = logits * jnp.asarray(scale, logits_dtype)
    if mask is not None:
        large = min(float(jnp.finfo(logits_dtype).max), float(jnp.finfo(jnp.float32).max))
        logits = jnp.where(mask, logits, jnp.asarray(-0.7 * large, logits_dtype))
    weights = softmax_along(logits, -1).astype(q.dtype)
    if p > 0:
        keep = jax.random.bernoulli(key, 1.0 - p, weights.shape)
        weights = jnp.where(keep, weights / jnp.asarray(1.0 - p, weights.dtype), 0)
    return jnp.swapaxes(jnp.einsum("bnts,bnsh->bnth", weights, vh), 1, 2), weights


def _sequence_label(fmt: str) -> str:
    return "T" if "T" in fmt else "S"


def to_blc(data, fmt: str):
    """``(B, L, C)``: batch (size 1 when absent), sequence, channels."""
    work, work_fmt = (data, fmt) if "B" in fmt else (data[None], "B" + fmt)
    return jnp.transpose(work, [work_fmt.index(a) for a in ("B", _sequence_label(fmt), "C")])


def from_blc(y, fmt: str):
    work_fmt = fmt if "B" in fmt else "B" + fmt
    order = [work_fmt.index(a) for a in ("B", _sequence_label(fmt), "C")]
    y = jnp.transpose(y, np.argsort(order).tolist())
    return y if "B" in fmt else y[0]


def _check_sizes(q, k, v, num_heads) -> int:
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1:
        raise OpError(
            f"df.ops.attention: num_heads must be a positive int; got {num_heads!r}. Fix: e.g. "
            "num_heads=4 (it must divide the channels of the queries and values)."
        )
    heads = int(num_heads)
    if k.shape[2] != q.shape[2]:
        raise OpError(
            f"df.ops.attention: keys have {k.shape[2]} channels but queries have {q.shape[2]}; "
            "they must match. Fix: project both to the same number of channels."
        )
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise OpError(
            "df.ops.attention: queries, keys and values must have the same batch size; got "
            f"{q.shape[0]}, {k.shape[0]} and {v.shape[0]}."
        )
    if v.shape[1] != k.shape[1]:
        raise OpError(
            f"df.ops.attention: values have {v.shape[1]} steps but keys have {k.shape[1]}; "
            "each key needs its value. Fix: give them the same sequence length."
        )
    for name, channels in (("queries and keys", q.shape[2]), ("values", v.shape[2])):
        if channels % heads:
            raise OpError(
                f"df.ops.attention: num_heads={heads} does not divide the {channels} channels "
                f"of the {name}. Fix: use a number of heads that divides {channels}."
            )
    return heads


def _scale(scale, d_key: int) -> float:
    if isinstance(scale, str) and scale == "auto":
        return 1.0 / math.sqrt(d_key)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise OpError(
            f"df.ops.attention: scale must be 'auto' or a number; got {scale!r}. Fix: e.g. "
            "scale='auto' (1 / sqrt(key channels per head))."
        )
    return float(scale)


def _probability(p, key) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= float(p) < 1:
        raise OpError(
            f"df.ops.attention: dropout_probability must be a number in [0, 1); got {p!r}."
        )
    if float(p) > 0 and key is None:
        raise OpError(
            f"df.ops.attention: dropout_probability={p} needs randomness, but key is None. "
            "Fix: pass key=jax.random.key(...), or dropout_probability=0."
        )
    return float(p)


def combined_mask(padding_mask, attention_mask, fmt, q_shape, k_shape):
    """A boolean mask broadcastable to ``(B, heads, queries, keys)``, or ``None``.

    ``q_shape`` and ``k_shape`` start with (batch, steps); a padding mask is read in ``fmt``.
    """
    batch, n_q, n_k = q_shape[0], q_shape[1], k_shape[1]
    masks = []
    if padding_mask is not None:
        data = to_blc(read_like("attention", "padding_mask", padding_mask, fmt), fmt)
        if data.shape[:2] != (batch, n_k) or data.shape[2] < 1:
            raise OpError(
                f"df.ops.attention: padding_mask has (batch, steps) = {data.shape[:2]} but the "
                f"keys have {(batch, n_k)}. Fix: give one mask value per key step "
                "(nonzero: attend, zero: padding)."
            )
        masks.append((data[:, :, 0] != 0)[:, None, None, :])
    if isinstance(attention_mask, str):
        if attention_mask not in ("none", "causal"):
            raise OpError(
                "df.ops.attention: attention_mask must be 'none', 'causal' or an array "
                f"(queries, keys); got {attention_mask!r}."
            )
    elif attention_mask is not None:
        array = jnp.asarray(attention_mask)
        if array.shape not in ((n_q, n_k), (batch, n_q, n_k)):
            raise OpError(
                f"df.ops.attention: attention_mask has shape {tuple(array.shape)}; expected "
                f"(num_queries, num_keys) = {(n_q, n_k)} or (batch, num_queries, num_keys) = "
                f"{(batch, n_q, n_k)}, nonzero where attention is allowed. (MATLAB's is "
                "keys x queries: transpose it.)"
            )
        array = array != 0
        masks.append(array[None, None] if array.ndim == 2 else array[:, None])
    if not masks:
        return None
    return masks[0] if len(masks) == 1 else jnp.logical_and(*masks)
