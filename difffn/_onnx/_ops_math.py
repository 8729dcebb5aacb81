"""Elementwise ONNX operators: arithmetic, activations, comparisons, logic, ``Cast``, ``Clip``.

Every operator here broadcasts like NumPy (ONNX's multidirectional broadcasting), so the importer
may run it on channels-last data as long as it permutes constants the same way.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._ops import Attrs, Unsupported, aligned, floating, jax_dtype, op, require_float


def _unary(name: str, fn, *, float_only=True):
    def impl(a: Attrs, x):
        return fn(floating(x) if float_only else x)

    op(name, elementwise=True, check=require_float if float_only else None)(impl)


for _name, _fn in {
    "Exp": jnp.exp,
    "Log": jnp.log,
    "Sqrt": jnp.sqrt,
    "Reciprocal": lambda x: 1 / x,
    "Floor": jnp.floor,
    "Ceil": jnp.ceil,
    "Round": jnp.round,  # half to even, as ONNX
    "Sin": jnp.sin,
    "Cos": jnp.cos,
    "Tan": jnp.tan,
    "Asin": jnp.arcsin,
    "Acos": jnp.arccos,
    "Atan": jnp.arctan,
    "Sinh": jnp.sinh,
    "Cosh": jnp.cosh,
    "Asinh": jnp.arcsinh,
    "Acosh": jnp.arccosh,
    "Atanh": jnp.arctanh,
    "Erf": lax.erf,
    "Sigmoid": jax.nn.sigmoid,
    "Tanh": jnp.tanh,
    "Softplus": jax.nn.softplus,
    "Softsign": jax.nn.soft_sign,
    "Mish": lambda x: x * jnp.tanh(jax.nn.softplus(x)),
    "HardSwish": lambda x: x * jnp.clip(x / 6 + 0.5, 0, 1),
}.items():
    _unary(_name, _fn)

for _name, _fn in {
    "Abs": jnp.abs,
    "Neg": jnp.negative,
    "Sign": jnp.sign,
    "Identity": lambda x: x,
    "Not": jnp.logical_not,
}.items():
    _unary(_name, _fn, float_only=False)


@op("Relu", elementwise=True)
def relu(a, x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))


@op("LeakyRelu", elementwise=True, check=require_float)
def leaky_relu(a, x):
    return jax.nn.leaky_relu(x, a.get("alpha", 0.01))


@op("Elu", elementwise=True, check=require_float)
def elu(a, x):
    alpha = a.get("alpha", 1.0)
    return jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


@op("Celu", elementwise=True, check=require_float)
def celu(a, x):
    alpha = a.get("alpha", 1.0)
    return jnp.maximum(x, 0) + jnp.minimum(0, alpha * jnp.expm1(jnp.minimum(x, 0) / alpha))


@op("Selu", elementwise=True, check=require_float)
def selu(a, x):
    alpha = a.get("alpha", 1.67326319217681884765625)
    gamma = a.get("gamma", 1.05070102214813232421875)
    return gamma * jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


@op("ThresholdedRelu", elementwise=True, check=require_float)
def thresholded_relu(a, x):
    return jnp.where(x > a.get("alpha", 1.0), x, jnp.zeros((), x.dtype))


@op("HardSigmoid", elementwise=True, check=require_float)
def hard_sigmoid(a, x):
    return jnp.clip(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0, 1).astype(x.dtype)


@op("Shrink", elementwise=True)
def shrink(a, x):
    bias, lambd = a.get("bias", 0.0), a.get("lambd", 0.5)
    y = jnp.where(x < -lambd, x + bias, jnp.where(x > lambd, x - bias, 0))
    return y.astype(x.dtype)


def _check_gelu(a, node):
    require_float(a, node)
    if a.get("approximate", "none") not in ("none", "tanh"):
        raise Unsupported(f"Gelu approximate={a.get('approximate')!r}")


@op("Gelu", elementwise=True, check=_check_gelu)
def gelu(a, x):
    return jax.nn.gelu(x, approximate=a.get("approximate", "none") == "tanh")


@op("Swish", elementwise=True, check=require_float)
def swish(a, x):
    return x * jax.nn.sigmoid(a.get("alpha", 1.0) * x)


@op("PRelu", elementwise=True, check=require_float)
def prelu(a, x, slope):
    x, slope = aligned(x, slope)
    return jnp.where(x < 0, slope * x, x).astype(x.dtype)


@op("IsNaN", elementwise=True)
def is_nan(a, x):
    return jnp.isnan(x)


@op("IsInf", elementwise=True)
def is_inf(a, x):
    positive = jnp.isposinf(x) & bool(a.get("detect_positive", 1))
    return positive | (jnp.isneginf(x) & bool(a.get("detect_negative", 1)))


# -- binary and variadic --------------------------------------------------------------------------


def _check_broadcast(a, node):
    if a.opset < 7 and a.get("broadcast", 0):
        raise Unsupported(f"{a.op_type} with the legacy broadcast attribute (opset < 7)")


def _div(x, y):
    if jnp.issubdtype(jnp.result_type(x, y), jnp.integer):
        return lax.div(*jnp.broadcast_arrays(x, y))  # truncates toward zero, as ONNX
    return x / y


def _pow(x, y):
    # ONNX: the result has the base's type
    if jnp.issubdtype(x.dtype, jnp.integer) and jnp.issubdtype(jnp.result_type(y), jnp.floating):
        return jnp.power(x.astype(jnp.result_type(y)), y).astype(x.dtype)
    return jnp.power(x, y.astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else y)


for _name, _fn in {
    "Add": jnp.add,
    "Sub": jnp.subtract,
    "Mul": jnp.multiply,
    "Div": _div,
    "Pow": _pow,
    "And": jnp.logical_and,
    "Or": jnp.logical_or,
    "Xor": jnp.logical_xor,
    "Equal": jnp.equal,
    "Greater": jnp.greater,
    "Less": jnp.less,
    "GreaterOrEqual": jnp.greater_equal,
    "LessOrEqual": jnp.less_equal,
    "BitwiseAnd": jnp.bitwise_and,
    "BitwiseOr": jnp.bitwise_or,
    "BitwiseXor": jnp.bitwise_xor,
}.items():
    op(_name, elementwise=True, check=_check_broadcast)(
        functools.partial(lambda a, x, y, fn: fn(*aligned(x, y)), fn=_fn)
    )


@op("BitwiseNot", elementwise=True)
def bitwise_not(a, x):
    return jnp.bitwise_not(x)


@op("Mod", elementwise=True)
def mod(a, x, y):
    x, y = aligned(x, y)
    if a.get("fmod", 0):
        return jnp.fmod(x, y)
    if jnp.issubdtype(jnp.result_type(x, y), jnp.floating):
        return jnp.mod(x, y)
    return jnp.mod(x, y).astype(jnp.result_type(x, y))


def _variadic(fn):
    def impl(a, *xs):
        return functools.reduce(fn, aligned(*xs))

    return impl


op("Sum", elementwise=True)(_variadic(jnp.add))
op("Max", elementwise=True)(_variadic(jnp.maximum))
op("Min", elementwise=True)(_variadic(jnp.minimum))


@op("Mean", elementwise=True)
def mean(a, *xs):
    return functools.reduce(jnp.add, aligned(*xs)) / len(xs)


@op("Where", elementwise=True)
def where(a, condition, x, y):
    return jnp.where(*aligned(condition, x, y))


# -- Clip and Cast --------------------------------------------------------------------------------


@op("Clip", elementwise=True, static=(1, 2))
def clip(a, x, low=None, high=None):
    if a.opset < 11:
        low, high = a.get("min", -math.inf), a.get("max", math.inf)
    y = x
    if low is not None and np.size(low):
        y = jnp.maximum(y, jnp.asarray(np.asarray(low).reshape(()), x.dtype))
    if high is not None and np.size(high):
        y = jnp.minimum(y, jnp.asarray(np.asarray(high).reshape(()), x.dtype))
    return y


def _check_cast(a, node):
    if a.get("to") is None:
        raise Unsupported("Cast without a 'to' attribute")
    jax_dtype(a.get("to"))  # Unsupported for types difffn has no dtype for
    for dtype in node.input_dtypes:
        if dtype is not None and dtype.kind in "USO":
            raise Unsupported("Cast from strings")


@op("Cast", elementwise=True, check=_check_cast)
def cast(a, x):
    return _cast(x, jax_dtype(a.get("to")))


def _cast(x, dtype):
    x = jnp.asarray(x)
    if jnp.issubdtype(dtype, jnp.integer) and jnp.issubdtype(x.dtype, jnp.floating):
        x = jnp.trunc(x)  # C's float-to-int conversion, as ONNX Runtime
    return x.astype(dtype)


@op("CastLike", elementwise=True, meta={1: "dtype"})
def cast_like(a, x, like):
    return _cast(x, like.dtype)
