"""What ``FromNNX`` and ``FromEquinox`` share: a module of another library seen as a layer.

A foreign module takes and returns plain arrays in the axis order it was written for. The layer
says that order with ``fmt`` (one format per input, or one for all) and ``output_format``;
without ``fmt`` it is a ``formattable = False`` layer (plain arrays in, the input's format out).
Its parameters live in flat dicts keyed by their path inside the module (``"linear1/kernel"``),
the names users see in ``net.learnables`` and in files written by ``df.save``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any, ClassVar, Self, overload

import jax

from .._core import (
    FormatError,
    FormattedArray,
    LayerError,
    Layout,
    dlarray,
    permute,
)
from .._core import validate_format as _validate_format
from .._layer import BASE_FIELDS, Layer
from ._checks import who


class ForeignModule(Layer):
    """Base of ``FromNNX`` and ``FromEquinox`` (never used alone).

    A subclass's hand-written ``__init__`` takes the module apart and ends with
    `_finish_init`; ``structure`` holds what it keeps of the module (``module_type``,
    ``random``).
    """

    def _finish_init(self, module, *, skip: int, wrapper: str) -> None:
        """Default ``num_inputs`` and ``description`` from the module, then ``__post_init__``.

        Args:
          module: the wrapped module.
          skip: the positional parameters of its ``__call__`` that are not inputs (``self``,
            an equinox state).
          wrapper: the layer class's name, for the description (``"FromNNX(Linear)"``).
        """
        if self.num_inputs is None and self.input_names is None:
            arity = call_arity(type(module).__call__, skip=skip)
            if arity is not None:  # None: the ports resolve it (one input)
                self.num_inputs = arity
        if not self.description:
            self.description: str = f"{wrapper}({type(module).__name__})"
        self.__post_init__()

    def __post_init__(self) -> None:
        """Check the options (each subclass defines it; ``_finish_init`` calls it)."""
        raise NotImplementedError

    def initialize(self, *layouts: Layout, key: jax.Array) -> Self:
        """Nothing to fill (the module has its parameters); checks that the outputs fit.

        Raises:
          LayerError: without ``fmt``, an output's rank differs from the input format's.
        """
        del key
        check_output_ranks(self, layouts)
        return self

    def _require_key(self, key, randomness: str) -> None:
        """Training a module that draws random numbers needs a key: say so when there is none.

        Args:
          key: the key ``forward`` was given.
          randomness: what in the module draws, completing "the module ... {randomness}".
        """
        self.structure: Any  # each subclass's Structure, declared by its field
        if key is None and self.structure.random:
            raise LayerError(
                f"{who(self)}: the module {self.structure.module_type} {randomness}, so "
                "training needs randomness, but no key was given. Fix: pass "
                "key=jax.random.key(...) (net.forward(x, key=key); trainnet passes one)."
            )


class Structure:
    """Base of the frozen dataclasses that hold a foreign module's static structure.

    They are part of a layer's pytree aux data, which JAX hashes and compares on every call of
    a compiled function; an nnx ``GraphDef`` takes milliseconds to hash. So the hash is
    computed once, and the same object (every unflattened layer shares its structure) compares
    equal by identity first.
    """

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # each subclass's

    def __hash__(self) -> int:
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not type(self) or hash(self) != hash(other):
            return False
        names = [f.name for f in dataclasses.fields(self)]
        return all(getattr(self, n) == getattr(other, n) for n in names)


def path_name(path: Sequence[Any]) -> str:
    """``("layers", 0, "kernel")`` or a jax key path to ``"layers/0/kernel"``."""
    parts = []
    for entry in path:
        for attr in ("name", "key", "idx"):  # GetAttrKey, DictKey, SequenceKey
            if hasattr(entry, attr):
                entry = getattr(entry, attr)
                break
        parts.append(str(entry))
    return "/".join(parts)


def call_arity(fn, *, skip: int = 0) -> int | None:
    """Required positional parameters of ``fn`` (a module's ``__call__``), less ``skip``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    count = sum(
        1
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    )
    return max(count - skip, 1)


def accepts_keyword(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def port_count(layer, kind: str) -> int:
    """``num_inputs``/``num_outputs``, also before the base class has resolved them."""
    n, names = getattr(layer, f"num_{kind}s"), getattr(layer, f"{kind}_names")
    if n is None:
        n = len(names) if names is not None else 1
    return n


@overload
def formats(layer: Layer, value: None, count: int, argument: str) -> None: ...
@overload
def formats(
    layer: Layer, value: str | Sequence[str], count: int, argument: str
) -> tuple[str, ...]: ...
def formats(layer: Layer, value: Any, count: int, argument: str) -> tuple[str, ...] | None:
    """``fmt`` / ``output_format`` as one validated format per port (or None)."""
    if value is None:
        return None
    items = (value,) * count if isinstance(value, str) else value
    if not isinstance(items, (tuple, list)) or len(items) != count:
        raise LayerError(
            f"{who(layer)}: {argument} must be a format string or a tuple of {count} (one per "
            f"{'input' if argument == 'fmt' else 'output'}); got {value!r}. Fix: e.g. "
            f"{argument}='BC'."
        )
    return tuple(_validate_format(f, what=f"{who(layer)}: {argument}") for f in items)


def input_formats(layer) -> tuple[str, ...] | None:
    """The module's format per input (``fmt``), or None without ``fmt``."""
    return formats(layer, layer.fmt, layer.num_inputs, "fmt")


def output_formats(layer) -> tuple[str, ...] | None:
    """The format per output: ``output_format``, else the first input's ``fmt``."""
    value = layer.output_format
    if value is None and layer.fmt is not None:
        fmts = input_formats(layer)
        assert fmts is not None  # fmt is given
        value = fmts[0]
    return formats(layer, value, layer.num_outputs, "output_format")


def module_inputs(layer, inputs) -> tuple:
    """The plain arrays the module receives, in the axis order of ``fmt``."""
    fmts = input_formats(layer)
    if fmts is None:
        return tuple(inputs)
    plain = []
    for name, x, fmt in zip(layer.input_names, inputs, fmts):
        if isinstance(x, FormattedArray):
            try:
                x = permute(x, fmt)
            except FormatError:
                raise LayerError(
                    f"{who(layer)}: input {name!r} has format {x.format!r}, which cannot be "
                    f"reordered to the module's fmt {fmt!r} (the labels differ). Fix: give "
                    "fmt the module's axis order with the input's labels, or reshape the input "
                    "before this layer (e.g. df.layers.Flatten)."
                ) from None
            plain.append(x.data)
        else:
            if jax.numpy.ndim(x) != len(fmt):
                raise LayerError(
                    f"{who(layer)}: input {name!r} is a plain {jax.numpy.ndim(x)}-D array but "
                    f"fmt is {fmt!r} ({len(fmt)} axes)."
                )
            plain.append(x)
    return tuple(plain)


def layer_outputs(layer, result, module_name: str) -> tuple:
    """The module's return value as ``num_outputs`` outputs, formatted as ``output_format``."""
    n = layer.num_outputs
    if n == 1 and not isinstance(result, (tuple, list)):
        result = (result,)
    if not isinstance(result, (tuple, list)) or len(result) != n:
        got = f"{len(result)} values" if isinstance(result, (tuple, list)) else "one value"
        raise LayerError(
            f"{who(layer)}: the module {module_name} returned {got}; the layer has "
            f"num_outputs={n}. Fix: pass num_outputs= (or output_names=) to match the module."
        )
    fmts = output_formats(layer)
    if fmts is None:
        return tuple(result)
    outputs = []
    for name, y, fmt in zip(layer.output_names, result, fmts):
        if jax.numpy.ndim(y) != len(fmt):
            raise LayerError(
                f"{who(layer)}: output {name!r} of the module {module_name} has "
                f"{jax.numpy.ndim(y)} dimensions (shape {jax.numpy.shape(y)}) but its format "
                f"{fmt!r} has {len(fmt)}. Fix: pass output_format= with one label per axis "
                "(e.g. output_format='BC')."
            )
        outputs.append(dlarray(y, fmt))
    return tuple(outputs)


def check_output_ranks(layer, layouts: Sequence[Layout]) -> None:
    """Without ``fmt``, outputs take the input's format: say early when their rank differs.

    Runs the module abstractly (``jax.eval_shape``; unknown sizes become 2) on the layouts that
    ``initialize`` receives, so that a module that changes the rank (a CNN ending in a dense
    head) gets the fix that applies to it (``fmt``/``output_format``), not the generic one.
    """
    formatted = [lo for lo in layouts if isinstance(lo, Layout) and lo.format]
    if layer.formattable or not formatted or len(layouts) != layer.num_inputs:
        return
    fmt = formatted[0].format
    specs = [
        jax.ShapeDtypeStruct(tuple(2 if n is None else n for n in lo.shape), jax.numpy.float32)
        for lo in layouts
    ]
    outputs = jax.eval_shape(lambda *xs: layer.predict(*xs)[: layer.num_outputs], *specs)
    for name, y in zip(layer.output_names, outputs):
        if len(y.shape) != len(fmt):
            raise LayerError(
                f"{who(layer)}: output {name!r} of the module has {len(y.shape)} dimensions "
                f"but the input format {fmt!r} has {len(fmt)}; without fmt the outputs take "
                "the input's format. Fix: pass the module's formats, e.g. "
                f"fmt={fmt!r}, output_format='BC'."
            )


def set_base(layer, properties: dict) -> None:
    """Set the base properties given to a hand-written ``__init__``; others are an error."""
    unknown = sorted(set(properties) - set(BASE_FIELDS))
    if unknown:
        raise LayerError(
            f"{type(layer).__name__}(...) got unknown argument(s) {unknown}; besides its own "
            f"arguments it takes the base properties {list(BASE_FIELDS)}."
        )
    for n, value in properties.items():
        setattr(layer, n, value)


def check_formats(layer) -> bool:
    """Validate ``fmt``/``output_format``; True when the layer handles formats itself."""
    if layer.fmt is None:
        if layer.output_format is not None:
            raise LayerError(
                f"{who(layer)}: output_format={layer.output_format!r} needs fmt (the module's "
                "input format). Fix: pass fmt= too, e.g. fmt='BSSC', output_format='BC'."
            )
        return False
    formats(layer, layer.fmt, port_count(layer, "input"), "fmt")
    if layer.output_format is not None:
        count = port_count(layer, "output")
        formats(layer, layer.output_format, count, "output_format")
    return True
