"""``SelfAttention``: MATLAB's ``selfAttentionLayer``, on ``df.ops.attention``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp

from .._core import Data, FormatError, LayerError, Layout, OpError, Output, as_mask
from .._layer import Layer, learnable
from ..ops._attention import combined_mask, from_blc, is_attention_format, multi_head, to_blc
from ..ops._format_args import float_dtype
from . import _factor_options as factors
from . import _initializers as init
from ._checks import (
    array_or_none,
    bad_argument,
    choice,
    data_and_format,
    known_size,
    layout_format,
    positive_int,
    real,
    relabel,
    require,
    who,
)

_PROJECTIONS = ("query", "key", "value", "output")
_WEIGHTS = tuple(f"{p}_weights" for p in _PROJECTIONS)
_BIASES = tuple(f"{p}_bias" for p in _PROJECTIONS)
_FORMAT = "a 'C' axis, one 'T' or one 'S' axis and optionally 'B' (e.g. 'BTC', 'CBT', 'BSC')"


class SelfAttention(Layer):
    r"""Multi-head self-attention (MATLAB's ``selfAttentionLayer``), on ``df.ops.attention``.

    The layer projects its input $X$ to queries $X W_Q + b_Q$, keys
    $X W_K + b_K$ and values $X W_V + b_V$, runs ``num_heads``-head scaled
    dot-product attention (``df.ops.attention``, scale $1/\sqrt{d}$ with ``d`` the key
    channels per head) and projects the concatenated heads: $Y = A W_O + b_O$.

    Input: a ``C`` axis, exactly one ``T`` or one ``S`` axis (the positions that attend to each
    other) and optionally ``B``, in any order; a plain input is ``(batch, time, channels)``.
    Output: the input's format with ``output_size`` channels.

    With ``has_padding_mask_input=True`` the layer has a second input ``"mask"`` in the input's
    format (any channels; the first is used): a step attends only to steps where the mask is
    nonzero (MATLAB's padding mask). Without it, the layer takes the padding mask of padded
    sequences (``predict(x, mask=...)``, which networks pass on from ``net.predict(x,
    mask=...)`` and ``trainnet``'s sequence data): a boolean ``(batch, time)`` array, True at
    the steps that hold data; padded steps are then never attended to.
    With ``has_scores_output=True`` a second output ``"scores"`` holds the attention weights
    ``(batch, heads, queries, keys)``, format ``"BCUU"``: the heads on the ``C`` axis
    (``"CUU"`` without ``B``).

    Learnables, in this order: ``query_weights`` ``(C, num_key_channels)``, ``key_weights``
    ``(C, num_key_channels)``, ``value_weights`` ``(C, num_value_channels)``,
    ``output_weights`` ``(num_value_channels, output_size)``, then ``query_bias``,
    ``key_bias``, ``value_bias``, ``output_bias`` (MATLAB's weights transposed). Training
    (``forward``) drops attention weights with ``dropout_probability`` and needs a ``key``
    when it is positive; ``predict`` never drops.

    Args:
      num_heads: the number of heads; it divides ``num_key_channels`` and
        ``num_value_channels``.
      num_key_channels: the channels of the queries and keys (all heads together).
      num_value_channels: ``"auto"`` (default: ``num_key_channels``) or a positive int.
      output_size: ``"auto"`` (default: the input's channels) or a positive int.
      has_padding_mask_input: add the ``"mask"`` input (default False).
      has_scores_output: add the ``"scores"`` output (default False).
      attention_mask: ``"none"`` (default), ``"causal"`` (a step attends only to itself and
        earlier steps) or an array ``(steps, steps)``, nonzero where attention is allowed
        (queries first: MATLAB's is keys first).
      dropout_probability: attention-weight dropout during training, in [0, 1) (default 0).
      query_weights: the learnables (``query_weights``, ``key_weights``, ``value_weights``,
        ``output_weights``, ``query_bias``, ``key_bias``, ``value_bias``, ``output_bias``);
        ``None`` until ``initialize``.
      query_weights_initializer: ``"glorot"`` (default), ``"he"``, ``"orthogonal"``,
        ``"narrow-normal"``, ``"zeros"``, ``"ones"``, ``fn(key, shape, dtype)`` or
        ``fn(sz)``; likewise
        ``key_weights_initializer``, ``value_weights_initializer``,
        ``output_weights_initializer``.
      query_bias_initializer: ``"zeros"`` (default), ``"ones"``, ``"narrow-normal"`` or a
        function; likewise ``key_bias_initializer``, ``value_bias_initializer``,
        ``output_bias_initializer``.
      weight_learn_rate_factor, bias_learn_rate_factor: multiply the global learn rate for all
        four weights or biases (default 1).
      weight_l2_factor, bias_l2_factor: multiply the global L2 regularization (defaults 1 and
        0).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.SelfAttention(2, 8, attention_mask="causal")
      >>> layer = layer.initialize(df.Layout((None, None, 6), "BTC"), key=jax.random.key(0))
      >>> layer.query_weights.shape, layer.output_weights.shape
      ((6, 8), (8, 6))
      >>> y = layer(df.dlarray(jnp.ones((3, 5, 6)), "BTC"))
      >>> y.format, y.shape
      ('BTC', (3, 5, 6))
      >>> masked = df.layers.SelfAttention(2, 8, has_padding_mask_input=True)
      >>> masked.input_names
      ('in', 'mask')
    """

    formattable = True
    _factor_options: ClassVar = {
        "weight_learn_rate_factor": (factors.LEARN_RATE, _WEIGHTS),
        "bias_learn_rate_factor": (factors.LEARN_RATE, _BIASES),
        "weight_l2_factor": (factors.L2, _WEIGHTS),
        "bias_l2_factor": (factors.L2, _BIASES),
    }

    num_heads: int
    num_key_channels: int
    _: dataclasses.KW_ONLY
    num_value_channels: Any = "auto"
    output_size: Any = "auto"
    has_padding_mask_input: bool = False
    has_scores_output: bool = False
    attention_mask: Any = "none"
    dropout_probability: float = 0.0
    query_weights: jax.Array = learnable(default=None)
    key_weights: jax.Array = learnable(default=None)
    value_weights: jax.Array = learnable(default=None)
    output_weights: jax.Array = learnable(default=None)
    query_bias: jax.Array = learnable(default=None, l2_factor=0.0)
    key_bias: jax.Array = learnable(default=None, l2_factor=0.0)
    value_bias: jax.Array = learnable(default=None, l2_factor=0.0)
    output_bias: jax.Array = learnable(default=None, l2_factor=0.0)
    query_weights_initializer: Any = "glorot"
    key_weights_initializer: Any = "glorot"
    value_weights_initializer: Any = "glorot"
    output_weights_initializer: Any = "glorot"
    query_bias_initializer: Any = "zeros"
    key_bias_initializer: Any = "zeros"
    value_bias_initializer: Any = "zeros"
    output_bias_initializer: Any = "zeros"
    weight_learn_rate_factor: float = 1.0
    bias_learn_rate_factor: float = 1.0
    weight_l2_factor: float = 1.0
    bias_l2_factor: float = 0.0

    def __post_init__(self) -> None:
        fix = "e.g. SelfAttention(4, 64): 4 heads, 64 key channels."
        heads = self.num_heads = positive_int(self, "num_heads", self.num_heads, fix=fix)
        self.num_key_channels = positive_int(
            self, "num_key_channels", self.num_key_channels, fix=fix
        )
        if self.num_value_channels != "auto":
            self.num_value_channels = positive_int(
                self,
                "num_value_channels",
                self.num_value_channels,
                fix="e.g. num_value_channels='auto' (num_key_channels) or 64.",
            )
        for name in ("num_key_channels", "num_value_channels"):
            channels = self._channels(name)
            if channels % heads:
                raise bad_argument(
                    self,
                    name,
                    f"a multiple of num_heads={heads} (each head gets the same channels)",
                    channels,
                    f"use e.g. {heads * max(1, channels // heads)}.",
                )
        if self.output_size != "auto":
            self.output_size = positive_int(
                self, "output_size", self.output_size, fix="e.g. output_size='auto' or 64."
            )
        for name in ("has_padding_mask_input", "has_scores_output"):
            if not isinstance(getattr(self, name), bool):
                raise bad_argument(
                    self, name, "True or False", getattr(self, name), f"e.g. {name}=True."
                )
        self._check_attention_mask()
        self.dropout_probability = real(
            self,
            "dropout_probability",
            self.dropout_probability,
            low=0.0,
            high=1.0,
            open_high=True,
            expected="a number in [0, 1)",
            fix="e.g. dropout_probability=0.1 (MATLAB's default is 0).",
        )
        init.check_options(self, dict.fromkeys(_WEIGHTS, init.RECURRENT))
        init.check_options(self, dict.fromkeys(_BIASES, init.BIAS))
        for name, shape in self._shapes(None).items():
            what = ", ".join("any" if n is None else str(n) for n in shape)
            setattr(self, name, array_or_none(self, name, getattr(self, name), shape, what))
        self.num_inputs: int
        self.input_names: tuple[str, ...]
        self.num_outputs: int
        self.output_names: tuple[str, ...]
        self.num_inputs, self.input_names = (
            (2, ("in", "mask")) if self.has_padding_mask_input else (1, ("in",))
        )
        self.num_outputs, self.output_names = (
            (2, ("out", "scores")) if self.has_scores_output else (1, ("out",))
        )
        factors.record(self, self._factor_options)

    def _check_attention_mask(self) -> None:
        mask = self.attention_mask
        if isinstance(mask, str):
            choice(self, "attention_mask", mask, ("none", "causal"))
            return
        array = jnp.asarray(mask) if mask is not None else None
        if array is None or array.ndim != 2:
            raise bad_argument(
                self,
                "attention_mask",
                "'none', 'causal' or a 2-D array (steps, steps), nonzero where allowed",
                mask,
                "e.g. attention_mask='causal'.",
            )
        # A float 0/1 array: a non-trained leaf that jax.grad over the layer accepts.
        self.attention_mask = (array != 0).astype(jnp.float32)

    def _channels(self, name: str) -> int:
        if name == "num_value_channels" and self.num_value_channels == "auto":
            return self.num_key_channels
        return getattr(self, name)

    def _shapes(self, channels: int | None) -> dict[str, tuple]:
        d_k, d_v = self.num_key_channels, self._channels("num_value_channels")
        out = None if self.output_size == "auto" else self.output_size
        if out is None and channels is not None:
            out = channels
        return {
            "query_weights": (channels, d_k),
            "key_weights": (channels, d_k),
            "value_weights": (channels, d_v),
            "output_weights": (d_v, out),
            "query_bias": (d_k,),
            "key_bias": (d_k,),
            "value_bias": (d_v,),
            "output_bias": (out,),
        }

    def _check_channels(self, channels: int, where: str) -> None:
        for name in ("query_weights", "key_weights", "value_weights"):
            w = getattr(self, name)
            if w is not None and w.shape[0] != channels:
                raise LayerError(
                    f"{who(self)}: {where} has {channels} channels but {name} has shape "
                    f"{tuple(w.shape)}, expecting {w.shape[0]}. Fix: give {name} of shape "
                    f"({channels}, {w.shape[1]}), or leave it None."
                )

    def initialize(self, *layouts: Layout, key: jax.Array) -> Self:
        if len(layouts) != self.num_inputs:
            raise LayerError(
                f"{who(self)}.initialize takes {self.num_inputs} layout(s) {self.input_names}; "
                f"got {len(layouts)}."
            )
        layout = layout_format(self, layouts[0], is_attention_format, want=_FORMAT)
        if self.has_padding_mask_input:
            mask = layouts[1]
            if not isinstance(mask, Layout) or mask.format != layout.format:
                raise FormatError(
                    f"{who(self)}.initialize: the 'mask' input's layout {mask!r} must have the "
                    f"input's format {layout.format!r}. Fix: label the mask like the input."
                )
        channels = known_size(self, layout, "C", "number of channels")
        self._check_channels(channels, f"the input layout {layout!r}")
        shapes = self._shapes(channels)
        keys = jax.random.split(key, len(_WEIGHTS) + len(_BIASES))
        draws = [
            (name, k, shape, *shapes[name.replace("_bias", "_weights")])
            for k, (name, shape) in zip(keys, shapes.items(), strict=True)
        ]
        return init.fill(self, draws)

    def predict(self, *inputs: Data, mask: jax.Array | None = None) -> Output:
        return self._attend(inputs, probability=0.0, key=None, sequence_mask=mask)

    def forward(
        self, *inputs: Data, key: jax.Array | None = None, mask: jax.Array | None = None
    ) -> Output:
        if self.dropout_probability > 0 and key is None:
            raise LayerError(
                f"{who(self)}: training-time dropout (dropout_probability="
                f"{self.dropout_probability}) needs randomness, but no key was given. Fix: pass "
                "key=jax.random.key(...) (e.g. net.forward(x, key=key))."
            )
        return self._attend(
            inputs, probability=self.dropout_probability, key=key, sequence_mask=mask
        )

    def _attend(self, inputs, probability: float, key, sequence_mask=None):
        require(self, *_WEIGHTS, *_BIASES)
        x = inputs[0]
        data, fmt = data_and_format(x)
        if not fmt:
            if data.ndim != 3:
                raise FormatError(
                    f"{who(self)} takes a plain input only as (batch, time, channels); got "
                    f"shape {tuple(data.shape)}. Fix: label it, e.g. df.dlarray(x, 'TC')."
                )
            fmt = "BTC"
        elif not is_attention_format(fmt):
            raise FormatError(
                f"{who(self)} attends over one sequence or spatial axis: it takes {_FORMAT}; "
                f"got format {fmt!r}. Fix: flatten the spatial axes into one 'S' axis, or "
                "relabel the axes."
            )
        c = fmt.index("C")
        self._check_channels(data.shape[c], "the input")
        params = {n: getattr(self, n) for n in _WEIGHTS + _BIASES}
        dtype = float_dtype(data, *params.values())
        work_fmt = fmt.replace("C", "") + "C"  # channels last
        x_blc = to_blc(jnp.moveaxis(data.astype(dtype), c, -1), work_fmt)
        heads = self.num_heads

        def project(name):
            # straight into heads (B, L, heads, per head): measured faster on CPU than a
            # projection to (B, L, C) and a reshape
            w, b = params[f"{name}_weights"].astype(dtype), params[f"{name}_bias"].astype(dtype)
            split = jnp.reshape(w, (w.shape[0], heads, -1))
            return jnp.einsum("blc,cnh->blnh", x_blc, split) + jnp.reshape(b, (1, 1, heads, -1))

        q, k, v = (project(name) for name in ("query", "key", "value"))
        try:
            mask = combined_mask(
                self._padding_mask(inputs, fmt, c, sequence_mask), self.attention_mask,
                work_fmt, x_blc.shape, x_blc.shape,
            )  # fmt: skip
        except OpError as error:
            raise LayerError(f"{who(self)}: {error}") from None
        attended, scores = multi_head(
            q,
            k,
            v,
            mask=mask,
            causal=isinstance(self.attention_mask, str) and self.attention_mask == "causal",
            scale=1.0 / math.sqrt(q.shape[3]),
            probability=probability,
            key=key,
            return_weights=self.has_scores_output,
        )
        w_out = params["output_weights"].astype(dtype)
        out = jnp.einsum(
            "blnh,nho->blo", attended, jnp.reshape(w_out, (heads, -1, w_out.shape[1]))
        ) + jnp.reshape(params["output_bias"].astype(dtype), (1, 1, -1))
        y = relabel(x, jnp.moveaxis(from_blc(out, work_fmt), -1, c), fmt)
        if not self.has_scores_output:
            return y
        assert scores is not None  # multi_head returns them when asked
        scores = scores if "B" in fmt else scores[0]
        return y, relabel(x, scores, "BCUU" if "B" in fmt else "CUU")

    def _padding_mask(self, inputs, fmt: str, c: int, sequence_mask):
        if not self.has_padding_mask_input:
            return None if sequence_mask is None else self._from_sequence_mask(sequence_mask, fmt)
        mask, mask_fmt = data_and_format(inputs[1])
        if mask_fmt and mask_fmt != fmt:
            raise FormatError(
                f"{who(self)}: the 'mask' input has format {mask_fmt!r} but the input has "
                f"{fmt!r}. Fix: label the mask like the input (df.permute or df.dlarray)."
            )
        if mask.ndim != len(fmt):
            raise FormatError(
                f"{who(self)}: the 'mask' input has shape {tuple(mask.shape)}; it must have the "
                f"input's {len(fmt)} axes ({fmt!r})."
            )
        return jnp.moveaxis(mask, c, -1)

    def _from_sequence_mask(self, mask, fmt: str):
        """A ``(batch, time)`` padding mask in the channels-last layout of an input in ``fmt``."""
        if "B" not in fmt or "T" not in fmt:
            raise FormatError(
                f"{who(self)}: a padding mask (batch, time) needs an input with 'B' and 'T' axes; "
                f"got format {fmt!r}. Fix: use has_padding_mask_input=True for other layouts."
            )
        mask = as_mask(mask, who=who(self), error=LayerError)
        work_fmt = fmt.replace("C", "")
        return (mask if work_fmt.index("B") < work_fmt.index("T") else mask.T)[..., None]
