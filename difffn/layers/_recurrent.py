"""Recurrent layers: ``LSTM`` (MATLAB's ``lstmLayer``) and ``BiLSTM`` (``bilstmLayer``).

They run the recurrences of ``df.ops.lstm`` (``difffn/ops/_recurrent.py``). ``_Recurrent`` holds
what every recurrent layer shares (``GRU`` in ``_gru.py`` too): the input format, the carried
state and its reset, the ``"sequence"``/``"last"`` output and the initializers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp

from .._core import Data, FormatError, LayerError, Layout, OpError, Output
from .._layer import Layer, learnable, state
from ..ops._format_args import float_dtype, from_time_major, to_time_major
from ..ops._recurrent import (
    GATE_ACTIVATIONS,
    STATE_ACTIVATIONS,
    _time_major_mask,
    is_sequence_format,
    lstm_scan,
)
from . import _factor_options as factors
from . import _initializers as init
from ._checks import (
    array_or_none,
    as_float_array,
    bad_argument,
    choice,
    data_and_format,
    known_size,
    layout_format,
    positive_int,
    relabel,
    require,
    who,
)


class _Recurrent(Layer):
    """What LSTM, BiLSTM and GRU share; subclasses set the class constants below."""

    formattable = True
    _factor_options: ClassVar = {
        "input_weights_learn_rate_factor": (factors.LEARN_RATE, ("input_weights",)),
        "recurrent_weights_learn_rate_factor": (factors.LEARN_RATE, ("recurrent_weights",)),
        "bias_learn_rate_factor": (factors.LEARN_RATE, ("bias",)),
        "input_weights_l2_factor": (factors.L2, ("input_weights",)),
        "recurrent_weights_l2_factor": (factors.L2, ("recurrent_weights",)),
        "bias_l2_factor": (factors.L2, ("bias",)),
    }
    _GATES = 4  # blocks of H in the weights, per direction
    _DIRECTIONS = 1

    def _bias_blocks(self) -> int:
        """Blocks of ``H`` in the bias, per direction."""
        return self._GATES

    def _width(self) -> int:
        """The channels of the output and of each state: ``H`` per direction."""
        return self._DIRECTIONS * self.num_hidden_units

    def _check_options(self, bias_initializers) -> None:
        """Validate the options every recurrent layer has (call in ``__post_init__``)."""
        # Fields that each subclass declares (in its own order), typed here for these methods.
        self.output_mode: str
        self.state_activation_function: str
        self.gate_activation_function: str
        self.bias_initializer: Any
        self.num_hidden_units: int = positive_int(
            self,
            "num_hidden_units",
            self.num_hidden_units,
            fix=f"e.g. {type(self).__name__}(100).",
        )
        h = self.num_hidden_units
        choice(self, "output_mode", self.output_mode, ("sequence", "last"))
        choice(
            self,
            "state_activation_function",
            self.state_activation_function,
            tuple(STATE_ACTIVATIONS),
        )
        choice(
            self, "gate_activation_function", self.gate_activation_function, tuple(GATE_ACTIVATIONS)
        )
        init.check_options(
            self,
            {
                "input_weights": init.RECURRENT,
                "recurrent_weights": init.RECURRENT,
                "bias": bias_initializers,
            },
        )
        blocks = self._GATES * self._DIRECTIONS
        self.input_weights: jax.Array = array_or_none(
            self, "input_weights", self.input_weights, (None, blocks * h), f"input_size, {blocks}H"
        )
        self.recurrent_weights: jax.Array = array_or_none(
            self, "recurrent_weights", self.recurrent_weights, (h, blocks * h), f"H, {blocks}H"
        )
        bias_size = self._bias_blocks() * self._DIRECTIONS * h
        self.bias: jax.Array = array_or_none(
            self, "bias", self.bias, (bias_size,), f"{bias_size // h}H"
        )
        width = self._width()
        for name in self._state_fields:
            value = getattr(self, name)
            if value is None:
                continue
            value = as_float_array(self, name, value)
            value = value[None] if value.ndim == 1 else value
            if value.ndim != 2 or value.shape[1] != width:
                raise bad_argument(
                    self,
                    name,
                    f"an array of shape ({width},), (1, {width}) or (batch, {width})",
                    value,
                    f"pass one of those shapes, or leave {name}=None (zeros).",
                )
            setattr(self, name, value)
        factors.record(self, self._factor_options)

    def _check_input_size(self, input_size: int, where: str) -> None:
        w = self.input_weights
        if w is not None and w.shape[0] != input_size:
            raise LayerError(
                f"{who(self)}: {where} has {input_size} channels but input_weights has shape "
                f"{tuple(w.shape)}, expecting {w.shape[0]}. Fix: give input_weights of shape "
                f"({input_size}, {w.shape[1]}), or leave it None."
            )

    def initialize(self, layout: Layout, *, key: jax.Array) -> Self:
        layout = layout_format(
            self, layout, is_sequence_format, want="a 'C' axis and optionally 'B' and 'T'"
        )
        input_size = known_size(self, layout, "C", "number of channels")
        self._check_input_size(input_size, f"the input layout {layout!r}")
        h, blocks = self.num_hidden_units, self._GATES * self._DIRECTIONS
        k_input, k_recurrent, k_bias = jax.random.split(key, 3)
        draws: list[tuple[str, jax.Array, tuple[int, ...], int, int]] = [
            ("input_weights", k_input, (input_size, blocks * h), input_size, blocks * h),
            ("recurrent_weights", k_recurrent, (h, blocks * h), h, blocks * h),
        ]
        changes = {}
        if self.bias is None:
            size = self._bias_blocks() * self._DIRECTIONS * h
            if self.bias_initializer == "unit-forget-gate":  # LSTMs only (GRU's check)
                # ones for the forget gate (block 1 of the four) of every direction
                blocks_of_h = jnp.zeros((self._DIRECTIONS, 4, h), jnp.float32).at[:, 1].set(1.0)
                changes["bias"] = blocks_of_h.reshape(size)
            else:
                draws.append(("bias", k_bias, (size,), h, size))
        for name in self._state_fields:
            if getattr(self, name) is None:
                changes[name] = jnp.zeros((1, self._width()), jnp.float32)
        return init.fill(self, draws, **changes)

    def reset_state(self) -> Self:
        """The layer with zero states of shape ``(1, channels)`` (they broadcast over batches)."""
        zeros = {}
        for name in self._state_fields:
            value = getattr(self, name)
            dtype = jnp.float32 if value is None else value.dtype
            zeros[name] = jnp.zeros((1, self._width()), dtype)
        return self.replace(**zeros)

    def _time_major(self, x):
        """``(xs, fmt)``: the input as ``(T, B, C)`` and its format (plain input: ``"BTC"``)."""
        require(self, *self._learnable_fields, *self._state_fields)
        data, fmt = data_and_format(x)
        if not fmt:
            if data.ndim != 3:
                raise FormatError(
                    f"{who(self)} takes a plain input only as (batch, time, channels); got "
                    f"shape {tuple(data.shape)}. Fix: label it, e.g. df.dlarray(x, 'TC') for "
                    "one sequence or df.dlarray(x, 'BC') for one time step."
                )
            fmt = "BTC"
        elif not is_sequence_format(fmt):
            raise FormatError(
                f"{who(self)} takes sequence data: a 'C' axis and optionally 'B' and 'T'; got "
                f"format {fmt!r}. Fix: flatten image axes first (Flatten), or relabel the axes."
            )
        xs = to_time_major(data, fmt)
        self._check_input_size(xs.shape[2], "the input")
        return xs, fmt

    def _time_major_mask(self, mask, xs, fmt: str):
        """A padding mask ``(batch, time)`` as the scan reads it, ``(time, batch)``."""
        try:
            return _time_major_mask(type(self).__name__, mask, xs.shape, fmt)
        except OpError as error:
            raise LayerError(f"{who(self)}: {str(error).split(': ', 1)[1]}") from None

    def _initial_states(self, batch: int) -> tuple:
        for name in self._state_fields:
            size = getattr(self, name).shape[0]
            if size not in (1, batch):
                raise LayerError(
                    f"{who(self)}: {name} has batch size {size} (carried from a previous "
                    f"call) but the input has batch size {batch}. Fix: layer.reset_state() "
                    "(net.reset_state()) before a batch of another size."
                )
        return tuple(getattr(self, name) for name in self._state_fields)

    def _dtype(self, xs, states):
        return float_dtype(xs, *(getattr(self, n) for n in self._learnable_fields), *states)

    def _output(self, x, hs, h_last, fmt: str):
        """The layer output: every step (``"sequence"``) or the final hidden state (``"last"``)."""
        if self.output_mode == "sequence":
            return relabel(x, from_time_major(hs, fmt), fmt)
        out_fmt = fmt.replace("T", "")  # "BC", "CB" or "C"
        y = h_last.T if out_fmt == "CB" else h_last[0] if out_fmt == "C" else h_last
        return relabel(x, y, out_fmt)


_OPTIONS_DOC = """
      input_weights_initializer: ``"glorot"`` (default; fans ``input_size`` and the number of
        weight columns), ``"he"``, ``"narrow-normal"``, ``"orthogonal"``, ``"zeros"``,
        ``"ones"`` or a function, ``fn(key, shape, dtype)`` or ``fn(sz)``.
      recurrent_weights_initializer: ``"orthogonal"`` (default), ``"glorot"``, ``"he"``,
        ``"narrow-normal"``, ``"zeros"``, ``"ones"`` or a function.
      input_weights_learn_rate_factor: multiplies the global learn rate (default 1); so do
        ``recurrent_weights_learn_rate_factor`` and ``bias_learn_rate_factor``.
      input_weights_l2_factor, recurrent_weights_l2_factor: multiply the global L2
        regularization (default 1); bias_l2_factor: the same for the bias (default 0, as
        MATLAB's ``BiasL2Factor``)."""


class _LSTMFields(_Recurrent):
    """The fields, checks and initialization of ``LSTM`` and ``BiLSTM`` (never used alone)."""

    num_hidden_units: int
    _: dataclasses.KW_ONLY
    output_mode: str = "sequence"
    state_activation_function: str = "tanh"
    gate_activation_function: str = "sigmoid"
    input_weights: jax.Array = learnable(default=None)
    recurrent_weights: jax.Array = learnable(default=None)
    bias: jax.Array = learnable(default=None, l2_factor=0.0)  # MATLAB: BiasL2Factor 0
    hidden_state: jax.Array = state(default=None)
    cell_state: jax.Array = state(default=None)
    input_weights_initializer: Any = "glorot"
    recurrent_weights_initializer: Any = "orthogonal"
    bias_initializer: Any = "unit-forget-gate"
    input_weights_learn_rate_factor: float = 1.0
    recurrent_weights_learn_rate_factor: float = 1.0
    bias_learn_rate_factor: float = 1.0
    input_weights_l2_factor: float = 1.0
    recurrent_weights_l2_factor: float = 1.0
    bias_l2_factor: float = 0.0

    def __post_init__(self) -> None:
        self._check_options(init.LSTM_BIAS)


class LSTM(_LSTMFields):
    r"""Long short-term memory layer (MATLAB's ``lstmLayer``), on ``df.ops.lstm``.

    Input: a format with ``C`` and optionally ``B`` and ``T``, in any order (``"BTC"``,
    ``"TBC"``, ``"CBT"``, ...; without ``T`` it is one time step, without ``B`` one sequence). A
    plain input must be 3-D ``(batch, time, channels)``. Output: with ``output_mode="sequence"``
    the input's format with ``num_hidden_units`` channels (``"BTC" -> "BTC"``); with ``"last"``
    the last time step, the input's format without ``T`` (``"BTC" -> "BC"``).

    With $z = x_t W + h_{t-1} R + b$ split into four blocks of ``num_hidden_units`` in
    MATLAB's gate order (input $i$, forget $f$, cell candidate $g$, output
    $o$): $c_t = \sigma(f) c_{t-1} + \sigma(i) \tanh(g)$,
    $h_t = \sigma(o) \tanh(c_t)$ ($\sigma$, $\tanh$: the gate and state
    activations).

    Learnables: ``input_weights`` ``(input_size, 4H)``, ``recurrent_weights`` ``(H, 4H)``,
    ``bias`` ``(4H,)``, with ``H = num_hidden_units``; MATLAB's ``InputWeights`` and
    ``RecurrentWeights`` transposed, the same gate order.

    State: ``hidden_state`` and ``cell_state`` of shape ``(batch, H)``. They start as zeros of
    shape ``(1, H)``, which broadcast over any batch size; ``predict`` and ``forward`` return the
    new states of shape ``(batch, H)`` after the outputs (as MATLAB's state becomes
    ``H x batch`` after a call), so running a sequence in pieces and carrying the state equals
    running it whole. A carried state's batch size must match the next input's (or be 1):
    ``reset_state()`` returns the layer with zero states of shape ``(1, H)``.

    Args:
      num_hidden_units: ``H``.
      output_mode: ``"sequence"`` (default) or ``"last"``.
      state_activation_function: ``"tanh"`` (default) or ``"softsign"``.
      gate_activation_function: ``"sigmoid"`` (default) or ``"hard-sigmoid"``
        (``clip(0.2 z + 0.5, 0, 1)``).
      input_weights, recurrent_weights, bias: the learnables; ``None`` until ``initialize``.
      hidden_state, cell_state: initial states, ``(H,)``, ``(1, H)`` or ``(batch, H)``; ``None``
        until ``initialize`` (zeros).
      bias_initializer: ``"unit-forget-gate"`` (default: ones for the forget gate, zeros
        elsewhere), ``"zeros"``, ``"ones"``, ``"narrow-normal"`` or a function."""

    __doc__ = (
        (__doc__ or "").rstrip()
        + _OPTIONS_DOC
        + """

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.LSTM(5)
      >>> layer = layer.initialize(df.Layout((None, None, 3), "BTC"), key=jax.random.key(0))
      >>> y, h, c = layer(df.dlarray(jnp.ones((2, 7, 3)), "BTC"))
      >>> y.format, y.shape, h.shape, c.shape
      ('BTC', (2, 7, 5), (2, 5), (2, 5))
      >>> last = layer.replace(output_mode="last")
      >>> last(df.dlarray(jnp.ones((2, 7, 3)), "BTC"))[0].format
      'BC'
    """
    )

    def predict(self, x: Data, *, mask: jax.Array | None = None) -> Output:
        xs, fmt = self._time_major(x)
        batch, h = xs.shape[1], self.num_hidden_units
        h0, c0 = self._initial_states(batch)
        dtype = self._dtype(xs, (h0, c0))
        hs, h_last, c_last = lstm_scan(
            xs.astype(dtype),
            *(jnp.broadcast_to(s.astype(dtype), (batch, h)) for s in (h0, c0)),
            *(getattr(self, n).astype(dtype) for n in self._learnable_fields),
            gate=GATE_ACTIVATIONS[self.gate_activation_function],
            act=STATE_ACTIVATIONS[self.state_activation_function],
            sequence=self.output_mode == "sequence",
            mask=self._time_major_mask(mask, xs, fmt),
        )
        y = self._output(x, hs, h_last, fmt)
        return y, h_last.astype(h0.dtype), c_last.astype(c0.dtype)


class BiLSTM(_LSTMFields):
    r"""Bidirectional LSTM layer (MATLAB's ``bilstmLayer``), on ``df.ops.lstm``.

    Two LSTMs read the sequence, one forward in time and one backward, and their hidden states
    are concatenated along ``C``: forward first, then backward (``2H`` channels). Formats and
    ``output_mode`` as [`LSTM`][difffn.layers.LSTM]; with ``output_mode="last"`` the output is the
    final
    hidden state of each direction (the forward LSTM's after the last step, the backward
    LSTM's after the first), which is also the new ``hidden_state``.

    Learnables: ``input_weights`` ``(input_size, 8H)``, ``recurrent_weights`` ``(H, 8H)``,
    ``bias`` ``(8H,)``: the forward direction's four gate blocks, then the backward
    direction's (MATLAB's ``8H x input_size`` and ``8H x H`` transposed, the same order).
    State: ``hidden_state`` and ``cell_state`` ``(batch, 2H)``, forward then backward; they
    start as zeros ``(1, 2H)``, as [`LSTM`][difffn.layers.LSTM]'s. Each direction starts from its
    half of the
    state (MATLAB's rule), so a carried state is not "the same sequence continued" for the
    backward direction.

    Args:
      num_hidden_units: ``H``, per direction.
      output_mode: ``"sequence"`` (default) or ``"last"``.
      state_activation_function, gate_activation_function: as [`LSTM`][difffn.layers.LSTM].
      input_weights, recurrent_weights, bias, hidden_state, cell_state: as above; ``None``
        until ``initialize``.
      bias_initializer: ``"unit-forget-gate"`` (default; both directions), ``"zeros"``,
        ``"ones"``, ``"narrow-normal"`` or a function."""

    __doc__ = (
        (__doc__ or "").rstrip()
        + _OPTIONS_DOC
        + """

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.BiLSTM(4, output_mode="last")
      >>> layer = layer.initialize(df.Layout((None, 8, 3), "BTC"), key=jax.random.key(0))
      >>> layer.input_weights.shape
      (3, 32)
      >>> y, h, c = layer(df.dlarray(jnp.ones((2, 8, 3)), "BTC"))
      >>> y.format, y.shape, bool(jnp.array_equal(y.data, h))
      ('BC', (2, 8), True)
    """
    )

    _DIRECTIONS = 2

    def predict(self, x: Data, *, mask: jax.Array | None = None) -> Output:
        xs, fmt = self._time_major(x)
        batch, h = xs.shape[1], self.num_hidden_units
        h0, c0 = self._initial_states(batch)
        dtype = self._dtype(xs, (h0, c0))
        mask = self._time_major_mask(mask, xs, fmt)
        xs = xs.astype(dtype)
        w, r, b = (getattr(self, n).astype(dtype) for n in self._learnable_fields)
        h0_, c0_ = (jnp.broadcast_to(s.astype(dtype), (batch, 2 * h)) for s in (h0, c0))
        sequence = self.output_mode == "sequence"
        runs = []
        for d in range(2):  # forward, then backward
            block = slice(4 * h * d, 4 * h * (d + 1))
            half = slice(h * d, h * (d + 1))
            runs.append(
                lstm_scan(
                    xs,
                    h0_[:, half],
                    c0_[:, half],
                    w[:, block],
                    r[:, block],
                    b[block],
                    gate=GATE_ACTIVATIONS[self.gate_activation_function],
                    act=STATE_ACTIVATIONS[self.state_activation_function],
                    reverse=d == 1,
                    sequence=sequence,
                    mask=mask,
                )
            )
        (hs_f, h_f, c_f), (hs_b, h_b, c_b) = runs
        hs = jnp.concatenate([hs_f, hs_b], axis=-1) if sequence else None
        h_last, c_last = jnp.concatenate([h_f, h_b], -1), jnp.concatenate([c_f, c_b], -1)
        y = self._output(x, hs, h_last, fmt)
        return y, h_last.astype(h0.dtype), c_last.astype(c0.dtype)
