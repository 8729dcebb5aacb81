"""Formats (MATLAB's ``dlarray`` labels) and data layouts (``networkDataLayout``).

The public functions on formatted arrays and layouts: [`dlarray`][difffn.dlarray],
  [`dims`][difffn.dims],
[`finddim`][difffn.finddim], [`stripdims`][difffn.stripdims], [`permute`][difffn.permute], and
[`Layout`][difffn.Layout]. The array class itself
lives in ``_formatted_array.py``, the label rules in ``_labels.py``.

Unlike MATLAB, labels name the axes in **storage order** (``"BSSC"`` is NHWC) and nothing is ever
permuted behind the user's back: [`permute`][difffn.permute] is the one explicit transpose.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import FormatError, type_name
from ._formatted_array import FormattedArray, asarray
from ._labels import _UNIQUE_LABELS, _validate_format, _validate_label

__all__ = ["FormattedArray", "Layout", "dims", "dlarray", "finddim", "permute", "stripdims"]


class Layout:
    """MATLAB's ``networkDataLayout``: sizes (``None`` = unknown) and a format, without data.

    Immutable and hashable, so it can be a ``jax.jit`` static argument or a dict key.

    Args:
        shape: one size per axis, each a non-negative ``int`` or ``None``.
        fmt: one label per axis.

    Raises:
        FormatError: a size is not a non-negative int or ``None``, or ``fmt`` is not a valid
            format for ``len(shape)`` axes.

    Examples:
        >>> import difffn as df
        >>> layout = df.Layout((None, 24, 24, 20), "BSSC")
        >>> layout
        Layout((None, 24, 24, 20), 'BSSC')
        >>> layout.size("C"), layout.size("S"), layout.size("B"), layout.finddim("S")
        (20, (24, 24), None, (1, 2))
        >>> layout.with_size("B", 128)
        Layout((128, 24, 24, 20), 'BSSC')
    """

    __slots__ = ("_shape", "_format")

    def __init__(self, shape: Iterable[int | None], fmt: str):
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
            raise FormatError(
                f"Layout shape must be a sequence of sizes (int or None), got "
                f"{type_name(shape)} {shape!r}. Fix: e.g. df.Layout((None, 3), 'BC')."
            )
        sizes = []
        for i, n in enumerate(shape):
            sizes.append(_validate_size(n, what=f"Layout shape[{i}]"))
        sizes = tuple(sizes)
        object.__setattr__(self, "_shape", sizes)
        object.__setattr__(self, "_format", _validate_format(fmt, len(sizes), what="Layout fmt"))

    @classmethod
    def of(cls, x: Any, fmt: str | None = None) -> Layout:
        """The layout of ``x``: a ``FormattedArray``, or anything with ``.shape`` plus ``fmt``.

        ``fmt`` overrides a ``FormattedArray``'s own format.

        Examples:
            >>> import jax.numpy as jnp
            >>> import difffn as df
            >>> df.Layout.of(df.dlarray(jnp.zeros((2, 5)), "BC"))
            Layout((2, 5), 'BC')
            >>> df.Layout.of(jnp.zeros((7, 3)), "TC")
            Layout((7, 3), 'TC')
        """
        if fmt is None:
            if not isinstance(x, FormattedArray):
                raise FormatError(
                    f"Layout.of needs a FormattedArray or a fmt; got a {type_name(x)} without a "
                    f"format. Fix: Layout.of(x, 'BSSC') (one label per axis)."
                )
            x._check_rank("Layout.of")
            fmt = x.format
        shape = getattr(x, "shape", None)
        if shape is None:
            raise FormatError(f"Layout.of needs an object with a .shape, got {type_name(x)}.")
        return cls(tuple(shape), fmt)

    @property
    def shape(self) -> tuple[int | None, ...]:
        """One size per axis; ``None`` where unknown."""
        return self._shape

    @property
    def format(self) -> str:
        """The format string."""
        return self._format

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self._shape)

    def finddim(self, label: str) -> tuple[int, ...]:
        """The axes carrying ``label`` (see [`finddim`][difffn.finddim])."""
        return finddim(self, label)

    def size(self, label: str) -> int | None | tuple[int | None, ...]:
        """The size of the ``C``, ``B`` or ``T`` axis, or the tuple of ``S`` or ``U`` sizes.

        Raises:
            FormatError: ``label`` is ``C``, ``B`` or ``T`` and the layout has no such axis.
        """
        axes = finddim(self, _validate_label(label, what="Layout.size: label"))
        if label in _UNIQUE_LABELS:
            if not axes:
                raise FormatError(
                    f"Layout {self._format!r} has no {label!r} axis, so size({label!r}) is "
                    f"undefined; labels present: {', '.join(map(repr, sorted(set(self._format))))}."
                )
            return self._shape[axes[0]]
        return tuple(self._shape[a] for a in axes)

    def with_size(self, label: str, n: int | None) -> Layout:
        """A copy with the size of the one axis labeled ``label`` replaced by ``n``.

        Raises:
            FormatError: ``label`` does not appear exactly once, or ``n`` is not a size.
        """
        axes = finddim(self, _validate_label(label, what="Layout.with_size: label"))
        if len(axes) != 1:
            raise FormatError(
                f"with_size({label!r}, ...) needs a label that appears exactly once in Layout "
                f"{self._format!r}, but it appears {len(axes)} times. Fix: build a new "
                f"df.Layout(shape, fmt) to change several axes."
            )
        n = _validate_size(n, what=f"with_size({label!r}, n): n")
        shape = list(self._shape)
        shape[axes[0]] = n
        return Layout(shape, self._format)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Layout is immutable; use with_size or build a new Layout ({name})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return self._shape == other._shape and self._format == other._format

    def __hash__(self) -> int:
        return hash((Layout, self._shape, self._format))

    def __repr__(self) -> str:
        return f"Layout({self._shape!r}, {self._format!r})"


def _validate_size(n: object, *, what: str) -> int | None:
    if n is None:
        return None
    if isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_)) and n >= 0:
        return int(n)
    raise FormatError(
        f"{what} must be a non-negative int or None (unknown size), got {type_name(n)} {n!r}. "
        "Fix: pass a whole number of elements, or None where the size may vary."
    )


def dlarray(x: Any, fmt: str | None = None) -> Any:
    """Label the axes of ``x``: MATLAB's ``dlarray(X, fmt)``, without hidden permutation.

    Args:
        x: an array-like or a ``FormattedArray``.
        fmt: one label per axis, in storage order. ``None`` leaves ``x`` unformatted.

    Returns:
        A ``FormattedArray`` when ``fmt`` is given (a ``FormattedArray`` ``x`` is relabeled,
        its data unmoved); otherwise ``x`` itself if formatted, else ``jnp.asarray(x)``.

    Raises:
        FormatError: ``fmt`` is not a valid format for ``x``.

    Examples:
        >>> import jax.numpy as jnp
        >>> import difffn as df
        >>> x = df.dlarray(jnp.zeros((2, 8, 8, 3)), "BSSC")
        >>> df.dims(x), df.dims(df.dlarray(x, "BSSU"))
        ('BSSC', 'BSSU')
        >>> df.dlarray(jnp.zeros((2, 3)), "BSC")
        Traceback (most recent call last):
        ...
        difffn.FormatError: dlarray: fmt 'BSC' has 3 labels ... (shape (2, 3)); ...
    """
    if fmt is None:
        return x if isinstance(x, FormattedArray) else asarray(x)
    data = asarray(x._data if isinstance(x, FormattedArray) else x)
    return FormattedArray._wrap(
        data, _validate_format(fmt, data.ndim, what="dlarray: fmt", shape=data.shape)
    )


def dims(x: Any) -> str:
    """The format of ``x``: a ``FormattedArray`` or a ``Layout``; ``""`` for anything else.

    Examples:
        >>> import jax.numpy as jnp
        >>> import difffn as df
        >>> df.dims(df.dlarray(jnp.zeros((4, 3)), "BC")), df.dims(jnp.zeros(3)), df.dims(1.0)
        ('BC', '', '')
    """
    if isinstance(x, FormattedArray):
        x._check_rank("df.dims")
        return x.format
    if isinstance(x, Layout):
        return x.format
    return ""


def finddim(x: Any, label: str) -> tuple[int, ...]:
    """The axes of ``x`` labeled ``label``, in order: MATLAB's ``finddim``.

    Args:
        x: a ``FormattedArray``, a ``Layout`` or a format string; a plain array has no labels.
        label: one of ``"S"``, ``"C"``, ``"B"``, ``"T"``, ``"U"``.

    Raises:
        FormatError: ``label`` is not a single valid label, or ``x`` is an invalid format string.

    Examples:
        >>> import jax.numpy as jnp
        >>> import difffn as df
        >>> df.finddim("BSSC", "S"), df.finddim("BSSC", "C"), df.finddim("BSSC", "T")
        ((1, 2), (3,), ())
        >>> df.finddim(jnp.zeros((2, 3)), "B")
        ()
    """
    label = _validate_label(label, what="finddim: label")
    if isinstance(x, FormattedArray):
        x._check_rank("df.finddim")
        fmt = x.format
    elif isinstance(x, Layout):
        fmt = x.format
    elif isinstance(x, str):
        fmt = _validate_format(x, what="finddim: format")
    else:
        return ()
    return tuple(i for i, lab in enumerate(fmt) if lab == label)


def stripdims(x: Any) -> Any:
    """The plain arrays: every ``FormattedArray`` in the pytree ``x`` replaced by its data.

    Plain arrays and other leaves pass through unchanged.

    Examples:
        >>> import jax.numpy as jnp
        >>> import difffn as df
        >>> x = df.dlarray(jnp.zeros((2, 3)), "BC")
        >>> df.stripdims(x).shape
        (2, 3)
        >>> df.dims(df.stripdims({"a": x, "b": (x, 1.0)})["b"][0])
        ''
    """
    if isinstance(x, FormattedArray):
        return x._data
    return jax.tree.map(
        lambda leaf: leaf._data if isinstance(leaf, FormattedArray) else leaf,
        x,
        is_leaf=lambda node: isinstance(node, FormattedArray),
    )


def permute(x: FormattedArray, fmt: str) -> FormattedArray:
    """Transpose ``x`` so that its axes follow the label order ``fmt``.

    Repeated labels (``S``, ``U``) keep their relative order.

    Args:
        x: a ``FormattedArray``.
        fmt: a reordering of ``x``'s labels (the same labels, each as often).

    Raises:
        FormatError: ``x`` is not formatted, or ``fmt`` is not a reordering of its format.

    Examples:
        >>> import jax.numpy as jnp
        >>> import difffn as df
        >>> x = df.dlarray(jnp.zeros((2, 8, 6, 3)), "BSSC")
        >>> y = df.permute(x, "SSCB")
        >>> y.format, y.shape
        ('SSCB', (8, 6, 3, 2))
    """
    if not isinstance(x, FormattedArray):
        raise FormatError(
            f"permute: x must be a FormattedArray, got a {type_name(x)} without a format. "
            f"Fix: label it first with df.dlarray(x, fmt), or use jnp.transpose."
        )
    x._check_rank("df.permute")
    if not isinstance(fmt, str) or Counter(fmt) != Counter(x.format):
        raise FormatError(
            f"permute: fmt {fmt!r} is not a reordering of x's format {x.format!r}; it must use "
            f"the same labels, each as often. Fix: use dlarray(x, fmt) to relabel instead."
        )
    source = {label: [i for i, lab in enumerate(x.format) if lab == label] for label in set(fmt)}
    axes = tuple(source[label].pop(0) for label in fmt)
    if axes == tuple(range(x.ndim)):
        return x
    return FormattedArray._wrap(jnp.transpose(x.data, axes), fmt)
