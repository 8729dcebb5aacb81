"""The bound on every tensor that ONNX import materializes, and errors of folding named.

A model file is small, but what it describes need not be: an initializer's dims, external data,
or a constant-folded ``ConstantOfShape``, ``Expand``, ``Range`` or ``Tile`` with huge sizes would
ask for petabytes. Every tensor the importer builds is checked against
`DEFAULT_MAX_TENSOR_BYTES` (``df.import_onnx(..., max_tensor_bytes=...)`` raises it)
*before* it is allocated where its size can be known from the node (`folding`), and after
otherwise; any failure while folding a node (numpy's or JAX's) becomes an
[`ONNXImportError`][difffn.ONNXImportError] naming the node.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence

import numpy as np

from .._core import Error, ONNXImportError

DEFAULT_MAX_TENSOR_BYTES = 1 << 32  # 4 GiB: more than any one weight of the models people import
_LIMIT: contextvars.ContextVar[int] = contextvars.ContextVar(
    "max_tensor_bytes", default=DEFAULT_MAX_TENSOR_BYTES
)


def check_limit(value: object) -> int:
    """``max_tensor_bytes`` as given to ``df.import_onnx``, checked."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ONNXImportError(
            f"df.import_onnx: max_tensor_bytes is {value!r}; expected a positive int (bytes). "
            f"Fix: leave it out (default {DEFAULT_MAX_TENSOR_BYTES}) or pass e.g. 2**34."
        )
    return value


@contextlib.contextmanager
def bound(limit: int) -> Iterator[None]:
    """Within the block, tensors of more than ``limit`` bytes are refused."""
    token = _LIMIT.set(check_limit(limit))
    try:
        yield
    finally:
        _LIMIT.reset(token)


def limit() -> int:
    """The bound in force (bytes)."""
    return _LIMIT.get()


def check(what: str, shape: Sequence[int], dtype) -> None:
    """Refuse a tensor of ``shape`` and ``dtype`` (named ``what``) beyond the bound or with a
    negative size; ``shape`` may hold Python ints of any size."""
    sizes = [int(s) for s in shape]
    if any(s < 0 for s in sizes):
        raise ONNXImportError(
            f"df.import_onnx: {what} would have the shape {tuple(sizes)}, with a negative size. "
            "Fix: repair the model (the sizes it gives are wrong)."
        )
    nbytes = math.prod(sizes) * np.dtype(dtype).itemsize
    if nbytes > limit():
        raise ONNXImportError(
            f"df.import_onnx: {what} would have the shape {tuple(sizes)} ({np.dtype(dtype).name}"
            f", {nbytes} bytes), more than the {limit()} bytes difffn materializes for one "
            "tensor. Fix: check the model (its sizes may be wrong), or raise the bound with "
            "df.import_onnx(..., max_tensor_bytes=...)."
        )


def _ints(value) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _shape(value) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return None if shape is None else tuple(int(s) for s in shape)


def _predicted(op_type: str, a, args) -> tuple[tuple[int, ...], object] | None:
    """The output shape and dtype of an operator whose output can be far larger than its
    inputs, computed from the inputs without building it (None: not such an operator)."""
    if op_type == "ConstantOfShape" and args and args[0] is not None:
        value = a.get("value")
        dtype = np.float32 if value is None else np.asarray(value).dtype
        return tuple(_ints(args[0])), dtype
    shape = _shape(args[0]) if args else None
    if op_type == "Expand" and len(args) > 1 and shape is not None:
        try:
            shape = np.broadcast_shapes(shape, tuple(_ints(args[1])))
        except ValueError as error:
            raise ONNXImportError(f"its shape input does not broadcast ({error})") from None
        return tuple(shape), args[0].dtype
    if op_type == "Tile" and len(args) > 1 and shape is not None:
        repeats = _ints(args[1])
        if len(repeats) != len(shape):
            raise ONNXImportError(f"it repeats {repeats} a tensor of shape {shape}")
        return tuple(s * r for s, r in zip(shape, repeats, strict=True)), args[0].dtype
    if op_type == "Range" and len(args) == 3 and all(isinstance(v, np.ndarray) for v in args):
        start, stop, delta = (np.asarray(v).reshape(-1)[:1] for v in args)
        if any(v.size == 0 for v in (start, stop, delta)):
            raise ONNXImportError("its start, limit and delta are not scalars")
        start_, stop_, delta_ = float(start[0]), float(stop[0]), float(delta[0])
        if delta_ == 0 or not all(math.isfinite(v) for v in (start_, stop_, delta_)):
            raise ONNXImportError(f"it has start {start_}, limit {stop_}, delta {delta_}")
        return (max(math.ceil((stop_ - start_) / delta_), 0),), args[0].dtype
    return None


def folding(node, a, args, run) -> tuple:
    """``run()`` (the folding of ``node`` on ``args``), bounded and with its errors named.

    Raises:
      ONNXImportError: the output would exceed the bound, or folding failed; naming the node.
    """
    where = f"node {node.name!r} ({node.op_type})"
    try:
        predicted = _predicted(node.op_type, a, args)
        if predicted is not None:
            check("its output", *predicted)
        outputs = run()
    except ONNXImportError as error:
        message = str(error).removeprefix("df.import_onnx: ")
        if "Fix:" not in message:
            message += ". Fix: repair the model (its sizes at this node are wrong)."
        raise ONNXImportError(f"df.import_onnx: {where}: {message}") from None
    except Error:
        raise
    except (MemoryError, ValueError, TypeError, IndexError, OverflowError, RuntimeError) as error:
        # RuntimeError: JAX's (RESOURCE_EXHAUSTED and the like)
        raise ONNXImportError(
            f"df.import_onnx: {where} could not be computed from its constant inputs "
            f"({type(error).__name__}: {str(error)[:300]}). Fix: check the model's sizes and "
            "types at this node, or raise max_tensor_bytes if it is really that large."
        ) from None
    try:
        for n, value in enumerate(outputs):
            if value is not None and hasattr(value, "shape"):
                check(f"its output {n}", value.shape, value.dtype)
    except ONNXImportError as error:
        message = str(error).removeprefix("df.import_onnx: ")
        raise ONNXImportError(f"df.import_onnx: {where}: {message}") from None
    return outputs
