"""Padding masks: which time steps of a batch of padded sequences hold data.

A padding mask is a boolean array ``(batch, time)``, True at the steps that hold data and False
at padding (MATLAB's ``padsequences`` mask, without its channel axis). It travels beside the
data, never inside it: ``net.predict(x, mask=m)``, ``net.forward(x, mask=m)``, the ``mask=``
argument of ``df.ops.lstm``/``df.ops.gru`` and of the losses and metrics, and inside a network
from each input to the values computed from it (``_execute``). A value carries its input's mask
while it keeps that input's ``B`` and ``T`` sizes (a fully connected layer on ``"BTC"``); a
value without ``T`` (an LSTM's ``"last"`` output) carries none.

This module lays a mask onto a value: plain values are read batch first, time second (MATLAB's
``"BTC"`` in storage order), formatted values by their ``B`` and ``T`` labels.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ._errors import Error
from ._format import FormattedArray, dims, stripdims


def value_axes(y) -> tuple[int | None, int | None]:
    """``(batch axis, time axis)`` of a value: its ``B`` and ``T`` labels, else 0 and 1."""
    fmt = dims(y)
    if fmt:
        return fmt.find("B") if "B" in fmt else None, fmt.find("T") if "T" in fmt else None
    ndim = jnp.ndim(stripdims(y))
    return (0 if ndim >= 1 else None), (1 if ndim >= 3 else None)


def as_mask(mask, *, who: str, error: type[Error]):
    """A mask as a boolean ``(batch, time)`` array (or ``(batch,)``, one flag per observation).

    Accepts booleans or 0/1 numbers, plain (batch first) or formatted (``"BT"``, ``"TB"``,
    ``"B"``). ``error`` is the class of the error for a mask that is none of these.
    """
    if isinstance(mask, FormattedArray):
        fmt = mask.format
        if sorted(fmt) not in (["B", "T"], ["B"]):
            raise error(
                f"{who}: a mask has format {fmt!r}; expected 'BT' (or 'TB'), one value per "
                "observation and time step. Fix: label it df.dlarray(mask, 'BT')."
            )
        data = mask.data if fmt in ("BT", "B") else mask.data.T
    else:
        data = mask
    if not hasattr(data, "dtype"):
        data = np.asarray(data)
    if data.ndim not in (1, 2) or not (
        jnp.issubdtype(data.dtype, jnp.bool_) or jnp.issubdtype(data.dtype, jnp.number)
    ):
        raise error(
            f"{who}: a mask must be a boolean (batch, time) array, True at the steps that hold "
            f"data; got {type(mask).__name__} of shape {tuple(np.shape(data))} and dtype "
            f"{data.dtype}. Fix: e.g. the mask returned by df.padsequences."
        )
    return data if jnp.issubdtype(data.dtype, jnp.bool_) else data != 0


def fits(mask, y) -> bool:
    """Whether ``mask`` has the sizes of ``y``'s batch and time axes (``(batch,)``: batch)."""
    if mask is None or y is None:
        return False
    b, t = value_axes(y)
    shape = jnp.shape(stripdims(y))
    if b is None:
        return False
    if jnp.ndim(mask) == 1:
        return shape[b] == mask.shape[0]
    return t is not None and (shape[b], shape[t]) == tuple(mask.shape)


def spread(mask, y):
    """``mask`` with ``y``'s number of axes: its sizes at ``y``'s ``B`` (and ``T``) axes, 1
    elsewhere, so that it broadcasts against ``y`` (the caller checked `fits`)."""
    b, t = value_axes(y)
    ndim = jnp.ndim(stripdims(y))
    if jnp.ndim(mask) == 1:
        keep = (b,)
    else:
        keep = (b, t)
        assert b is not None and t is not None  # the caller checked `fits`
        if t < b:
            mask = mask.T
    return jnp.expand_dims(mask, tuple(a for a in range(ndim) if a not in keep))


def for_value(mask, y):
    """The mask of value ``y`` in a network run from an input with ``mask``: the mask where
    ``y`` keeps the input's batch and time sizes, else None."""
    return mask if mask is not None and jnp.ndim(mask) == 2 and fits(mask, y) else None


def time_major(mask):
    """``(time, batch)``, as recurrences scan it."""
    return jnp.swapaxes(mask, 0, 1)


def prepare(names, xs, masks, *, error: type[Error]):
    """Padding masks for network inputs ``xs`` named ``names``: one mask (for one input) or a
    tuple with one per input; checked against the inputs' sizes. None when there is none."""
    if masks is None:
        return None
    if not isinstance(masks, tuple):
        if len(xs) != 1:
            raise error(
                f"the network has {len(xs)} inputs {list(names)}; give mask= as a tuple with "
                "one mask (or None) per input."
            )
        masks = (masks,)
    if len(masks) != len(xs):
        raise error(
            f"mask= has {len(masks)} entries but the network has {len(xs)} inputs "
            f"{list(names)}. Fix: one mask (or None) per input."
        )
    prepared = []
    for name, x, m in zip(names, xs, masks, strict=True):
        if m is not None:
            m = as_mask(m, who=f"the mask of input {name!r}", error=error)
            if m.ndim != 2 or not fits(m, x):
                shape = jnp.shape(stripdims(x))
                sizes = tuple(shape[a] if a is not None else None for a in value_axes(x))
                raise error(
                    f"the mask of input {name!r} has shape {tuple(m.shape)}; it must be "
                    f"(batch, time) = {sizes}, the input's 'B' and 'T' sizes. Fix: one flag per "
                    "observation and time step (df.padsequences returns it)."
                )
        prepared.append(m)
    return None if all(m is None for m in prepared) else tuple(prepared)
