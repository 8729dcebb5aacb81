"""How the sequence ops read formats from their arguments and label their outputs.

An op takes a ``df.FormattedArray`` (its format names the axes) or a plain array with ``fmt=``
(MATLAB's ``DataFormat``); a plain array without ``fmt`` is a ``df.FormatError`` where the op
must find an axis by its label. Outputs of a formatted input are formatted; outputs of a plain
input are plain, in the same axis order (as MATLAB's functions with ``DataFormat``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._core import FormatError, FormattedArray, OpError, dlarray
from .._core import validate_format as _validate_format


def read(op: str, x, fmt, *, argument: str = "x") -> tuple[jax.Array, str, bool]:
    """The plain data, the format and whether ``x`` was formatted.

    Raises:
      FormatError: ``x`` is plain and ``fmt`` is missing or invalid, or ``x`` is formatted and
        ``fmt`` is given too.
    """
    if isinstance(x, FormattedArray):
        x._check_rank(f"df.ops.{op}")
        if fmt is not None:
            raise FormatError(
                f"df.ops.{op}: {argument} is already formatted ({x.format!r}), so fmt={fmt!r} "
                "is ambiguous. Fix: drop fmt (it is for plain arrays only), or relabel with "
                "df.dlarray(x, fmt)."
            )
        return x.data, x.format, True
    if fmt is None:
        raise FormatError(
            f"df.ops.{op}: {argument} is a plain array of shape {tuple(jnp.shape(x))} without a "
            "format, so its axes are unknown. Fix: pass fmt= with one label per axis (e.g. "
            f"fmt='BTC'), or label it with df.dlarray({argument}, fmt)."
        )
    data = jnp.asarray(x)
    return data, _validate_format(fmt, data.ndim, what=f"df.ops.{op}: fmt", shape=data.shape), False


def read_like(op: str, argument: str, value, fmt: str) -> jax.Array:
    """The data of a second argument that must have the format ``fmt`` of the first one.

    A plain ``value`` is taken to be in ``fmt``'s axis order (MATLAB's rule for unformatted
    keys, values and masks).
    """
    if isinstance(value, FormattedArray):
        value._check_rank(f"df.ops.{op}")
        if value.format != fmt:
            raise FormatError(
                f"df.ops.{op}: {argument} has format {value.format!r} but the first input has "
                f"{fmt!r}; they must match. Fix: df.permute({argument}, {fmt!r})."
            )
        return value.data
    data = jnp.asarray(value)
    if data.ndim != len(fmt):
        raise FormatError(
            f"df.ops.{op}: {argument} is a plain array of shape {tuple(data.shape)}, so it is "
            f"read in the first input's format {fmt!r}, which has {len(fmt)} axes. Fix: give it "
            f"{len(fmt)} axes in that order, or a format with df.dlarray."
        )
    return data


def require(op: str, fmt: str, allowed, want: str) -> None:
    """Raise a ``FormatError`` naming ``want`` unless ``allowed(fmt)``."""
    if not allowed(fmt):
        raise FormatError(f"df.ops.{op}: the input format {fmt!r} does not fit; expected {want}.")


def label(y, fmt: str, formatted: bool):
    """``y`` formatted with ``fmt`` when the op's input was formatted (and ``fmt`` is not empty)."""
    return dlarray(y, fmt) if formatted and fmt else y


def float_dtype(*arrays):
    """The common dtype of ``arrays``; float32 when none is floating."""
    dtype = jnp.result_type(*arrays)
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.dtype(jnp.float32)


def to_time_major(data, fmt: str) -> jax.Array:
    """``(T, B, C)`` from a ``B``/``T``/``C`` format; a missing ``T`` or ``B`` becomes size 1."""
    work, work_fmt = data, fmt
    for missing in "TB":
        if missing not in work_fmt:
            work, work_fmt = work[None], missing + work_fmt
    return jnp.transpose(work, [work_fmt.index(a) for a in "TBC"])


def from_time_major(ys, fmt: str) -> jax.Array:
    """The inverse of `to_time_major` for ``(T, B, H)``: ``fmt``'s axis order, ``C = H``."""
    work_fmt = "".join(a for a in "TB" if a not in fmt)[::-1] + fmt
    y = jnp.transpose(ys, ["TBC".index(a) for a in work_fmt])
    extra = len(work_fmt) - len(fmt)
    return y.reshape(y.shape[extra:]) if extra else y


def check_choice(op: str, argument: str, value, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        options = " | ".join(repr(c) for c in choices)
        raise OpError(f"df.ops.{op}: {argument} must be one of {options}; got {value!r}.")
    return value


def shape_error(op: str, argument: str, got, want: str, fix: str) -> OpError:
    return OpError(
        f"df.ops.{op}: {argument} has shape {tuple(jnp.shape(got))}; expected {want}. Fix: {fix}"
    )
