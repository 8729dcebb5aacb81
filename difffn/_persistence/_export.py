"""Export compiled functions with ``jax.export``: a function and input layouts to bytes, and back.

The core that ``check_layer(..., check_export=True)`` uses, and that ``df.export`` /
``df.load_exported`` build on. A ``df.Layout`` size of ``None`` becomes a symbolic dimension
(``jax.export.symbolic_shape``), so one export serves every batch size: ``B`` axes share the
symbol ``batch`` and ``T`` axes the symbol ``time`` across inputs; any other unknown size gets a
symbol of its own. The serialized form carries the first-order VJP (``vjp_order=1``), so the
loaded function can be differentiated, with the custom backward of any layer inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import export as jax_export

from .._core import Layout, SerializationError, stripdims, type_name

_SHARED_SYMBOLS = {"B": "batch", "T": "time"}


def input_specs(layouts: Sequence[Layout], dtype=jnp.float32) -> list[jax.ShapeDtypeStruct]:
    """One ``jax.ShapeDtypeStruct`` per layout; unknown sizes become symbolic dimensions.

    ``dtype`` is one dtype for every input, or a sequence with one per layout.

    Examples:
      >>> import difffn as df
      >>> from difffn._persistence._export import input_specs
      >>> [spec.shape for spec in input_specs([df.Layout((None, 8, 3), "BTC")])]
      [(batch, 8, 3)]
    """
    for i, layout in enumerate(layouts):
        if not isinstance(layout, Layout):
            raise SerializationError(
                f"export: input {i + 1} is a {type_name(layout)}; expected a df.Layout. Fix: "
                "describe each input as df.Layout(shape, fmt), with None for unknown sizes."
            )
    dtypes = list(dtype) if isinstance(dtype, (tuple, list)) else [dtype] * len(layouts)
    if len(dtypes) != len(layouts):
        raise SerializationError(
            f"export: {len(dtypes)} dtypes for {len(layouts)} inputs. Fix: give one dtype, or "
            "one per input."
        )
    scope = jax_export.SymbolicScope()
    specs = []
    for i, (layout, dt) in enumerate(zip(layouts, dtypes, strict=True)):
        parts = []
        for axis, (size, label) in enumerate(zip(layout.shape, layout.format, strict=True)):
            if size is not None:
                parts.append(str(size))
            else:
                parts.append(_SHARED_SYMBOLS.get(label, f"{label.lower()}{i}_{axis}"))
        shape = jax_export.symbolic_shape(", ".join(parts), scope=scope) if parts else ()
        specs.append(jax.ShapeDtypeStruct(shape, dt))
    return specs


def export_function(
    fn: Callable, *layouts: Layout, dtype=jnp.float32, platforms: Sequence[str] | None = None
) -> jax_export.Exported:
    """Export ``fn`` (plain arrays in, a pytree of arrays out) for inputs of the given layouts.

    Raises:
      SerializationError: ``fn`` cannot be traced for these shapes (the message says why).
    """
    specs = input_specs(layouts, dtype)
    try:
        return jax_export.export(jax.jit(fn), platforms=platforms)(*specs)
    except Exception as error:  # noqa: BLE001 - re-raised with the layouts named
        raise _failure("the function", layouts, error) from error


def serialize(exported: jax_export.Exported, *, vjp_order: int = 1) -> bytes:
    """The bytes of an export, carrying derivatives up to ``vjp_order``.

    Raises:
      SerializationError: the derivative cannot be exported (e.g. a custom backward that uses
        a symbolic size as a Python int).
    """
    try:
        return bytes(exported.serialize(vjp_order=vjp_order))
    except Exception as error:  # noqa: BLE001 - re-raised with what was being exported
        layouts = [f"{a.shape}" for a in exported.in_avals]
        raise _failure("the function's derivative (VJP)", layouts, error) from error


def _failure(what: str, layouts, error: Exception) -> SerializationError:
    first = str(error).splitlines()[0] if str(error) else ""
    return SerializationError(
        f"export: {what} could not be exported for inputs {list(layouts)} "
        f"({type(error).__name__}: {first}). Fix: the computation must be traceable by "
        "jax.jit with these shapes: no Python control flow on array values, and no Python "
        "comparisons or arithmetic on sizes that are unknown (None) in the layouts, e.g. "
        "`if x.shape[0] > 1` (use shape-independent code, or sum over axes unconditionally)."
    )


def export_bytes(
    fn: Callable, *layouts: Layout, dtype=jnp.float32, platforms: Sequence[str] | None = None
) -> bytes:
    """``serialize(export_function(fn, *layouts, ...))``: a function and layouts to bytes."""
    return serialize(export_function(fn, *layouts, dtype=dtype, platforms=platforms))


def load_function(data: bytes) -> Callable:
    """The callable in serialized export bytes; it accepts arrays (formats are stripped).

    Raises:
      SerializationError: the bytes are not a serialized ``jax.export`` function.
    """
    exported = load_exported(data)

    def call(*inputs):
        return exported.call(*(stripdims(x) for x in inputs))

    call.exported = exported  # type: ignore[attr-defined]
    return call


def load_exported(data: bytes) -> jax_export.Exported:
    """The ``jax.export.Exported`` in serialized export bytes.

    Raises:
      SerializationError: the bytes are not a serialized ``jax.export`` function.
    """
    try:
        exported = jax_export.deserialize(bytearray(data))
    except Exception as error:  # noqa: BLE001 - any decoding failure means the same to users
        raise SerializationError(
            f"load: the data ({len(data)} bytes) is not a serialized jax.export function "
            f"({type(error).__name__}). Fix: pass bytes produced by difffn's export."
        ) from error
    return exported
