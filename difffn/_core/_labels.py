"""Format strings: the axis labels and the rules a format follows.

A format is a string with one label per axis: ``S`` (spatial), ``C`` (channel), ``B`` (batch),
``T`` (time), ``U`` (unspecified). ``C``, ``B`` and ``T`` appear at most once; ``S`` and ``U``
may repeat. Labels name the axes in storage order (``"BSSC"`` is NHWC).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ._errors import FormatError, type_name

_LABELS = "SCBTU"
_UNIQUE_LABELS = "CBT"
_LABEL_HELP = "S (spatial), C (channel), B (batch), T (time), U (unspecified)"


def _validate_format(
    fmt: object, ndim: int | None = None, *, what: str = "fmt", shape: Any = None
) -> str:
    """Check a format string and return it; the shared validator for every module.

    Args:
        fmt: the candidate format.
        ndim: the rank the format must describe; ``None`` skips the label-count check.
        what: how messages name ``fmt`` (``"Layout fmt"``, ``"MyLayer: output format"``).
        shape: the array's shape, only to make the label-count message concrete.

    Returns:
        ``fmt`` as a ``str``.

    Raises:
        FormatError: ``fmt`` is not a string, has a label outside ``SCBTU``, repeats ``C``,
            ``B`` or ``T``, or has a label count different from ``ndim``.

    Examples:
        >>> from difffn._core._labels import _validate_format
        >>> _validate_format("BSSC", 4)
        'BSSC'
        >>> _validate_format("BSC", 4, what="Conv2D input format")
        Traceback (most recent call last):
        ...
        difffn.FormatError: Conv2D input format 'BSC' has 3 labels but the array ...
    """
    if not isinstance(fmt, str):
        raise FormatError(
            f"{what} must be a format string with one label per axis from {_LABEL_HELP}, "
            f"such as 'BSSC'; got {type_name(fmt)} {fmt!r}. Fix: pass the format as a string, "
            "e.g. 'BC' for (batch, channels)."
        )
    bad = sorted({label for label in fmt if label not in _LABELS})
    if bad:
        hint = ""
        if all(label in _LABELS for label in fmt.upper()):
            hint = f" Labels are upper case: use {fmt.upper()!r}."
        raise FormatError(
            f"{what} {fmt!r} has invalid label(s) {', '.join(map(repr, bad))}; valid labels are "
            f"{_LABEL_HELP}.{hint} Fix: label each axis with one of those letters."
        )
    counts = Counter(fmt)
    for label in _UNIQUE_LABELS:
        if counts[label] > 1:
            raise FormatError(
                f"{what} {fmt!r} has label {label!r} {counts[label]} times; C, B and T may appear "
                f"at most once (only S and U may repeat). Fix: label the extra axes 'S' or 'U'."
            )
    if ndim is not None and len(fmt) != ndim:
        got = f" (shape {tuple(shape)})" if shape is not None else ""
        raise FormatError(
            f"{what} {fmt!r} has {len(fmt)} labels but the array has {ndim} dimensions{got}; "
            f"give exactly one label per axis. Fix: a format with {ndim} labels, e.g. "
            f"{'BSSC'[:ndim] if ndim <= 4 else 'B' + 'S' * (ndim - 1)!r}."
        )
    return fmt


def _validate_label(label: object, *, what: str = "label") -> str:
    """Check a single axis label (``"S"``, ``"C"``, ``"B"``, ``"T"`` or ``"U"``) and return it."""
    if not (isinstance(label, str) and len(label) == 1 and label in _LABELS):
        raise FormatError(
            f"{what} must be one of 'S', 'C', 'B', 'T', 'U' ({_LABEL_HELP}); got {label!r}. "
            "Fix: pass one of those letters."
        )
    return label
