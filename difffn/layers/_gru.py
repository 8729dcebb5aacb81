"""``GRU``: MATLAB's ``gruLayer``, on the recurrence of ``df.ops.gru``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from .._core import Data, Output
from .._layer import learnable, state
from ..ops._recurrent import GATE_ACTIVATIONS, RESET_GATE_MODES, STATE_ACTIVATIONS, gru_scan
from . import _initializers as init
from ._checks import choice
from ._recurrent import _Recurrent


class GRU(_Recurrent):
    r"""Gated recurrent unit layer (MATLAB's ``gruLayer``), on ``df.ops.gru``.

    Formats, ``output_mode``, the state's shape and its reset are as for ``LSTM``: input ``C``
    with optional ``B`` and ``T`` in any order (plain input: ``(batch, time, channels)``);
    output every step (``"sequence"``, the input's format with ``H`` channels) or the last
    (``"last"``, without ``T``).

    With the blocks of ``H`` in MATLAB's order (reset $r$, update $z$, candidate):
    $r_t = \sigma(x_t W_r + h_{t-1} R_r + b_r)$,
    $z_t = \sigma(x_t W_z + h_{t-1} R_z + b_z)$,
    $h_t = (1 - z_t) \odot \tilde h_t + z_t \odot h_{t-1}$, with the candidate
    $\tilde h_t$ given by ``reset_gate_mode`` (see ``df.ops.gru``):
    ``"after-multiplication"`` (default) $\tanh(x_t W_h + b_h + r_t \odot (h_{t-1} R_h))$,
    ``"before-multiplication"`` $\tanh(x_t W_h + b_h + (r_t \odot h_{t-1}) R_h)$, or
    ``"recurrent-bias-after-multiplication"``, which adds recurrent biases (``bias`` has ``6H``
    values: input biases, then recurrent biases).

    Learnables: ``input_weights`` ``(input_size, 3H)``, ``recurrent_weights`` ``(H, 3H)``,
    ``bias`` ``(3H,)`` (``(6H,)`` for ``"recurrent-bias-after-multiplication"``); MATLAB's
    transposed, the same gate order. State: ``hidden_state`` ``(batch, H)``, zeros ``(1, H)``
    at first.

    Args:
      num_hidden_units: ``H``.
      output_mode: ``"sequence"`` (default) or ``"last"``.
      reset_gate_mode: ``"after-multiplication"`` (default), ``"before-multiplication"`` or
        ``"recurrent-bias-after-multiplication"``.
      state_activation_function: ``"tanh"`` (default) or ``"softsign"``.
      gate_activation_function: ``"sigmoid"`` (default) or ``"hard-sigmoid"``.
      input_weights, recurrent_weights, bias: the learnables; ``None`` until ``initialize``.
      hidden_state: the initial state, ``(H,)``, ``(1, H)`` or ``(batch, H)``; ``None`` until
        ``initialize`` (zeros).
      input_weights_initializer: ``"glorot"`` (default; fans ``input_size`` and ``3H``),
        ``"he"``, ``"narrow-normal"``, ``"orthogonal"``, ``"zeros"``, ``"ones"`` or a function
        ``fn(key, shape, dtype)`` or ``fn(sz)``.
      recurrent_weights_initializer: ``"orthogonal"`` (default), ``"glorot"``, ``"he"``,
        ``"narrow-normal"``, ``"zeros"``, ``"ones"`` or a function.
      bias_initializer: ``"zeros"`` (default), ``"ones"``, ``"narrow-normal"`` or a function.
      input_weights_learn_rate_factor: multiplies the global learn rate (default 1); so do
        ``recurrent_weights_learn_rate_factor`` and ``bias_learn_rate_factor``.
      input_weights_l2_factor, recurrent_weights_l2_factor: multiply the global L2
        regularization (default 1); bias_l2_factor: the same for the bias (default 0).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> layer = df.layers.GRU(6, output_mode="last")
      >>> layer = layer.initialize(df.Layout((None, 8, 8), "BTC"), key=jax.random.key(0))
      >>> layer.input_weights.shape, layer.recurrent_weights.shape, layer.bias.shape
      ((8, 18), (6, 18), (18,))
      >>> y, h = layer(df.dlarray(jnp.ones((4, 8, 8)), "BTC"))
      >>> y.format, y.shape, h.shape
      ('BC', (4, 6), (4, 6))
    """

    _GATES = 3

    num_hidden_units: int
    _: dataclasses.KW_ONLY
    output_mode: str = "sequence"
    reset_gate_mode: str = "after-multiplication"
    state_activation_function: str = "tanh"
    gate_activation_function: str = "sigmoid"
    input_weights: jax.Array = learnable(default=None)
    recurrent_weights: jax.Array = learnable(default=None)
    bias: jax.Array = learnable(default=None, l2_factor=0.0)  # MATLAB: BiasL2Factor 0
    hidden_state: jax.Array = state(default=None)
    input_weights_initializer: Any = "glorot"
    recurrent_weights_initializer: Any = "orthogonal"
    bias_initializer: Any = "zeros"
    input_weights_learn_rate_factor: float = 1.0
    recurrent_weights_learn_rate_factor: float = 1.0
    bias_learn_rate_factor: float = 1.0
    input_weights_l2_factor: float = 1.0
    recurrent_weights_l2_factor: float = 1.0
    bias_l2_factor: float = 0.0

    def _bias_blocks(self) -> int:
        return 6 if self.reset_gate_mode == "recurrent-bias-after-multiplication" else 3

    def __post_init__(self) -> None:
        choice(self, "reset_gate_mode", self.reset_gate_mode, RESET_GATE_MODES)
        self._check_options(init.BIAS)

    def predict(self, x: Data, *, mask: jax.Array | None = None) -> Output:
        xs, fmt = self._time_major(x)
        batch, h = xs.shape[1], self.num_hidden_units
        (h0,) = self._initial_states(batch)
        dtype = self._dtype(xs, (h0,))
        hs, h_last = gru_scan(
            xs.astype(dtype),
            jnp.broadcast_to(h0.astype(dtype), (batch, h)),
            *(getattr(self, n).astype(dtype) for n in self._learnable_fields),
            mode=self.reset_gate_mode,
            gate=GATE_ACTIVATIONS[self.gate_activation_function],
            act=STATE_ACTIVATIONS[self.state_activation_function],
            sequence=self.output_mode == "sequence",
            mask=self._time_major_mask(mask, xs, fmt),
        )
        return self._output(x, hs, h_last, fmt), h_last.astype(h0.dtype)
