"""``LSTM``: MATLAB's ``lstmLayer``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from .._errors import FormatError, LayerError
from .._fields import learnable, state
from .._layer import Layer
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

_STATE_ACTIVATIONS = {"tanh": jnp.tanh, "softsign": jax.nn.soft_sign}
_GATE_ACTIVATIONS = {
    "sigmoid": jax.nn.sigmoid,
    "hard-sigmoid": lambda z: jnp.clip(0.2 * z + 0.5, 0.0, 1.0),
}


def _is_sequence_format(fmt: str) -> bool:
    return "C" in fmt and set(fmt) <= set("BTC")


class LSTM(Layer):
    r"""Long short-term memory layer (MATLAB's ``lstmLayer``).

    Input: a format with ``C`` and optionally ``B`` and ``T``, in any order (``"BTC"``,
    ``"TBC"``, ``"CBT"``, ...; without ``T`` it is one time step, without ``B`` one sequence). A
    plain input must be 3-D ``(batch, time, channels)``. The layer runs ``jax.lax.scan`` over
    time. Output: with ``output_mode="sequence"`` the input's format with ``num_hidden_units``
    channels (``"BTC" -> "BTC"``); with ``"last"`` the last time step, the input's format without
    ``T`` (``"BTC" -> "BC"``).

    With :math:`z = x_t W + h_{t-1} R + b` split into four blocks of ``num_hidden_units`` in
    MATLAB's gate order (input :math:`i`, forget :math:`f`, cell candidate :math:`g`, output
    :math:`o`): :math:`c_t = \sigma(f) c_{t-1} + \sigma(i) \tanh(g)`,
    :math:`h_t = \sigma(o) \tanh(c_t)` (:math:`\sigma`, :math:`\tanh`: the gate and state
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
      input_weights_initializer: ``"glorot"`` (default; fans ``input_size`` and ``4H``), ``"he"``,
        ``"narrow-normal"``, ``"orthogonal"``, ``"zeros"``, ``"ones"`` or a function.
      recurrent_weights_initializer: ``"orthogonal"`` (default), ``"glorot"``, ``"he"``,
        ``"narrow-normal"``, ``"zeros"``, ``"ones"`` or a function.
      bias_initializer: ``"unit-forget-gate"`` (default: ones for the forget gate, zeros
        elsewhere), ``"zeros"``, ``"ones"``, ``"narrow-normal"`` or a function.

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

    formattable = True

    num_hidden_units: int
    _: dataclasses.KW_ONLY
    output_mode: str = "sequence"
    state_activation_function: str = "tanh"
    gate_activation_function: str = "sigmoid"
    input_weights: jax.Array | None = learnable(default=None)
    recurrent_weights: jax.Array | None = learnable(default=None)
    bias: jax.Array | None = learnable(default=None, l2_factor=0.0)  # MATLAB: BiasL2Factor 0
    hidden_state: jax.Array | None = state(default=None)
    cell_state: jax.Array | None = state(default=None)
    input_weights_initializer: Any = "glorot"
    recurrent_weights_initializer: Any = "orthogonal"
    bias_initializer: Any = "unit-forget-gate"

    def __post_init__(self):
        self.num_hidden_units = h = positive_int(
            self, "num_hidden_units", self.num_hidden_units, fix="e.g. LSTM(100)."
        )
        choice(self, "output_mode", self.output_mode, ("sequence", "last"))
        choice(
            self,
            "state_activation_function",
            self.state_activation_function,
            tuple(_STATE_ACTIVATIONS),
        )
        choice(
            self,
            "gate_activation_function",
            self.gate_activation_function,
            tuple(_GATE_ACTIVATIONS),
        )
        self.input_weights_initializer = init.check(
            self, "input_weights_initializer", self.input_weights_initializer, init.RECURRENT
        )
        self.recurrent_weights_initializer = init.check(
            self,
            "recurrent_weights_initializer",
            self.recurrent_weights_initializer,
            init.RECURRENT,
        )
        self.bias_initializer = init.check(
            self, "bias_initializer", self.bias_initializer, init.LSTM_BIAS
        )
        self.input_weights = array_or_none(
            self, "input_weights", self.input_weights, (None, 4 * h), "input_size, 4 * H"
        )
        self.recurrent_weights = array_or_none(
            self, "recurrent_weights", self.recurrent_weights, (h, 4 * h), "H, 4 * H"
        )
        self.bias = array_or_none(self, "bias", self.bias, (4 * h,), "4 * H")
        for name in ("hidden_state", "cell_state"):
            value = getattr(self, name)
            if value is None:
                continue
            value = as_float_array(value)
            if value.ndim == 1:
                value = value[None]
            if value.ndim != 2 or value.shape[1] != h:
                raise bad_argument(
                    self,
                    name,
                    f"an array of shape ({h},), (1, {h}) or (batch, {h})",
                    value,
                    f"pass one of those shapes, or leave {name}=None (zeros).",
                )
            setattr(self, name, value)

    def initialize(self, layout, *, key):
        layout = layout_format(
            self, layout, _is_sequence_format, want="a 'C' axis and optionally 'B' and 'T'"
        )
        input_size = known_size(self, layout, "C", "number of channels")
        self._check_input_size(input_size, f"the input layout {layout!r}")
        h = self.num_hidden_units
        k_input, k_recurrent, k_bias = jax.random.split(key, 3)
        changes = {}
        if self.input_weights is None:
            changes["input_weights"] = init.draw(
                self,
                "input_weights_initializer",
                self.input_weights_initializer,
                k_input,
                (input_size, 4 * h),
                input_size,
                4 * h,
            )
        if self.recurrent_weights is None:
            changes["recurrent_weights"] = init.draw(
                self,
                "recurrent_weights_initializer",
                self.recurrent_weights_initializer,
                k_recurrent,
                (h, 4 * h),
                h,
                4 * h,
            )
        if self.bias is None:
            if self.bias_initializer == "unit-forget-gate":
                changes["bias"] = jnp.zeros(4 * h, jnp.float32).at[h : 2 * h].set(1.0)
            else:
                changes["bias"] = init.draw(
                    self, "bias_initializer", self.bias_initializer, k_bias, (4 * h,), h, 4 * h
                )
        for name in ("hidden_state", "cell_state"):
            if getattr(self, name) is None:
                changes[name] = jnp.zeros((1, h), jnp.float32)
        return self.replace(**changes) if changes else self

    def reset_state(self):
        """The layer with zero states of shape ``(1, num_hidden_units)``."""
        h = self.num_hidden_units
        zeros = {}
        for name in ("hidden_state", "cell_state"):
            value = getattr(self, name)
            zeros[name] = jnp.zeros((1, h), jnp.float32 if value is None else value.dtype)
        return self.replace(**zeros)

    def _check_input_size(self, input_size: int, where: str) -> None:
        if self.input_weights is not None and self.input_weights.shape[0] != input_size:
            raise LayerError(
                f"{who(self)}: {where} has {input_size} channels but input_weights has shape "
                f"{tuple(self.input_weights.shape)}, expecting {self.input_weights.shape[0]}. "
                f"Fix: give input_weights of shape ({input_size}, "
                f"{4 * self.num_hidden_units}), or leave it None."
            )

    def predict(self, x):
        require(self, "input_weights", "recurrent_weights", "bias", "hidden_state", "cell_state")
        data, fmt = data_and_format(x)
        if not fmt:
            if data.ndim != 3:
                raise FormatError(
                    f"{who(self)} takes a plain input only as (batch, time, channels); got shape "
                    f"{tuple(data.shape)}. Fix: label it, e.g. df.dlarray(x, 'TC') for one "
                    "sequence or df.dlarray(x, 'BC') for one time step."
                )
            fmt_in = "BTC"
        elif not _is_sequence_format(fmt):
            raise FormatError(
                f"{who(self)} takes sequence data: a 'C' axis and optionally 'B' and 'T'; got "
                f"format {fmt!r}. Fix: flatten image axes first (Flatten), or relabel the axes."
            )
        else:
            fmt_in = fmt
        self._check_input_size(data.shape[fmt_in.index("C")], "the input")

        # Work in (T, B, C): add the missing axes, then transpose.
        work, work_fmt = data, fmt_in
        for label in "TB":
            if label not in work_fmt:
                work, work_fmt = work[None], label + work_fmt
        perm = [work_fmt.index(label) for label in "TBC"]
        xs = jnp.transpose(work, perm)
        batch = xs.shape[1]
        h = self.num_hidden_units
        states = []
        for name in ("hidden_state", "cell_state"):
            value = getattr(self, name)
            if value.shape[0] not in (1, batch):
                raise LayerError(
                    f"{who(self)}: {name} has batch size {value.shape[0]} (carried from a "
                    f"previous call) but the input has batch size {batch}. Fix: "
                    "layer.reset_state() (net.reset_state()) before a batch of another size."
                )
            states.append(value)
        dtype = jnp.result_type(xs, self.input_weights, self.recurrent_weights, self.bias, *states)
        if not jnp.issubdtype(dtype, jnp.floating):
            dtype = jnp.float32
        w = self.input_weights.astype(dtype)
        r = self.recurrent_weights.astype(dtype)
        b = self.bias.astype(dtype)
        h0, c0 = (jnp.broadcast_to(s.astype(dtype), (batch, h)) for s in states)
        gate = _GATE_ACTIVATIONS[self.gate_activation_function]
        activation = _STATE_ACTIVATIONS[self.state_activation_function]
        # The input projection of every step at once; the scan does only the recurrence.
        projected = jnp.tensordot(xs.astype(dtype), w, axes=1) + jnp.reshape(b, (1, 1, -1))

        sequence = self.output_mode == "sequence"

        def step(carry, z_input):
            h_prev, c_prev = carry
            z = z_input + h_prev @ r
            i, f, g, o = (z[:, k * h : (k + 1) * h] for k in range(4))
            c = gate(f) * c_prev + gate(i) * activation(g)
            h_new = gate(o) * activation(c)
            return (h_new, c), (h_new if sequence else None)

        (h_last, c_last), hs = jax.lax.scan(step, (h0, c0), projected)

        if sequence:
            y = jnp.transpose(hs, [perm.index(a) for a in range(3)])
            for label in "BT":
                if label not in fmt_in:
                    y = jnp.squeeze(y, work_fmt.index(label))
                    work_fmt = work_fmt.replace(label, "")
            out_fmt = fmt_in
        else:
            out_fmt = fmt_in.replace("T", "")  # "BC", "CB" or "C"
            y = h_last.T if out_fmt == "CB" else h_last[0] if out_fmt == "C" else h_last
        new_h = h_last.astype(states[0].dtype)
        new_c = c_last.astype(states[1].dtype)
        return relabel(x, y, out_fmt), new_h, new_c
