"""The registry of ONNX operators that difffn implements, and what every implementation shares.

Each operator is a JAX function in ONNX's own semantics (axes in ONNX's order, NCHW for images):
``fn(a, *inputs) -> output or tuple of outputs``, where ``a`` is the node's `Attrs` (its
attributes and the model's opset) and ``inputs`` are the node's inputs in order (``None`` for an
optional input left out). Inputs listed in ``static`` (shapes, axes, pads, scales, ...) arrive as
NumPy arrays known while tracing; the others are JAX arrays. The importer wraps these functions
in ``FunctionLayer``s for operators that no difffn layer covers, folds constant subgraphs with
them, and the tests run each against the ``onnx`` package's own node test cases.

Why by hand: no maintained library lowers ONNX to JAX (``onnx2jax``-style projects are
unmaintained and execute models eagerly); ``onnx.reference`` is NumPy only, and ONNX Runtime is
not differentiable. Nothing from a model file is executed as code: attributes are read as
values and operators are looked up by name in this registry.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class Unsupported(Exception):  # noqa: N818 - internal signal, turned into ONNXImportError
    """An operator, attribute value or input that difffn cannot import; the message says why."""


class FrozenArray:
    """A NumPy array as a hashable, immutable value (static configuration of a layer)."""

    __slots__ = ("array", "_hash")

    def __init__(self, array):
        array = np.array(array)  # a private copy
        array.flags.writeable = False
        self.array = array
        digest = hashlib.sha1(array.tobytes()).hexdigest()
        self._hash = hash((array.dtype.str, array.shape, digest))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return (
            isinstance(other, FrozenArray)
            and self._hash == other._hash
            and self.array.dtype == other.array.dtype
            and self.array.shape == other.array.shape
            and np.array_equal(self.array, other.array)
        )

    def __repr__(self):
        return f"FrozenArray({self.array.dtype}{list(self.array.shape)})"


@dataclasses.dataclass(frozen=True)
class Attrs:
    """A node's attributes as static values, with the model's default-domain opset.

    ``op_type`` and ``name`` identify the node in messages; ``num_outputs`` is the number of
    outputs the node declares (``Split`` needs it); ``domain`` is ``""`` for ONNX's operators
    and ``FUSED_DOMAIN`` for difffn's fused nodes.
    """

    op_type: str
    items: tuple[tuple[str, Any], ...] = ()
    opset: int = 17
    name: str = ""
    num_outputs: int = 1
    domain: str = ""

    def get(self, key: str, default=None):
        for k, v in self.items:
            if k == key:
                return v.array if isinstance(v, FrozenArray) else v
        return default

    def __contains__(self, key: str) -> bool:
        return any(k == key for k, _ in self.items)

    def names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.items)


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One operator: its function and what the importer needs to know about it.

    Attributes:
      fn: ``fn(a, *inputs)``.
      static: input positions whose values must be known while tracing (NumPy arrays).
      elementwise: outputs broadcast like the inputs (the op runs in any axis order, so the
        importer may apply it to channels-last data directly).
      check: ``check(a, node)`` raises `Unsupported` for attribute values or inputs
        that the implementation does not cover (``node`` has ``inputs``, ``outputs``,
        ``input_kinds``, ``input_dtypes``).
      labels: ``labels(a, in_labels, in_shapes, out_shapes) -> list of output labels`` (ONNX
        axis order); default: elementwise ops keep the labels of their largest input, others
        get ``U`` labels.
      meta: input positions read only for their shape (``"shape"``: ``Shape``, ``Size``) or
        dtype (``"dtype"``: ``CastLike``'s second input), not their values.
    """

    fn: Callable[..., Any]
    static: frozenset[int] = frozenset()
    elementwise: bool = False
    check: Callable[..., None] | None = None
    labels: Callable[..., Any] | None = None
    meta: tuple[tuple[int, str], ...] = ()


OPS: dict[str, OpDef] = {}
# Nodes that difffn makes itself from patterns of ONNX nodes (``_mapping_attention``); a model
# file's own nodes never reach them (their domain is not one a model can declare to difffn).
FUSED_DOMAIN = "difffn.fused"
FUSED: dict[str, OpDef] = {}


def op(*names: str, static=(), elementwise=False, check=None, labels=None, meta=None):
    """Register ``fn`` under each of ``names``."""

    def register(fn):
        for name in names:
            OPS[name] = OpDef(
                fn, frozenset(static), elementwise, check, labels, tuple((meta or {}).items())
            )
        return fn

    return register


def fused(name: str, *, labels=None):
    """Register ``fn`` as the fused operator ``name`` (domain ``FUSED_DOMAIN``)."""

    def register(fn):
        FUSED[name] = OpDef(fn, labels=labels)
        return fn

    return register


# -- dtypes ----------------------------------------------------------------------------------------

# TensorProto.DataType values (onnx/onnx.proto); kept here so that running an imported network
# never needs the onnx package.
ONNX_DTYPES = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
    16: jnp.bfloat16,
}
ONNX_DTYPE_NAMES = {
    0: "undefined",
    8: "string",
    14: "complex64",
    15: "complex128",
    17: "float8e4m3fn",
    18: "float8e4m3fnuz",
    19: "float8e5m2",
    20: "float8e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4e2m1",
    24: "float8e8m0",
    25: "uint2",
    26: "int2",
}


def np_dtype(onnx_type: int):
    """The NumPy dtype of an ONNX element type; `Unsupported` for the others."""
    try:
        return np.dtype(ONNX_DTYPES[int(onnx_type)])
    except KeyError:
        name = ONNX_DTYPE_NAMES.get(int(onnx_type), f"type {onnx_type}")
        raise Unsupported(f"the element type {name} is not supported by difffn") from None


def jax_dtype(onnx_type: int):
    """The dtype JAX computes with for an ONNX element type (64-bit only with jax x64)."""
    return jax.dtypes.canonicalize_dtype(np_dtype(onnx_type))


def onnx_dtype(dtype) -> int:
    """The ONNX element type of a NumPy/JAX dtype."""
    dtype = np.dtype(dtype)
    for code, candidate in ONNX_DTYPES.items():
        if np.dtype(candidate) == dtype:
            return code
    raise Unsupported(f"the dtype {dtype} has no ONNX element type")


# -- helpers shared by the operator families -------------------------------------------------------


def axis_of(axis: int, rank: int, what: str = "axis") -> int:
    """ONNX's axis (negative counts from the end) as a non-negative index."""
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise Unsupported(f"{what}={axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def ints(value) -> tuple[int, ...]:
    """A static integer list (attribute or NumPy input) as a tuple of ints."""
    if value is None:
        return ()
    return tuple(int(v) for v in np.asarray(value).reshape(-1))


def aligned(*xs):
    """The arrays with leading 1-sized axes up to a common rank (ONNX broadcasts like NumPy;
    JAX may be set to refuse implicit rank promotion)."""
    rank = max(jnp.ndim(x) for x in xs)
    return [jnp.reshape(x, (1,) * (rank - jnp.ndim(x)) + jnp.shape(x)) for x in xs]


def floating(x):
    """``x`` itself when floating point, else float32 (operators defined on floats)."""
    return x if jnp.issubdtype(jnp.result_type(x), jnp.inexact) else jnp.asarray(x, jnp.float32)


def require_float(a: Attrs, node) -> None:
    """A check: the data inputs must be floating point (the implementation is for floats)."""
    for dtype in node.input_dtypes:
        if dtype is not None and not jnp.issubdtype(dtype, jnp.floating):
            raise Unsupported(f"{a.op_type} is implemented for floating-point inputs; got {dtype}")


def lookup(op_type: str, domain: str = "") -> OpDef | None:
    """The registered operator, or None (``ai.onnx`` domain, and difffn's fused nodes)."""
    _load_families()
    if domain == FUSED_DOMAIN:
        return FUSED.get(op_type)
    if domain not in ("", "ai.onnx"):
        return None
    return OPS.get(op_type)


def registered(op_type: str, domain: str = "") -> OpDef:
    """The registered operator of a node the importer has accepted (``lookup`` found it)."""
    definition = lookup(op_type, domain)
    assert definition is not None, (domain, op_type)
    return definition


_LOADED = []


def _load_families() -> None:
    """Import the operator families once (they register themselves)."""
    if not _LOADED:
        from . import (  # noqa: F401
            _mapping_attention,
            _ops_math,
            _ops_nn,
            _ops_reduce,
            _ops_resize,
            _ops_rnn,
            _ops_tensor,
        )

        _LOADED.append(True)


def run(op_type: str, a: Attrs, inputs):
    """Run one operator on arrays in ONNX order; always a tuple of outputs."""
    definition = lookup(op_type, a.domain)
    if definition is None:
        raise Unsupported(f"difffn has no implementation of the ONNX operator {op_type!r}")
    out = definition.fn(a, *inputs)
    return out if isinstance(out, tuple) else (out,)
