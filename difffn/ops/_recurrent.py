r"""``df.ops.lstm`` and ``df.ops.gru``: MATLAB's ``lstm`` and ``gru`` functions over ``T``.

Both run in ``jax.lax.scan``, each step projecting its own input (as flax's cells do): on CPU that
keeps the per-step arrays in cache, and it measured about 25% faster for forward+backward than
projecting all steps in one product before the scan (``benchmarks/bench_layers.py`` sizes). Gate
blocks are cut with ``jnp.split``, whose transpose is a concatenation (slices transpose to pads
and adds, slower in XLA's CPU backward scan). The layers ``LSTM``, ``BiLSTM`` and ``GRU`` call
`lstm_scan` and `gru_scan`, the same recurrences: one implementation per operation.

Weights are stored for storage-order data: MATLAB's ``weights`` (``G*H x C``) transposed to
``(C, G*H)``, with MATLAB's gate order (LSTM: input, forget, cell candidate, output; GRU: reset,
update, candidate).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._core import Data, FormattedArray, OpError, Output
from ._format_args import (
    check_choice,
    float_dtype,
    from_time_major,
    label,
    read,
    require,
    shape_error,
    to_time_major,
)

STATE_ACTIVATIONS = {"tanh": jnp.tanh, "softsign": jax.nn.soft_sign}
GATE_ACTIVATIONS = {
    "sigmoid": jax.nn.sigmoid,
    "hard-sigmoid": lambda z: jnp.clip(0.2 * z + 0.5, 0.0, 1.0),
}
RESET_GATE_MODES = (
    "after-multiplication",
    "before-multiplication",
    "recurrent-bias-after-multiplication",
)
_SEQUENCE = "a 'C' axis and optionally 'B' and 'T', in any order (e.g. 'BTC', 'TBC', 'CBT')"


def is_sequence_format(fmt: str) -> bool:
    """Whether ``fmt`` has a ``C`` axis and otherwise only ``B`` and ``T``."""
    return "C" in fmt and set(fmt) <= set("BTC")


def lstm_scan(xs, h0, c0, w, r, b, *, gate, act, reverse=False, sequence=True, mask=None):
    """The LSTM recurrence on ``xs`` of shape ``(T, B, C)``.

    Returns:
      ``(hs, h, c)``: the hidden states of every step ``(T, B, H)`` (``None`` unless
      ``sequence``) and the final hidden and cell states ``(B, H)``. ``reverse`` runs from the
      last step to the first (the backward direction of a BiLSTM), ``hs`` still in time order.
      With a padding ``mask`` ``(T, B)`` (True at data), see `_masked`.
    """
    bias = jnp.reshape(b, (1, -1))

    def cell(carry, x_t):
        h_prev, c_prev = carry
        z = x_t @ w + bias + h_prev @ r
        i, f, g, o = jnp.split(z, 4, axis=1)
        c = gate(f) * c_prev + gate(i) * act(g)
        h = gate(o) * act(c)
        return (h, c), h

    (h, c), hs = jax.lax.scan(_masked(cell, sequence, mask), (h0, c0), _with(xs, mask),
                              reverse=reverse)  # fmt: skip
    return hs, h, c


def _with(xs, mask):
    return xs if mask is None else (xs, mask)


def _masked(cell, sequence: bool, mask):
    """The scan body: ``cell(carry, x_t) -> (carry, h)``, its output kept only if
    ``sequence``; with a padding mask, a padded step leaves the carry as it was and outputs
    zeros. So the final state is that of the last step with data (right padding), a state
    starts at the first step with data (left padding), and a BiLSTM's backward direction
    starts at the last step with data."""
    if mask is None:

        def step(carry, x_t):
            carry, h = cell(carry, x_t)
            return carry, (h if sequence else None)

        return step

    def masked_step(carry, inputs):
        x_t, m_t = inputs
        new, h = cell(carry, x_t)
        keep = m_t[:, None]
        carry = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new, carry)
        return carry, (jnp.where(keep, h, jnp.zeros_like(h)) if sequence else None)

    return masked_step


def gru_scan(xs, h0, w, r, b, *, mode, gate, act, reverse=False, sequence=True, mask=None):
    r"""The GRU recurrence on ``xs`` of shape ``(T, B, C)``; returns ``(hs, h)`` as LSTM's
    (a padding ``mask`` works as there)."""
    n = r.shape[0]
    b_input, b_recurrent = (b[None, : 3 * n], b[None, 3 * n :]) if b.shape[0] == 6 * n else (
        b[None], None)  # fmt: skip

    if mode == "before-multiplication":
        r_gates, r_candidate = jnp.split(r, [2 * n], axis=1)

        def cell(h_prev, x_t):
            z_reset, z_update, z_candidate = jnp.split(x_t @ w + b_input, 3, axis=1)
            rec_reset, rec_update = jnp.split(h_prev @ r_gates, 2, axis=1)
            reset = gate(z_reset + rec_reset)
            update = gate(z_update + rec_update)
            candidate = act(z_candidate + (reset * h_prev) @ r_candidate)
            h = (1 - update) * candidate + update * h_prev
            return h, h

    else:

        def cell(h_prev, x_t):
            z_rec = h_prev @ r
            if b_recurrent is not None:
                z_rec = z_rec + b_recurrent
            z_reset, z_update, z_candidate = jnp.split(x_t @ w + b_input, 3, axis=1)
            rec_reset, rec_update, rec_candidate = jnp.split(z_rec, 3, axis=1)
            reset = gate(z_reset + rec_reset)
            update = gate(z_update + rec_update)
            candidate = act(z_candidate + reset * rec_candidate)
            h = (1 - update) * candidate + update * h_prev
            return h, h

    h, hs = jax.lax.scan(_masked(cell, sequence, mask), h0, _with(xs, mask), reverse=reverse)
    return hs, h


def lstm(
    x: Data,
    hidden_state: Data,
    cell_state: Data,
    weights: Data,
    recurrent_weights: Data,
    bias: Data,
    *,
    fmt: str | None = None,
    mask: jax.Array | None = None,
    state_activation_function: str = "tanh",
    gate_activation_function: str = "sigmoid",
) -> Output:
    r"""Long short-term memory over the ``T`` axis (MATLAB's ``lstm`` function).

    With $z = x_t W + h_{t-1} R + b$ split into four blocks of ``H`` in MATLAB's gate
    order (input $i$, forget $f$, cell candidate $g$, output $o$):
    $c_t = \sigma(f) c_{t-1} + \sigma(i) \tanh(g)$, $h_t = \sigma(o) \tanh(c_t)$
    ($\sigma$, $\tanh$: the gate and state activation functions).

    Args:
      x: the sequence: a ``C`` axis and optionally ``B`` and ``T`` in any order (``"BTC"``,
        ``"CBT"``, ...; without ``T`` one step, without ``B`` one sequence). A plain array
        needs ``fmt``.
      hidden_state, cell_state: the initial states: plain ``(H,)``, ``(1, H)`` or
        ``(batch, H)``, or formatted ``"BC"``, ``"CB"`` or ``"C"``.
      weights: ``(C, 4H)`` (MATLAB's ``weights`` transposed).
      recurrent_weights: ``(H, 4H)``.
      bias: ``(4H,)``.
      fmt: the format of a plain ``x`` (MATLAB's ``DataFormat``).
      mask: a padding mask (difffn's; MATLAB's function has none): booleans ``(batch, time)``
        (``(time,)`` without ``B``; or formatted ``"BT"``/``"TB"``), True at the steps that
        hold data. A padded step leaves the state as it was and outputs zeros, so the final
        states are those after the last step with data, whatever the padding's side.
      state_activation_function: ``"tanh"`` (default) or ``"softsign"``.
      gate_activation_function: ``"sigmoid"`` (default) or ``"hard-sigmoid"``
        (``clip(0.2 z + 0.5, 0, 1)``).

    Returns:
      ``(y, h, c)``: the hidden state of every step in ``x``'s format with ``H`` channels, and
      the final hidden and cell states ``(batch, H)`` (``(1, H)`` without ``B``) in the dtype
      and format of the initial ones (plain, ``"BC"`` or ``"CB"``; ``"C"`` stays ``"C"`` only
      without ``B``).

    Raises:
      FormatError: ``x`` has no format, or one with axes other than ``B``, ``T``, ``C``.
      OpError: a parameter has the wrong shape, or an option is unknown.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> H = 2
      >>> x = df.dlarray(jnp.ones((3, 5, 4)), "BTC")
      >>> y, h, c = df.ops.lstm(x, jnp.zeros(H), jnp.zeros(H), jnp.full((4, 4 * H), 0.1),
      ...                       jnp.zeros((H, 4 * H)), jnp.zeros(4 * H))
      >>> y.format, y.shape, h.shape
      ('BTC', (3, 5, 2), (3, 2))
      >>> bool(jnp.allclose(y.data[:, -1], h))
      True
      >>> lengths = jnp.array([5, 3, 4])
      >>> mask = jnp.arange(5)[None, :] < lengths[:, None]      # right padding
      >>> y, h, c = df.ops.lstm(x, jnp.zeros(H), jnp.zeros(H), jnp.full((4, 4 * H), 0.1),
      ...                       jnp.zeros((H, 4 * H)), jnp.zeros(4 * H), mask=mask)
      >>> bool(jnp.allclose(h[1], y.data[1, 2])), float(jnp.abs(y.data[1, 3:]).max())
      (True, 0.0)
    """
    data, fmt, formatted = read("lstm", x, fmt)
    require("lstm", fmt, is_sequence_format, _SEQUENCE)
    act, gate = _activations("lstm", state_activation_function, gate_activation_function)
    xs = to_time_major(data, fmt)
    n = _hidden_size("lstm", recurrent_weights, 4)
    w, r, b = _parameters("lstm", xs.shape[2], n, 4, weights, recurrent_weights, bias)
    batch = xs.shape[1]
    (h0, h_fmt), (c0, c_fmt) = (
        _read_state("lstm", name, value, batch, n)
        for name, value in (("hidden_state", hidden_state), ("cell_state", cell_state))
    )
    dtype = float_dtype(xs, w, r, b, h0, c0)
    hs, h, c = lstm_scan(
        xs.astype(dtype),
        jnp.broadcast_to(h0.astype(dtype), (batch, n)),
        jnp.broadcast_to(c0.astype(dtype), (batch, n)),
        w.astype(dtype),
        r.astype(dtype),
        b.astype(dtype),
        gate=gate,
        act=act,
        mask=_time_major_mask("lstm", mask, xs.shape, fmt),
    )
    y = label(from_time_major(hs, fmt), fmt, formatted)
    has_batch = "B" in fmt
    return (
        y,
        _write_state(h.astype(h0.dtype), h_fmt, has_batch),
        _write_state(c.astype(c0.dtype), c_fmt, has_batch),
    )


def gru(
    x: Data,
    hidden_state: Data,
    weights: Data,
    recurrent_weights: Data,
    bias: Data,
    *,
    fmt: str | None = None,
    mask: jax.Array | None = None,
    reset_gate_mode: str = "after-multiplication",
    state_activation_function: str = "tanh",
    gate_activation_function: str = "sigmoid",
) -> Output:
    r"""Gated recurrent unit over the ``T`` axis (MATLAB's ``gru`` function).

    With the blocks of ``H`` in MATLAB's order (reset $r$, update $z$, candidate):
    $r_t = \sigma(x_t W_r + h_{t-1} R_r + b_r)$,
    $z_t = \sigma(x_t W_z + h_{t-1} R_z + b_z)$,
    $h_t = (1 - z_t) \odot \tilde h_t + z_t \odot h_{t-1}$, and the candidate
    $\tilde h_t$ by ``reset_gate_mode``:

    - ``"after-multiplication"`` (MATLAB's default; flax's ``GRUCell``):
      $\tanh(x_t W_h + b_h + r_t \odot (h_{t-1} R_h))$;
    - ``"before-multiplication"``: $\tanh(x_t W_h + b_h + (r_t \odot h_{t-1}) R_h)$;
    - ``"recurrent-bias-after-multiplication"`` (cuDNN's and PyTorch's): ``bias`` has ``6H``
      values, the input biases $b_W$ then the recurrent biases $b_R$ (each in gate
      order), $b_R$ added to $h_{t-1} R$ in every gate and
      $\tilde h_t = \tanh(x_t W_h + b_{Wh} + r_t \odot (h_{t-1} R_h + b_{Rh}))$.

    Args:
      x: the sequence, as for [`lstm`][difffn.ops.lstm].
      hidden_state: the initial hidden state, as for [`lstm`][difffn.ops.lstm].
      weights: ``(C, 3H)`` (MATLAB's ``weights`` transposed).
      recurrent_weights: ``(H, 3H)``.
      bias: ``(3H,)``, or ``(6H,)`` with ``"recurrent-bias-after-multiplication"``.
      fmt: the format of a plain ``x``.
      mask: a padding mask, as for [`lstm`][difffn.ops.lstm].
      reset_gate_mode: see above (default ``"after-multiplication"``).
      state_activation_function: ``"tanh"`` (default) or ``"softsign"``.
      gate_activation_function: ``"sigmoid"`` (default) or ``"hard-sigmoid"``.

    Returns:
      ``(y, h)``: every step's hidden state in ``x``'s format with ``H`` channels, and the final
      hidden state, as for [`lstm`][difffn.ops.lstm].

    Raises:
      FormatError: ``x`` has no format, or one with axes other than ``B``, ``T``, ``C``.
      OpError: a parameter has the wrong shape, or an option is unknown.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = jnp.ones((5, 3))  # one sequence: 5 steps of 3 channels
      >>> y, h = df.ops.gru(x, jnp.zeros(2), jnp.full((3, 6), 0.1), jnp.zeros((2, 6)),
      ...                   jnp.zeros(6), fmt="TC")
      >>> y.shape, h.shape, type(y).__name__
      ((5, 2), (1, 2), 'ArrayImpl')
    """
    data, fmt, formatted = read("gru", x, fmt)
    require("gru", fmt, is_sequence_format, _SEQUENCE)
    mode = check_choice("gru", "reset_gate_mode", reset_gate_mode, RESET_GATE_MODES)
    act, gate = _activations("gru", state_activation_function, gate_activation_function)
    xs = to_time_major(data, fmt)
    n = _hidden_size("gru", recurrent_weights, 3)
    bias_blocks = 6 if mode == "recurrent-bias-after-multiplication" else 3
    w, r, b = _parameters("gru", xs.shape[2], n, 3, weights, recurrent_weights, bias, bias_blocks)
    batch = xs.shape[1]
    h0, h_fmt = _read_state("gru", "hidden_state", hidden_state, batch, n)
    dtype = float_dtype(xs, w, r, b, h0)
    hs, h = gru_scan(
        xs.astype(dtype),
        jnp.broadcast_to(h0.astype(dtype), (batch, n)),
        w.astype(dtype),
        r.astype(dtype),
        b.astype(dtype),
        mode=mode,
        gate=gate,
        act=act,
        mask=_time_major_mask("gru", mask, xs.shape, fmt),
    )
    y = label(from_time_major(hs, fmt), fmt, formatted)
    return y, _write_state(h.astype(h0.dtype), h_fmt, "B" in fmt)


def _activations(op: str, state_activation_function: str, gate_activation_function: str):
    """The state and gate activation functions that the options name (checked)."""
    act = check_choice(
        op, "state_activation_function", state_activation_function, STATE_ACTIVATIONS
    )
    gate = check_choice(op, "gate_activation_function", gate_activation_function, GATE_ACTIVATIONS)
    return STATE_ACTIVATIONS[act], GATE_ACTIVATIONS[gate]


def _time_major_mask(op: str, mask, shape, fmt: str):
    """A padding mask as ``(T, B)`` booleans for a time-major input of ``shape`` (T, B, C)."""
    if mask is None:
        return None
    if "T" not in fmt:
        raise OpError(
            f"df.ops.{op}: mask= marks padded time steps, but the input's format {fmt!r} has "
            "no 'T' axis. Fix: leave mask out for a single time step."
        )
    steps, batch = shape[0], shape[1]
    if isinstance(mask, FormattedArray):
        mask_fmt = mask.format
        if sorted(mask_fmt) != sorted(a for a in "BT" if a in fmt):
            raise OpError(
                f"df.ops.{op}: mask has format {mask_fmt!r}; for an input of format {fmt!r} "
                f"it must be {'BT' if 'B' in fmt else 'T'!r} (in any order). Fix: relabel it."
            )
        data = mask.data if "B" in mask_fmt else mask.data[None]
        data = data if mask_fmt in ("BT", "T") else data.T
    else:
        data = jnp.asarray(mask)
        data = data[None] if "B" not in fmt and data.ndim == 1 else data
    if data.shape != (batch, steps):
        want = f"(batch, time) = {(batch, steps)}" if "B" in fmt else f"(time,) = ({steps},)"
        raise shape_error(op, "mask", mask, want, "give one flag per observation and step.")
    return jnp.swapaxes(data if data.dtype == jnp.bool_ else data != 0, 0, 1)


def _hidden_size(op: str, recurrent_weights, blocks: int) -> int:
    shape = jnp.shape(recurrent_weights)
    if len(shape) != 2 or shape[1] != blocks * shape[0] or shape[0] == 0:
        raise shape_error(
            op,
            "recurrent_weights",
            recurrent_weights,
            f"(H, {blocks} * H) for H hidden units",
            f"give one ({blocks}H)-column block per hidden unit row, gates in MATLAB's order.",
        )
    return shape[0]


def _parameters(op, channels, n, blocks, weights, recurrent_weights, bias, bias_blocks=None):
    bias_blocks = bias_blocks or blocks
    w, r, b = (jnp.asarray(a) for a in (weights, recurrent_weights, bias))
    if w.shape != (channels, blocks * n):
        raise shape_error(
            op,
            "weights",
            w,
            f"({channels}, {blocks * n}): (input channels, {blocks} * H) with H = {n} from "
            "recurrent_weights",
            "transpose MATLAB's weights, or check the input's channel count.",
        )
    if b.shape != (bias_blocks * n,):
        raise shape_error(
            op, "bias", b, f"({bias_blocks * n},): {bias_blocks} * H with H = {n}",
            "give one value per gate and hidden unit"
            + (" (input biases, then recurrent biases)." if bias_blocks == 6 else "."),
        )  # fmt: skip
    return w, r, b


def _read_state(op: str, name: str, value, batch: int, n: int):
    """``(array of shape (1 or batch, H), output format or None)`` for an initial state."""
    if isinstance(value, FormattedArray):
        value._check_rank(f"df.ops.{op}")
        fmt = value.format
        if fmt not in ("BC", "CB", "C"):
            raise OpError(
                f"df.ops.{op}: {name} has format {fmt!r}; expected 'BC', 'CB' or 'C'. Fix: "
                "relabel it, or pass a plain (batch, H) array."
            )
        data = value.data.T if fmt == "CB" else value.data
        array = data[None] if fmt == "C" else data
    else:
        fmt, array = None, jnp.asarray(value)
        array = array[None] if array.ndim == 1 else array
    if array.ndim != 2 or array.shape[1] != n or array.shape[0] not in (1, batch):
        raise shape_error(
            op,
            name,
            value,
            f"({n},), (1, {n}) or (batch, {n}) with batch = {batch} (H = {n})",
            "give one state per observation, or one that broadcasts.",
        )
    if not jnp.issubdtype(array.dtype, jnp.floating):
        array = array.astype(jnp.float32)
    return array, fmt


def _write_state(state, fmt: str | None, has_batch: bool):
    if fmt is None:
        return state
    if fmt == "C" and not has_batch:
        return label(state[0], "C", True)
    return label(state.T if fmt == "CB" else state, "CB" if fmt == "CB" else "BC", True)
