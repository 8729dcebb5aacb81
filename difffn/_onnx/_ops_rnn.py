"""ONNX recurrent operators: ``LSTM``, ``GRU`` and ``RNN``, as ``jax.lax.scan`` over time.

ONNX's gate orders differ from MATLAB's (LSTM: input, output, forget, cell ``iofc``; MATLAB and
difffn: input, forget, cell, output ``ifgo``). These functions follow ONNX; the importer reorders
the weights when it maps an ONNX LSTM onto ``df.layers.LSTM``. ``sequence_lens`` is honoured:
steps past a sequence's length keep the state and output zeros, and the reverse direction runs
each sequence backwards from its own last step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ._ops import Unsupported, op

_ACTIVATIONS = {
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
    "softsign": jax.nn.soft_sign,
    "softplus": jax.nn.softplus,
    "hardsigmoid": lambda z: jnp.clip(0.2 * z + 0.5, 0, 1),
}
_DEFAULTS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _directions(a) -> int:
    return 2 if a.get("direction", "forward") == "bidirectional" else 1


def check_rnn(a, node):
    dtype = node.input_dtypes[0]
    if dtype is not None and not jnp.issubdtype(dtype, jnp.floating):
        raise Unsupported(f"{a.op_type} is implemented for floating-point inputs; got {dtype}")
    direction = a.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise Unsupported(f"direction={direction!r}")
    if a.get("activation_alpha") is not None or a.get("activation_beta") is not None:
        raise Unsupported("activation_alpha/activation_beta")
    for name in _activations(a):
        if name.lower() not in _ACTIVATIONS:
            raise Unsupported(f"the activation {name!r}")


def _activations(a):
    names = a.get("activations")
    default = _DEFAULTS[a.op_type]
    if names is None:
        return default * _directions(a)
    return tuple(names)


def _run_direction(cell, projected, carry, lengths, reverse):
    """Scan ``cell`` over time (axis 0); masks steps past each sequence's length."""
    steps = projected.shape[0]
    t = jnp.arange(steps)[:, None]
    if lengths is None:
        # every sequence is whole: a reversed scan (which df.export_onnx unrolls; a gather
        # of the reversed steps has no ONNX lowering)
        valid = jnp.ones((steps, projected.shape[1]), bool)
        order = None
    else:
        valid = t < lengths[None, :]
        # reversed within each sequence: step t reads step length - 1 - t
        order = jnp.where(valid, lengths[None, :] - 1 - t, t) if reverse else None
    if order is not None:
        projected = jnp.take_along_axis(projected, order[:, :, None], axis=0)

    def step(carry, inputs):
        z, ok = inputs
        new_carry, h = cell(carry, z)
        ok = ok[:, None]
        new_carry = tuple(jnp.where(ok, n, c) for n, c in zip(new_carry, carry))
        return new_carry, jnp.where(ok, h, jnp.zeros_like(h))

    carry, hs = lax.scan(step, carry, (projected, valid), reverse=reverse and order is None)
    if order is not None:
        hs = jnp.take_along_axis(hs, order[:, :, None], axis=0)
    return carry, hs


def _batched(state, batch: int, dtype):
    return jnp.broadcast_to(state.astype(dtype), (batch, state.shape[-1]))


def _rnn(a, x, w, r, b, lengths, h0, c0=None, p=None):
    kind = a.op_type
    gates = _GATES[kind]
    hidden = int(a.get("hidden_size", r.shape[-1]))
    layout = a.get("layout", 0)
    if layout:
        x = jnp.swapaxes(x, 0, 1)
        h0 = None if h0 is None else jnp.swapaxes(h0, 0, 1)
        c0 = None if c0 is None else jnp.swapaxes(c0, 0, 1)
    steps, batch = x.shape[:2]
    dtype = jnp.result_type(x, w)
    directions = _directions(a)
    activations = [_ACTIVATIONS[name.lower()] for name in _activations(a)]
    per_direction = len(activations) // directions
    clip = a.get("clip")
    lengths = None if lengths is None else jnp.asarray(lengths).astype(jnp.int32)
    ys, last_h, last_c = [], [], []
    for d in range(directions):
        f, *rest = activations[d * per_direction : (d + 1) * per_direction]
        wd, rd = w[d].astype(dtype), r[d].astype(dtype)
        bd = jnp.zeros(2 * gates * hidden, dtype) if b is None else b[d].astype(dtype)
        projected = jnp.einsum("tni,gi->tng", x.astype(dtype), wd)
        projected = projected + bd[None, None, : gates * hidden]
        rb = bd[None, gates * hidden :]
        # initial states of batch size 1 (a file exported at batch 1) serve every sequence
        h = jnp.zeros((batch, hidden), dtype) if h0 is None else _batched(h0[d], batch, dtype)

        def clipped(z):
            return z if clip is None else jnp.clip(z, -clip, clip)

        if kind == "LSTM":
            g, act_h = rest
            c = jnp.zeros((batch, hidden), dtype) if c0 is None else _batched(c0[d], batch, dtype)
            pd = None if p is None else p[d].astype(dtype)
            couple = bool(a.get("input_forget", 0))

            def lstm_cell(carry, z, rd=rd, rb=rb, pd=pd, f=f, g=g, act_h=act_h, couple=couple):
                h_prev, c_prev = carry
                z = z + h_prev @ rd.T + rb
                zi, zo, zf, zc = (z[:, k * hidden : (k + 1) * hidden] for k in range(4))
                if pd is not None:
                    zi = zi + pd[None, :hidden] * c_prev
                    zf = zf + pd[None, 2 * hidden :] * c_prev
                i = f(clipped(zi))
                forget = 1 - i if couple else f(clipped(zf))
                c_new = forget * c_prev + i * g(clipped(zc))
                if pd is not None:
                    zo = zo + pd[None, hidden : 2 * hidden] * c_new
                h_new = f(clipped(zo)) * act_h(c_new)
                return (h_new, c_new), h_new

            (h, c), hs = _run_direction(
                lstm_cell, projected, (h, c), lengths, d == 1 or _reverse(a)
            )
            last_c.append(c)
        elif kind == "GRU":
            (g,) = rest
            before = bool(a.get("linear_before_reset", 0))

            def gru_cell(carry, z, rd=rd, rb=rb, f=f, g=g, before=before):
                (h_prev,) = carry
                rz, rr, rh = (rd[k * hidden : (k + 1) * hidden] for k in range(3))
                bz, br, bh = (rb[:, k * hidden : (k + 1) * hidden] for k in range(3))
                xz, xr, xh = (z[:, k * hidden : (k + 1) * hidden] for k in range(3))
                zt = f(clipped(xz + h_prev @ rz.T + bz))
                rt = f(clipped(xr + h_prev @ rr.T + br))
                if before:
                    candidate = g(clipped(xh + rt * (h_prev @ rh.T + bh)))
                else:
                    candidate = g(clipped(xh + (rt * h_prev) @ rh.T + bh))
                h_new = (1 - zt) * candidate + zt * h_prev
                return (h_new,), h_new

            (h,), hs = _run_direction(gru_cell, projected, (h,), lengths, d == 1 or _reverse(a))
        else:

            def rnn_cell(carry, z, rd=rd, rb=rb, f=f):
                (h_prev,) = carry
                h_new = f(clipped(z + h_prev @ rd.T + rb))
                return (h_new,), h_new

            (h,), hs = _run_direction(rnn_cell, projected, (h,), lengths, d == 1 or _reverse(a))
        ys.append(hs)
        last_h.append(h)
    y = jnp.stack(ys, axis=1)  # (T, D, N, H)
    y_h = jnp.stack(last_h)  # (D, N, H)
    y_c = jnp.stack(last_c) if last_c else None
    if layout:
        y = jnp.transpose(y, (2, 0, 1, 3))
        y_h = jnp.swapaxes(y_h, 0, 1)
        y_c = None if y_c is None else jnp.swapaxes(y_c, 0, 1)
    return (y, y_h) if y_c is None else (y, y_h, y_c)


def _reverse(a) -> bool:
    return a.get("direction", "forward") == "reverse"


def _rnn_labels(ctx):
    sequence = "BTUC" if ctx.a.get("layout", 0) else "TUBC"
    state = "BUC" if ctx.a.get("layout", 0) else "UBC"
    return [sequence, state, state][: len(ctx.out_shapes)]


@op("LSTM", check=check_rnn, labels=_rnn_labels)
def lstm(a, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
    return _rnn(a, x, w, r, b, sequence_lens, initial_h, initial_c, p)


@op("GRU", check=check_rnn, labels=_rnn_labels)
def gru(a, x, w, r, b=None, sequence_lens=None, initial_h=None):
    return _rnn(a, x, w, r, b, sequence_lens, initial_h)


@op("RNN", check=check_rnn, labels=_rnn_labels)
def rnn(a, x, w, r, b=None, sequence_lens=None, initial_h=None):
    return _rnn(a, x, w, r, b, sequence_lens, initial_h)
