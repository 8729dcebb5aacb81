"""Formatted arrays (MATLAB's ``dlarray``) and data layouts (``networkDataLayout``).

A format is a string with one label per axis: ``S`` (spatial), ``C`` (channel), ``B`` (batch),
``T`` (time), ``U`` (unspecified). ``C``, ``B`` and ``T`` appear at most once; ``S`` and ``U``
may repeat. Unlike MATLAB, labels name the axes in **storage order** (``"BSSC"`` is NHWC) and
nothing is ever permuted behind the user's back: :func:`permute` is the one explicit transpose.

:class:`FormattedArray` is a pytree whose only leaf is the array; the format is static auxiliary
data, so ``jax.jit`` caches on it and retraces when it changes. JAX rebuilds pytrees with
placeholders (``object()``, ``None``, tracers whose rank differs from the format's), so rebuilding
never validates. Instead every operation that relies on the format checks the rank first and, if
``jax.vmap`` removed or added an axis, says so and how to fix it.

``FormattedArray`` deliberately does not define ``__jax_array__``. JAX 0.10.2 accepts it in
``jax.numpy`` without warnings, but ``jax.Array``'s operators call it on their right operand before
Python tries ours, so ``w * x`` would silently return a plain array (and, under
``jax_numpy_rank_promotion="raise"``, fail for a lower-rank ``w``) while ``x * w`` keeps the
format; ``jax.lax`` functions reject it anyway. Functions other than the elementwise operators take
``stripdims(x)``; a ``FormattedArray`` passed to them raises a ``TypeError`` that names the class.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import FormatError, type_name

__all__ = ["FormattedArray", "Layout", "dims", "dlarray", "finddim", "permute", "stripdims"]

_LABELS = "SCBTU"
_UNIQUE_LABELS = "CBT"
_LABEL_HELP = "S (spatial), C (channel), B (batch), T (time), U (unspecified)"
_VMAP_HELP = (
    "This happens when jax.vmap (or lax.scan) maps over a formatted array: the mapped axis is "
    "removed or added, but its label cannot be. Fix: map over df.stripdims(x) and re-apply the "
    "format inside with df.dlarray(x, fmt); return plain arrays from the mapped function."
)


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
        >>> from difffn._format import _validate_format
        >>> _validate_format("BSSC", 4)
        'BSSC'
        >>> _validate_format("BSC", 4, what="Conv2D input format")
        Traceback (most recent call last):
        ...
        difffn._errors.FormatError: Conv2D input format 'BSC' has 3 labels but the array has 4 ...
    """
    if not isinstance(fmt, str):
        raise FormatError(
            f"{what} must be a format string with one label per axis from {_LABEL_HELP}, "
            f"such as 'BSSC'; got {type_name(fmt)} {fmt!r}."
        )
    bad = sorted({label for label in fmt if label not in _LABELS})
    if bad:
        hint = ""
        if all(label in _LABELS for label in fmt.upper()):
            hint = f" Labels are upper case: use {fmt.upper()!r}."
        raise FormatError(
            f"{what} {fmt!r} has invalid label(s) {', '.join(map(repr, bad))}; valid labels are "
            f"{_LABEL_HELP}.{hint}"
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
            f"give exactly one label per axis."
        )
    return fmt


def _validate_label(label: object, *, what: str = "label") -> str:
    """Check a single axis label (``"S"``, ``"C"``, ``"B"``, ``"T"`` or ``"U"``) and return it."""
    if not (isinstance(label, str) and len(label) == 1 and label in _LABELS):
        raise FormatError(
            f"{what} must be one of 'S', 'C', 'B', 'T', 'U' ({_LABEL_HELP}); got {label!r}."
        )
    return label


def _is_python_scalar(x: object) -> bool:
    return isinstance(x, (bool, int, float, complex))


def _is_int_index(k: object) -> bool:
    # A 0-d integer array (e.g. a traced loop index) is basic indexing, like an int.
    if isinstance(k, (bool, np.bool_)):
        return False
    if isinstance(k, (int, np.integer)):
        return True
    shape, dtype = getattr(k, "shape", None), getattr(k, "dtype", None)
    return shape == () and dtype is not None and jnp.issubdtype(dtype, jnp.integer)


def _describe_index(k: object) -> str:
    shape, dtype = getattr(k, "shape", None), getattr(k, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type_name(k)} of shape {tuple(shape)} and dtype {dtype}"
    return f"{type_name(k)} {k!r}"


def _binary(fn: Callable[[Any, Any], Any], symbol: str, *, reflected: bool = False):
    def method(self: FormattedArray, other: Any) -> Any:
        return self._combine(other, fn, symbol, reflected)

    method.__name__ = f"__{'r' if reflected else ''}{fn.__name__.strip('_')}__"
    method.__doc__ = f"Elementwise ``{symbol}`` that keeps the format."
    return method


def _unary(fn: Callable[[Any], Any], symbol: str):
    def method(self: FormattedArray) -> FormattedArray:
        self._check_rank(f"'{symbol}'")
        return FormattedArray._wrap(fn(self._data), self._format)

    method.__name__ = f"__{fn.__name__.strip('_')}__"
    method.__doc__ = f"Elementwise ``{symbol}`` that keeps the format."
    return method


class FormattedArray:
    """An array plus a format string: MATLAB's formatted ``dlarray``.

    Build one with :func:`dlarray` (or this constructor, which validates the same way). The array
    is the pytree's only leaf and the format is static, so ``jax.jit`` caches on the format and
    ``jax.grad`` returns gradients with the input's format.

    Elementwise arithmetic (``+ - * / // % **``), comparisons, ``& | ^ ~``, ``-x``, ``abs(x)``
    and basic indexing keep the format. Two operands must have the same format (size-1 axes
    broadcast); a plain array or scalar operand broadcasts by numpy's right-aligned rule. Other
    functions (``jnp.exp``, ``jax.nn.relu``) take the plain array: ``df.stripdims(x)``.

    Args:
        data: an array-like; converted with ``jnp.asarray``. A ``FormattedArray`` is relabeled.
        fmt: one label per axis of ``data``.

    Raises:
        FormatError: ``fmt`` is not a valid format for ``data``.

    Examples:
        >>> import jax.numpy as jnp
        >>> import difffn as df
        >>> x = df.dlarray(jnp.ones((2, 3)), "BC")
        >>> x
        FormattedArray('BC', float32[2,3])
        [[1. 1. 1.]
         [1. 1. 1.]]
        >>> (2 * x + 1).format, x.shape, x.ndim, x.size
        ('BC', (2, 3), 2, 6)
        >>> x[0].format
        'C'
    """

    __slots__ = ("_data", "_format")
    __hash__ = None  # type: ignore[assignment]  # ``==`` is elementwise
    # numpy defers ``ndarray OP x`` to our reflected operators, so the format survives.
    __array_ufunc__ = None

    def __init__(self, data: Any, fmt: str):
        if isinstance(data, FormattedArray):
            data = data._data
        data = jnp.asarray(data)
        self._data = data
        self._format = _validate_format(fmt, data.ndim, shape=data.shape)

    @classmethod
    def _wrap(cls, data: Any, fmt: str) -> FormattedArray:
        # No validation: JAX unflattens with placeholders and the rank is checked lazily.
        out = object.__new__(cls)
        out._data = data
        out._format = fmt
        return out

    def _flatten(self):
        return (self._data,), self._format

    def _flatten_with_keys(self):
        return ((jax.tree_util.GetAttrKey("data"), self._data),), self._format

    @classmethod
    def _unflatten(cls, fmt: str, children: Iterable[Any]) -> FormattedArray:
        (data,) = children
        return cls._wrap(data, fmt)

    def _check_rank(self, operation: str) -> None:
        shape = tuple(self._data.shape)
        if len(shape) != len(self._format):
            raise FormatError(
                f"FormattedArray {self._format!r} holds an array of rank {len(shape)} "
                f"(shape {shape}) but its format has {len(self._format)} labels, so {operation} "
                f"cannot use it. {_VMAP_HELP}"
            )

    @property
    def data(self) -> jax.Array:
        """The plain array (the pytree leaf)."""
        return self._data

    @property
    def format(self) -> str:
        """The format string, one label per axis."""
        return self._format

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return tuple(self._data.shape)

    @property
    def dtype(self) -> np.dtype:
        """The array's dtype."""
        return self._data.dtype

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self._data.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self._data.shape)

    def astype(self, dtype: Any) -> FormattedArray:
        """The same array cast to ``dtype``, with the same format."""
        self._check_rank("astype")
        return FormattedArray._wrap(self._data.astype(dtype), self._format)

    def _combine(self, other: Any, fn: Callable[[Any, Any], Any], symbol: str, reflected: bool):
        self._check_rank(f"'{symbol}'")
        if isinstance(other, FormattedArray):
            other._check_rank(f"'{symbol}'")
            if other._format != self._format:
                left, right = (other, self) if reflected else (self, other)
                raise FormatError(
                    f"'{symbol}' cannot combine FormattedArrays with formats {left._format!r} and "
                    f"{right._format!r}: both operands need the same format. Fix: reorder one "
                    f"with df.permute(y, {self._format!r}) if they hold the same labels, or "
                    f"combine plain arrays from df.stripdims."
                )
            other = other._data
        elif _is_python_scalar(other):
            pass
        elif isinstance(other, (np.ndarray, np.generic, jax.Array)):
            other = jnp.asarray(other)
            if other.ndim > len(self._format):
                raise FormatError(
                    f"'{symbol}' of a FormattedArray {self._format!r} (shape {self.shape}) and a "
                    f"plain array of shape {tuple(other.shape)} would have rank {other.ndim}, "
                    f"which the format no longer describes. Fix: give the plain operand at most "
                    f"{len(self._format)} dimensions, or compute on df.stripdims(x) and re-apply "
                    f"a format with df.dlarray."
                )
            if 0 < other.ndim < len(self._format):
                # numpy's right-aligned broadcasting, spelled out so that a per-channel vector
                # works under jax_numpy_rank_promotion="raise".
                other = jnp.reshape(other, (1,) * (len(self._format) - other.ndim) + other.shape)
        elif symbol in ("==", "!=") and type(other) in (dict, list, set, tuple):
            # Python's fallback would compare identities and return a single bool, as jax.Array
            # also refuses to.
            raise TypeError(
                f"unsupported operand type(s) for {symbol}: 'FormattedArray' and "
                f"{type_name(other)!r}; convert the other operand with jnp.asarray first."
            )
        else:
            return NotImplemented
        result = fn(other, self._data) if reflected else fn(self._data, other)
        return FormattedArray._wrap(result, self._format)

    __add__ = _binary(operator.add, "+")
    __radd__ = _binary(operator.add, "+", reflected=True)
    __sub__ = _binary(operator.sub, "-")
    __rsub__ = _binary(operator.sub, "-", reflected=True)
    __mul__ = _binary(operator.mul, "*")
    __rmul__ = _binary(operator.mul, "*", reflected=True)
    __truediv__ = _binary(operator.truediv, "/")
    __rtruediv__ = _binary(operator.truediv, "/", reflected=True)
    __floordiv__ = _binary(operator.floordiv, "//")
    __rfloordiv__ = _binary(operator.floordiv, "//", reflected=True)
    __mod__ = _binary(operator.mod, "%")
    __rmod__ = _binary(operator.mod, "%", reflected=True)
    __pow__ = _binary(operator.pow, "**")
    __rpow__ = _binary(operator.pow, "**", reflected=True)
    __and__ = _binary(operator.and_, "&")
    __rand__ = _binary(operator.and_, "&", reflected=True)
    __or__ = _binary(operator.or_, "|")
    __ror__ = _binary(operator.or_, "|", reflected=True)
    __xor__ = _binary(operator.xor, "^")
    __rxor__ = _binary(operator.xor, "^", reflected=True)
    # Python reflects comparisons itself (``w < x`` calls ``x.__gt__(w)``).
    __lt__ = _binary(operator.lt, "<")
    __le__ = _binary(operator.le, "<=")
    __gt__ = _binary(operator.gt, ">")
    __ge__ = _binary(operator.ge, ">=")
    __eq__ = _binary(operator.eq, "==")  # type: ignore[assignment]
    __ne__ = _binary(operator.ne, "!=")  # type: ignore[assignment]
    __neg__ = _unary(operator.neg, "-")
    __pos__ = _unary(operator.pos, "+")
    __abs__ = _unary(operator.abs, "abs")
    __invert__ = _unary(operator.invert, "~")

    def __getitem__(self, key: Any) -> FormattedArray:
        """Basic indexing: an int drops its axis's label, a slice or ``...`` keeps labels."""
        self._check_rank("indexing")
        items = key if isinstance(key, tuple) else (key,)
        for k in items:
            if k is None:
                raise FormatError(
                    f"indexing FormattedArray {self._format!r} with None (np.newaxis) would add "
                    f"an axis without a label; index df.stripdims(x) instead and re-apply a "
                    f"format with df.dlarray."
                )
            if not (k is Ellipsis or isinstance(k, slice) or _is_int_index(k)):
                raise FormatError(
                    f"FormattedArray {self._format!r} supports basic indexing only (ints, slices "
                    f"and ...), got {_describe_index(k)}; boolean and array indexing do not "
                    f"keep axes in place. Index df.stripdims(x) instead and re-apply a format "
                    f"with df.dlarray."
                )
        explicit = sum(k is not Ellipsis for k in items)
        if explicit > len(self._format) or sum(k is Ellipsis for k in items) > 1:
            raise IndexError(
                f"index {key!r} does not fit FormattedArray {self._format!r}: at most "
                f"{len(self._format)} indices and one '...'."
            )
        kept, axis = [], 0
        for k in items:
            if k is Ellipsis:
                skipped = len(self._format) - explicit
                kept.append(self._format[axis : axis + skipped])
                axis += skipped
            else:
                if isinstance(k, slice):
                    kept.append(self._format[axis])
                axis += 1
        kept.append(self._format[axis:])
        return FormattedArray._wrap(self._data[key], "".join(kept))

    def __len__(self) -> int:
        if not self._data.shape:
            raise TypeError("len() of a 0-d FormattedArray")
        return self._data.shape[0]

    def __iter__(self) -> Iterator[FormattedArray]:
        # Without this Python would iterate through __getitem__, and JAX clamps out-of-range ints.
        if not self._data.shape:
            raise TypeError("iteration over a 0-d FormattedArray")
        return (self[i] for i in range(self._data.shape[0]))

    def __bool__(self) -> bool:
        return bool(self._data)

    def __float__(self) -> float:
        return float(self._data)

    def __int__(self) -> int:
        return int(self._data)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        try:
            out = np.asarray(self._data, dtype=dtype)
        except jax.errors.TracerArrayConversionError as e:
            raise FormatError(
                f"a traced FormattedArray {self._format!r} cannot become a numpy array (numpy "
                f"needs concrete values). Fix: pass df.stripdims(x) to jax.numpy functions."
            ) from e
        return out.copy() if copy else out

    def __repr__(self) -> str:
        shape, dtype = getattr(self._data, "shape", None), getattr(self._data, "dtype", None)
        if shape is None or dtype is None:
            return f"FormattedArray({self._format!r}, {self._data!r})"
        sizes = ",".join(map(str, shape))
        head = f"FormattedArray({self._format!r}, {getattr(dtype, 'name', dtype)}[{sizes}])"
        if isinstance(self._data, jax.core.Tracer) or not isinstance(
            self._data, (jax.Array, np.ndarray)
        ):
            return head
        values = np.array2string(np.asarray(self._data), threshold=64, edgeitems=2)
        # High-rank arrays print one line per row even when summarized: keep the header only.
        return head if values.count("\n") >= 10 else f"{head}\n{values}"


jax.tree_util.register_pytree_with_keys(
    FormattedArray,
    FormattedArray._flatten_with_keys,
    FormattedArray._unflatten,
    FormattedArray._flatten,
)


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
                f"{type_name(shape)} {shape!r}."
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
        """The axes carrying ``label`` (see :func:`finddim`)."""
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
        f"{what} must be a non-negative int or None (unknown size), got {type_name(n)} {n!r}."
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
        difffn._errors.FormatError: dlarray: fmt 'BSC' has 3 labels ... (shape (2, 3)); ...
    """
    if fmt is None:
        return x if isinstance(x, FormattedArray) else jnp.asarray(x)
    data = jnp.asarray(x._data if isinstance(x, FormattedArray) else x)
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
