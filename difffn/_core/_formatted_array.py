"""``FormattedArray``: an array plus a format string (MATLAB's formatted ``dlarray``).

It is a pytree whose only leaf is the array; the format is static auxiliary data, so ``jax.jit``
caches on it and retraces when it changes. JAX rebuilds pytrees with placeholders (``object()``,
``None``, tracers whose rank differs from the format's), so rebuilding never validates. Instead
every operation that relies on the format checks the rank first and, if ``jax.vmap`` removed or
added an axis, says so and how to fix it.

``__jax_array__`` is answered by whom it is asked (`__jax_array__`): ``jax.Array``'s operators call
it on their right operand before Python tries ours, so a plain ``__jax_array__`` would make ``w *
x`` silently return a plain array (and, under ``jax_numpy_rank_promotion="raise"``, fail for a
lower-rank ``w``) while ``x * w`` keeps the format. So the operators get the ``FormattedArray`` back
(JAX then returns ``NotImplemented`` and Python calls ours: the format is kept),
``jnp.asarray``/``jnp.array`` get the plain array (an explicit conversion), and the other
``jax.numpy`` and ``jax.nn`` functions a [`FormatError`][difffn.FormatError] (also a ``TypeError``)
that names ``df.ops`` and ``df.stripdims``: ``jnp.exp(x)`` cannot keep the format, and silently
dropping it is what MATLAB never does. Elsewhere (``jax.lax``) a ``FormattedArray`` is not an array
to JAX, as before.
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ._arrays import as_numbers, to_device
from ._errors import FormatError, type_name
from ._labels import _validate_format

_VMAP_HELP = (
    "This happens when jax.vmap (or lax.scan) maps over a formatted array: the mapped axis is "
    "removed or added, but its label cannot be. Fix: map over df.stripdims(x) and re-apply the "
    "format inside with df.dlarray(x, fmt); return plain arrays from the mapped function."
)


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


def asarray(data: Any) -> jax.Array:
    """``data`` as a JAX array; strings, Python objects and ragged lists are a named FormatError.

    A NumPy array is copied with ``jax.device_put`` (``_arrays.to_device``): a service fed NumPy
    arrays of many shapes through ``jnp.asarray`` would keep one compiled conversion per shape.
    """
    if not isinstance(data, jax.Array):
        # Checked first: JAX would warn (NumPy's deprecated 'a' alias) or fail in its own words.
        data = as_numbers(data, what="dlarray: the data", error=FormatError, real=False)
    return to_device(data)


_Binary = Callable[["FormattedArray", Any], Any]
_Unary = Callable[["FormattedArray"], "FormattedArray"]


def _binary(
    fn: Callable[[Any, Any], Any], symbol: str, *, reflected: bool = False
) -> Callable[[FormattedArray, Any], Any]:
    def method(self: FormattedArray, other: Any) -> Any:
        return self._combine(other, fn, symbol, reflected)

    method.__name__ = f"__{'r' if reflected else ''}{fn.__name__.strip('_')}__"
    method.__doc__ = f"Elementwise ``{symbol}`` that keeps the format."
    return method


def _unary(fn: Callable[[Any], Any], symbol: str) -> Callable[[FormattedArray], FormattedArray]:
    def method(self: FormattedArray) -> FormattedArray:
        self._check_rank(f"'{symbol}'")
        return FormattedArray._wrap(fn(self._data), self._format)

    method.__name__ = f"__{fn.__name__.strip('_')}__"
    method.__doc__ = f"Elementwise ``{symbol}`` that keeps the format."
    return method


class PlainArrayNeeded(FormatError, TypeError):
    """A ``FormattedArray`` given to a ``jax.numpy`` function (a ``TypeError`` as JAX's own)."""


class FormattedArray:
    """An array plus a format string: MATLAB's formatted ``dlarray``.

    Build one with [`dlarray`][difffn.dlarray] (or this constructor, which validates the same way).
    The array
    is the pytree's only leaf and the format is static, so ``jax.jit`` caches on the format and
    ``jax.grad`` returns gradients with the input's format.

    Elementwise arithmetic (``+ - * / // % **``), comparisons, ``& | ^ ~``, ``-x``, ``abs(x)``
    and basic indexing keep the format. Two operands must have the same format (size-1 axes
    broadcast); a plain array or scalar operand broadcasts by numpy's right-aligned rule. Other
    functions (``jnp.exp``, ``jax.nn.relu``) take the plain array: ``df.stripdims(x)`` (given a
    ``FormattedArray`` they raise a ``df.FormatError`` that says so); ``jnp.asarray(x)`` gives the
    plain array.

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
    __hash__: ClassVar[None] = None  # type: ignore[assignment]  # ``==`` is elementwise
    # numpy defers ``ndarray OP x`` to our reflected operators, so the format survives.
    __array_ufunc__ = None

    def __init__(self, data: Any, fmt: str) -> None:
        if isinstance(data, FormattedArray):
            data = data._data
        data = asarray(data)
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

    def _combine(
        self, other: Any, fn: Callable[[Any, Any], Any], symbol: str, reflected: bool
    ) -> Any:
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

    __add__: ClassVar[_Binary] = _binary(operator.add, "+")
    __radd__: ClassVar[_Binary] = _binary(operator.add, "+", reflected=True)
    __sub__: ClassVar[_Binary] = _binary(operator.sub, "-")
    __rsub__: ClassVar[_Binary] = _binary(operator.sub, "-", reflected=True)
    __mul__: ClassVar[_Binary] = _binary(operator.mul, "*")
    __rmul__: ClassVar[_Binary] = _binary(operator.mul, "*", reflected=True)
    __truediv__: ClassVar[_Binary] = _binary(operator.truediv, "/")
    __rtruediv__: ClassVar[_Binary] = _binary(operator.truediv, "/", reflected=True)
    __floordiv__: ClassVar[_Binary] = _binary(operator.floordiv, "//")
    __rfloordiv__: ClassVar[_Binary] = _binary(operator.floordiv, "//", reflected=True)
    __mod__: ClassVar[_Binary] = _binary(operator.mod, "%")
    __rmod__: ClassVar[_Binary] = _binary(operator.mod, "%", reflected=True)
    __pow__: ClassVar[_Binary] = _binary(operator.pow, "**")
    __rpow__: ClassVar[_Binary] = _binary(operator.pow, "**", reflected=True)
    __and__: ClassVar[_Binary] = _binary(operator.and_, "&")
    __rand__: ClassVar[_Binary] = _binary(operator.and_, "&", reflected=True)
    __or__: ClassVar[_Binary] = _binary(operator.or_, "|")
    __ror__: ClassVar[_Binary] = _binary(operator.or_, "|", reflected=True)
    __xor__: ClassVar[_Binary] = _binary(operator.xor, "^")
    __rxor__: ClassVar[_Binary] = _binary(operator.xor, "^", reflected=True)
    # Python reflects comparisons itself (``w < x`` calls ``x.__gt__(w)``).
    __lt__: ClassVar[_Binary] = _binary(operator.lt, "<")
    __le__: ClassVar[_Binary] = _binary(operator.le, "<=")
    __gt__: ClassVar[_Binary] = _binary(operator.gt, ">")
    __ge__: ClassVar[_Binary] = _binary(operator.ge, ">=")
    __eq__: ClassVar[_Binary] = _binary(operator.eq, "==")  # type: ignore[assignment]
    __ne__: ClassVar[_Binary] = _binary(operator.ne, "!=")  # type: ignore[assignment]
    __neg__: ClassVar[_Unary] = _unary(operator.neg, "-")
    __pos__: ClassVar[_Unary] = _unary(operator.pos, "+")
    __abs__: ClassVar[_Unary] = _unary(operator.abs, "abs")
    __invert__: ClassVar[_Unary] = _unary(operator.invert, "~")

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
                    f"keep axes in place. Fix: index df.stripdims(x) instead and re-apply a "
                    f"format with df.dlarray."
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

    @property
    def __jax_array__(self) -> Callable[[], Any]:
        """JAX's array protocol, answered by who asks (see the module's docstring)."""
        asker = sys._getframe(1).f_globals.get("__name__", "")
        if asker == "jax._src.numpy.array_methods":  # w * x: JAX defers to our operators
            return lambda: self
        if asker == "jax._src.numpy.array_constructors":  # jnp.asarray(x): a conversion
            return lambda: self._data
        if asker == "jax._src.numpy.util":  # jnp.exp(x), jax.nn.relu(x), ...
            return self._plain_array_needed
        raise AttributeError("__jax_array__")  # jax.lax and the rest: not an array, as before

    def _plain_array_needed(self) -> Any:
        raise PlainArrayNeeded(
            f"a df.FormattedArray {self._format!r} was passed to a jax.numpy or jax.nn function, "
            "which takes plain arrays and cannot keep the format. Fix: use the format-aware "
            "df.ops function where there is one (df.ops.relu, df.ops.sigmoid, df.ops.softmax, "
            "df.ops.tanh, ...), or df.stripdims(x) (e.g. jnp.exp(df.stripdims(x))) and "
            "df.dlarray(y, fmt) to label the result again."
        )

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
