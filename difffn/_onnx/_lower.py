"""Lowering a jaxpr to ONNX nodes, one JAX primitive at a time (``df.export_onnx``'s engine).

``df.export_onnx`` traces the network's predict (built-in and custom layers alike) to a jaxpr
and writes each equation as ONNX nodes. Call-like primitives (``jit``, ``custom_jvp_call``,
``custom_vjp_call``, ``checkpoint``) are inlined, ``scan`` with a static length is unrolled, and
equations whose inputs are all constants are evaluated here (constant folding), so parameters
reach the file as initializers. A primitive with no rule raises ``df.ONNXExportError`` naming the
layer (the ``jax.named_scope`` the exporter opens per layer), the primitive and the source line.

Why by hand: the maintained converter, jax2onnx (0.17.1 and 0.16.1, tried with jax 0.10.2) converts
difffn's jitted predict for dense, convolution, batch norm, global pooling, LSTM and custom
layers, but lowers ``reduce_window_max`` over channels-last data (every ``MaxPool2D``) to an
ONNX ``MaxPool`` with a 4-D window that ONNX Runtime rejects ("Unsupported pooling size"), and
it requires huggingface-hub, netron, orbax-export and dm-pix; this module needs only ``onnx``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from .._core import ONNXExportError

OPSET = 18

_ELEMENTWISE = {
    "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "max": "Max", "min": "Min",
    "neg": "Neg", "exp": "Exp", "log": "Log", "tanh": "Tanh", "logistic": "Sigmoid",
    "sqrt": "Sqrt", "abs": "Abs", "sign": "Sign", "pow": "Pow", "erf": "Erf", "floor": "Floor",
    "ceil": "Ceil", "sin": "Sin", "cos": "Cos", "eq": "Equal", "lt": "Less", "le": "LessOrEqual",
    "gt": "Greater", "ge": "GreaterOrEqual", "and": "And", "or": "Or", "not": "Not",
}  # fmt: skip
# difffn_reverse_only: the value unchanged (it guards forward-mode differentiation)
_IDENTITY = {"stop_gradient", "copy", "copy_p", "optimization_barrier", "reduce_precision",
             "difffn_reverse_only"}  # fmt: skip
_REDUCE = {"reduce_max": "ReduceMax", "reduce_min": "ReduceMin", "reduce_sum": "ReduceSum",
           "reduce_prod": "ReduceProd"}  # fmt: skip
_CALLS = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
          "custom_vjp_call_jaxpr", "checkpoint", "remat", "custom_lin"}  # fmt: skip


def _sub_jaxpr(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        value = eqn.params.get(key)
        if isinstance(value, (ClosedJaxpr, Jaxpr)):
            return value
    return None


class Const:
    """A value known at export time, with the name it gets if it becomes an initializer."""

    def __init__(self, value, name: str):
        self.value = np.asarray(value)
        self.name = name
        self.onnx_name: str | None = None


class Lowering:
    """ONNX nodes and initializers for a jaxpr; ``symbols`` maps a dimension name to the graph
    input and axis it comes from (symbolic batch sizes), ``layers`` a scope to its layer."""

    def __init__(self, helper, numpy_helper, symbols: dict[str, tuple[str, int]], layers=None):
        self.helper, self.numpy_helper = helper, numpy_helper
        self.symbols = symbols
        self.layers = dict(layers or {})  # scope -> layer name
        self.nodes: list = []
        self.initializers: dict[str, object] = {}
        self.names: set[str] = set()
        self.count = 0

    def layer(self, scope: str) -> str:
        first = scope.split("/")[0]
        return self.layers.get(first, first)

    # -- names, constants, shapes ------------------------------------------------------------

    def fresh(self, hint: str) -> str:
        base = hint.replace(" ", "_") or "t"
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def tensor(self, value) -> str:
        """The ONNX name of a value (a constant becomes an initializer when first used)."""
        if isinstance(value, str):
            return value
        if value.onnx_name is None:
            value.onnx_name = self.fresh(value.name)
            self.initializers[value.onnx_name] = self.numpy_helper.from_array(
                value.value, value.onnx_name
            )
        return value.onnx_name

    def const(self, array, hint="const") -> str:
        return self.tensor(Const(np.asarray(array), hint))

    def node(self, op_type: str, inputs, scope: str, n_out: int = 1, **attrs) -> list[str]:
        self.count += 1
        name = f"{scope}/{op_type}_{self.count}" if scope else f"{op_type}_{self.count}"
        outs = [self.fresh(f"{name}:{i}") for i in range(n_out)]
        self.nodes.append(
            self.helper.make_node(op_type, [self.tensor(i) for i in inputs], outs, name, **attrs)
        )
        return outs

    def shape_tensor(self, shape, scope: str) -> str:
        """A 1-D int64 tensor for ``shape``; symbolic sizes are read from the graph inputs."""
        if all(isinstance(d, int) for d in shape):
            return self.const(np.array(shape, np.int64), "shape")
        pieces = []
        for d in shape:
            if isinstance(d, int):
                pieces.append(self.const(np.array([d], np.int64), "size"))
                continue
            where = self.symbols.get(str(d))
            if where is None:
                raise ONNXExportError(
                    f"df.export_onnx: layer {self.layer(scope)!r} computes a size {d} from the "
                    f"symbolic sizes {sorted(self.symbols)}; only the sizes themselves can be "
                    "exported. "
                    "Fix: give that size in the layout (an int instead of None)."
                )
            source, axis = where
            (shape_of,) = self.node("Shape", [source], scope, start=axis, end=axis + 1)
            pieces.append(shape_of)
        (out,) = self.node("Concat", pieces, scope, axis=0)
        return out

    # -- the walk ------------------------------------------------------------------------------

    def run(self, jaxpr: Jaxpr, consts, args, scope: str = "") -> list:
        env = {}

        def read(v):
            if isinstance(v, Literal):
                assert isinstance(v.aval, ShapedArray)  # a literal is an array of known dtype
                return Const(np.asarray(v.val, dtype=v.aval.dtype), "literal")
            return env[v]

        for var, value in zip(jaxpr.constvars, consts, strict=True):
            env[var] = value if isinstance(value, (str, Const)) else Const(value, "const")
        for var, value in zip(jaxpr.invars, args, strict=True):
            env[var] = value
        uses = _uses(jaxpr)
        i = 0
        while i < len(jaxpr.eqns):
            eqn = jaxpr.eqns[i]
            inner = str(eqn.source_info.name_stack)
            where = "/".join(s for s in (scope, inner) if s)
            softmax = _softmax_at(jaxpr.eqns, i, uses)
            if softmax is not None and not isinstance(read(softmax[0]), Const):
                x, axis, y, count = softmax
                env[y] = self.node("Softmax", [read(x)], where, axis=axis)[0]
                i += count
                continue
            ins = [read(v) for v in eqn.invars]
            outs = self.equation(eqn, ins, where)
            for var, value in zip(eqn.outvars, outs, strict=True):
                env[var] = value
            i += 1
        return [read(v) for v in jaxpr.outvars]

    def equation(self, eqn, ins, scope: str) -> list:
        name = eqn.primitive.name
        sub = _sub_jaxpr(eqn)
        if name in _CALLS and sub is not None:
            axis = _softmax_call(eqn)
            if axis is not None and not isinstance(ins[0], Const):
                return self.node("Softmax", [ins[0]], scope, axis=axis)
            named = self._named_call(eqn, ins, scope)
            if named is not None:
                return named
            if isinstance(sub, ClosedJaxpr):
                return self.run(sub.jaxpr, sub.consts, ins, scope)
            return self.run(sub, [], ins, scope)
        if all(isinstance(x, Const) for x in ins) and name != "scan" and sub is None:
            folded = self._fold(eqn, ins)
            if folded is not None:
                return folded
        if name == "scan":
            return self._scan(eqn, ins, scope)
        rule = getattr(self, f"_p_{name}", None)
        if name in _ELEMENTWISE:
            return self.node(_ELEMENTWISE[name], ins, scope)
        if name in _IDENTITY:
            return list(ins)
        if name in _REDUCE:
            axes = self.const(np.array(eqn.params["axes"], np.int64), "axes")
            return self.node(_REDUCE[name], [ins[0], axes], scope, keepdims=0)
        if rule is None:
            raise ONNXExportError(
                f"df.export_onnx: layer {self.layer(scope)!r} uses the JAX operation {name!r} "
                f"(at {_where(eqn)}), which has no ONNX lowering in difffn. Fix: write the "
                "layer's predict with jnp operations that lower (elementwise math, matmul/einsum, "
                "convolution, pooling, reshape/transpose/concatenate/slice, reductions, "
                "jax.lax.scan with a fixed length), or leave the layer out of the export."
            )
        return rule(eqn, ins, scope)

    def _fold(self, eqn, ins):
        try:
            out = eqn.primitive.bind(*[x.value for x in ins], **eqn.params)
        except Exception:  # noqa: BLE001 - an equation that cannot run here is lowered instead
            return None
        outs = out if eqn.primitive.multiple_results else [out]
        hint = next((x.name for x in ins if x.name not in ("literal", "const")), "const")
        return [Const(np.asarray(o), hint) for o in outs]

    # -- rules -------------------------------------------------------------------------------

    def _named_call(self, eqn, ins, scope):
        """``jnp.clip`` and ``jax.nn.leaky_relu`` (jitted functions that JAX names) of data with
        constant bounds or slope as ONNX's ``Clip`` and ``LeakyRelu``; else None (inlined)."""
        function = eqn.params.get("name")
        if function not in ("clip", "leaky_relu") or isinstance(ins[0], Const):
            return None
        if not all(isinstance(v, Const) and v.value.size == 1 for v in ins[1:]):
            return None
        dtype = eqn.outvars[0].aval.dtype
        if function == "clip" and len(ins) == 3:
            bounds = [self.const(np.asarray(v.value, dtype).reshape(()), "bound") for v in ins[1:]]
            return self.node("Clip", [ins[0], *bounds], scope)
        if function == "leaky_relu" and len(ins) == 2:
            alpha = float(np.asarray(ins[1].value).reshape(()))
            return self.node("LeakyRelu", [ins[0]], scope, alpha=alpha)
        return None

    def _p_rsqrt(self, eqn, ins, scope):
        (root,) = self.node("Sqrt", ins, scope)
        return self.node("Reciprocal", [root], scope)

    def _p_erfc(self, eqn, ins, scope):
        (erf,) = self.node("Erf", ins, scope)
        one = self.const(np.array(1, eqn.invars[0].aval.dtype), "one")
        return self.node("Sub", [one, erf], scope)

    def _p_square(self, eqn, ins, scope):
        return self.node("Mul", [ins[0], ins[0]], scope)

    def _p_integer_pow(self, eqn, ins, scope):
        y = np.array(eqn.params["y"], eqn.invars[0].aval.dtype)
        return self.node("Pow", [ins[0], self.const(y, "exponent")], scope)

    def _p_log1p(self, eqn, ins, scope):
        one = self.const(np.array(1, eqn.invars[0].aval.dtype), "one")
        (shifted,) = self.node("Add", [ins[0], one], scope)
        return self.node("Log", [shifted], scope)

    def _p_expm1(self, eqn, ins, scope):
        one = self.const(np.array(1, eqn.invars[0].aval.dtype), "one")
        (e,) = self.node("Exp", ins, scope)
        return self.node("Sub", [e, one], scope)

    def _p_ne(self, eqn, ins, scope):
        (eq,) = self.node("Equal", ins, scope)
        return self.node("Not", [eq], scope)

    def _p_clamp(self, eqn, ins, scope):
        low, x, high = ins
        (upper,) = self.node("Min", [x, high], scope)
        return self.node("Max", [upper, low], scope)

    def _p_convert_element_type(self, eqn, ins, scope):
        to = self.helper.np_dtype_to_tensor_dtype(np.dtype(eqn.params["new_dtype"]))
        return self.node("Cast", ins, scope, to=to)

    def _p_select_n(self, eqn, ins, scope):
        if len(ins) != 3:
            return self._unsupported(eqn, scope, "select_n with more than two cases")
        pred, if_false, if_true = ins
        if eqn.invars[0].aval.dtype != np.bool_:
            (pred,) = self.node("Cast", [pred], scope, to=self.helper.np_dtype_to_tensor_dtype(
                np.dtype(bool)))  # fmt: skip
        return self.node("Where", [pred, if_true, if_false], scope)

    def _p_reshape(self, eqn, ins, scope):
        sizes = list(eqn.params["new_sizes"])
        computed = [
            i for i, d in enumerate(sizes) if not isinstance(d, int) and str(d) not in self.symbols
        ]
        if len(computed) == 1:
            # One size computed from the symbolic ones (e.g. 5*B, observations and steps
            # flattened together): ONNX's Reshape infers a -1 from the element count.
            sizes[computed[0]] = -1
        return self.node("Reshape", [ins[0], self.shape_tensor(sizes, scope)], scope)

    def _p_squeeze(self, eqn, ins, scope):
        axes = self.const(np.array(eqn.params["dimensions"], np.int64), "axes")
        return self.node("Squeeze", [ins[0], axes], scope)

    def _p_expand_dims(self, eqn, ins, scope):
        axes = self.const(np.array(eqn.params["dimensions"], np.int64), "axes")
        return self.node("Unsqueeze", [ins[0], axes], scope)

    def _p_broadcast_in_dim(self, eqn, ins, scope):
        shape, dims = eqn.params["shape"], eqn.params["broadcast_dimensions"]
        x = ins[0]
        in_shape = eqn.invars[0].aval.shape
        missing = [i for i in range(len(shape)) if i not in dims]
        if missing:
            axes = self.const(np.array(missing, np.int64), "axes")
            (x,) = self.node("Unsqueeze", [x, axes], scope)
        same = all(in_shape[k] is shape[d] or in_shape[k] == shape[d] for k, d in enumerate(dims))
        if same and all(shape[i] == 1 for i in missing):  # only new axes of size 1
            return [x]
        return self.node("Expand", [x, self.shape_tensor(shape, scope)], scope)

    def _p_transpose(self, eqn, ins, scope):
        return self.node("Transpose", ins, scope, perm=list(eqn.params["permutation"]))

    def _p_concatenate(self, eqn, ins, scope):
        return self.node("Concat", ins, scope, axis=int(eqn.params["dimension"]))

    def _p_stack(self, eqn, ins, scope):
        axes = self.const(np.array([eqn.params["axis"]], np.int64), "axes")
        parts = [self.node("Unsqueeze", [x, axes], scope)[0] for x in ins]
        return self.node("Concat", parts, scope, axis=int(eqn.params["axis"]))

    def _p_round(self, eqn, ins, scope):
        if int(eqn.params.get("rounding_method", 0)) == 1:  # to nearest even, as ONNX's Round
            return self.node("Round", ins, scope)
        half = self.const(np.array(0.5, eqn.invars[0].aval.dtype), "half")
        (size,) = self.node("Abs", ins, scope)
        (shifted,) = self.node("Add", [size, half], scope)
        (down,) = self.node("Floor", [shifted], scope)
        (sign,) = self.node("Sign", ins, scope)
        return self.node("Mul", [sign, down], scope)

    def _p_gather(self, eqn, ins, scope):
        """``jnp.take(x, indices, axis)`` (one collapsed axis, whole slices) as ONNX's
        ``Gather``; other gathers have no lowering."""
        p = eqn.params
        dn = p["dimension_numbers"]
        x_aval, i_aval = eqn.invars[0].aval, eqn.invars[1].aval
        rank, batch = len(x_aval.shape), len(i_aval.shape) - 1
        nd = self._gather_nd(eqn, ins, scope)
        if nd is not None:
            return nd
        axis = dn.collapsed_slice_dims[0] if len(dn.collapsed_slice_dims) == 1 else -1
        expected = tuple(range(axis)) + tuple(range(axis + batch, rank - 1 + batch))
        whole = tuple(1 if k == axis else n for k, n in enumerate(x_aval.shape))
        if (
            axis < 0
            or tuple(dn.start_index_map) != (axis,)
            or tuple(dn.offset_dims) != expected
            or tuple(p["slice_sizes"]) != whole
            or dn.operand_batching_dims
            or i_aval.shape[-1:] != (1,)
        ):
            return self._unsupported(eqn, scope, "a gather other than jnp.take along one axis")
        last = self.const(np.array([batch], np.int64), "axes")
        if isinstance(ins[1], Const):
            indices = self.const(np.asarray(ins[1].value)[..., 0].astype(np.int64), "indices")
        else:
            (indices,) = self.node("Squeeze", [ins[1], last], scope)
        return self.node("Gather", [ins[0], indices], scope, axis=axis)

    def _gather_nd(self, eqn, ins, scope):
        """``x[i0, i1, ...]`` with index arrays (the leading ``k`` axes indexed, whole slices
        of the rest, no batching axes) as ONNX's ``GatherND``; else None."""
        p, dn = eqn.params, eqn.params["dimension_numbers"]
        x_shape, i_shape = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
        k, batch = i_shape[-1] if i_shape else 0, len(i_shape) - 1
        leading = tuple(range(k))
        if (
            k < 2
            or dn.operand_batching_dims
            or tuple(dn.collapsed_slice_dims) != leading
            or tuple(dn.start_index_map) != leading
            or tuple(p["slice_sizes"]) != (1,) * k + tuple(x_shape[k:])
            or tuple(dn.offset_dims) != tuple(range(batch, batch + len(x_shape) - k))
        ):
            return None
        if isinstance(ins[1], Const):
            indices = self.const(np.asarray(ins[1].value).astype(np.int64), "indices")
        else:
            (indices,) = self.node("Cast", [ins[1]], scope, to=7)  # INT64
        return self.node("GatherND", [ins[0], indices], scope, batch_dims=0)

    def _p_split(self, eqn, ins, scope):
        sizes = self.const(np.array(eqn.params["sizes"], np.int64), "split")
        return self.node("Split", [ins[0], sizes], scope, n_out=len(eqn.outvars),
                         axis=int(eqn.params["axis"]))  # fmt: skip

    def _p_slice(self, eqn, ins, scope):
        starts, limits = eqn.params["start_indices"], eqn.params["limit_indices"]
        strides = eqn.params["strides"] or (1,) * len(starts)
        if not all(isinstance(d, int) for d in (*starts, *limits)):
            return self._unsupported(eqn, scope, "slice with symbolic bounds")
        args = [np.array(v, np.int64) for v in (starts, limits, range(len(starts)), strides)]
        return self.node("Slice", [ins[0], *[self.const(a, "slice") for a in args]], scope)

    def _p_pad(self, eqn, ins, scope):
        config = eqn.params["padding_config"]
        if any(interior or lo < 0 or hi < 0 for lo, hi, interior in config):
            return self._unsupported(eqn, scope, "pad with interior or negative padding")
        pads = [lo for lo, _, _ in config] + [hi for _, hi, _ in config]
        return self.node("Pad", [ins[0], self.const(np.array(pads, np.int64), "pads"), ins[1]],
                         scope)  # fmt: skip

    def _p_argmax(self, eqn, ins, scope):
        return self._arg("ArgMax", eqn, ins, scope)

    def _p_argmin(self, eqn, ins, scope):
        return self._arg("ArgMin", eqn, ins, scope)

    def _arg(self, op_type, eqn, ins, scope):
        (axis,) = eqn.params["axes"]
        (index,) = self.node(op_type, ins, scope, axis=int(axis), keepdims=0)
        to = self.helper.np_dtype_to_tensor_dtype(np.dtype(eqn.params["index_dtype"]))
        return self.node("Cast", [index], scope, to=to)

    def _p_iota(self, eqn, ins, scope):
        shape = eqn.params["shape"]
        if not all(isinstance(d, int) for d in shape):
            return self._unsupported(eqn, scope, "iota of a symbolic size")
        value = jax.lax.iota(eqn.params["dtype"], shape[eqn.params["dimension"]])
        value = np.asarray(jnp.broadcast_to(
            jnp.expand_dims(value, [i for i in range(len(shape)) if i != eqn.params["dimension"]]),
            shape))  # fmt: skip
        return [Const(value, "iota")]

    def _p_dot_general(self, eqn, ins, scope):
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
        if not lb and rhs.ndim == 2 and tuple(lc) == (lhs.ndim - 1,):
            w = ins[1]
            if tuple(rc) == (1,):
                (w,) = self._transpose(w, (1, 0), scope)
            if tuple(rc) in ((0,), (1,)):
                return self.node("MatMul", [ins[0], w], scope)
        letters = iter("abcdefghijklmnopqrstuvwxyz")
        left = [next(letters) for _ in range(lhs.ndim)]
        right = [next(letters) for _ in range(rhs.ndim)]
        for i, j in zip((*lc, *lb), (*rc, *rb), strict=True):
            right[j] = left[i]
        batch = [left[i] for i in lb]
        free_l = [left[i] for i in range(lhs.ndim) if i not in (*lc, *lb)]
        free_r = [right[j] for j in range(rhs.ndim) if j not in (*rc, *rb)]
        equation = f"{''.join(left)},{''.join(right)}->{''.join(batch + free_l + free_r)}"
        return self.node("Einsum", ins, scope, equation=equation)

    def _transpose(self, x, perm, scope):
        if isinstance(x, Const):  # weights: stored in ONNX's order, no Transpose at run time
            return [Const(np.transpose(x.value, perm), x.name)]
        return self.node("Transpose", [x], scope, perm=list(perm))

    def _p_conv_general_dilated(self, eqn, ins, scope):
        p = eqn.params
        if any(d != 1 for d in p["lhs_dilation"]):
            return self._conv_transpose(eqn, ins, scope)
        if p["batch_group_count"] != 1:
            return self._unsupported(eqn, scope, "convolution with batch groups")
        numbers = p["dimension_numbers"]
        lhs_spec, rhs_spec, out_spec = numbers.lhs_spec, numbers.rhs_spec, numbers.out_spec
        (x,) = self._transpose(ins[0], lhs_spec, scope)
        (w,) = self._transpose(ins[1], rhs_spec, scope)
        pads = [lo for lo, _ in p["padding"]] + [hi for _, hi in p["padding"]]
        (y,) = self.node("Conv", [x, w], scope, strides=list(p["window_strides"]), pads=pads,
                         dilations=list(p["rhs_dilation"]),
                         group=int(p["feature_group_count"]))  # fmt: skip
        return self._transpose(y, tuple(np.argsort(out_spec)), scope)

    def _conv_transpose(self, eqn, ins, scope):
        """A convolution of the stride-dilated input (how JAX and ``df.ops.conv_transpose``
        transpose a convolution) as an ONNX ``ConvTranspose``: its weights are the kernel
        flipped, input and output channels swapped, and its pads the window extent less one
        less JAX's padding (a negative end pad is ONNX's ``output_padding``)."""
        p = eqn.params
        w = ins[1]
        plain = all(s == 1 for s in p["window_strides"]) and p["batch_group_count"] == 1
        if not plain or p["feature_group_count"] != 1 or not isinstance(w, Const):
            return self._unsupported(
                eqn, scope, "convolution with input dilation and strides, groups or data weights"
            )
        numbers = p["dimension_numbers"]
        kernel = np.transpose(w.value, numbers.rhs_spec)  # (O, I, spatial...)
        spatial = tuple(range(2, kernel.ndim))
        weights = np.swapaxes(np.flip(kernel, spatial), 0, 1)  # (I, O, spatial...)
        extents = [(k - 1) * d + 1 for k, d in zip(kernel.shape[2:], p["rhs_dilation"])]
        begin = [e - 1 - lo for e, (lo, _) in zip(extents, p["padding"])]
        end = [e - 1 - hi for e, (_, hi) in zip(extents, p["padding"])]
        extra = [max(-n, 0) for n in end]
        if min(begin) < 0 or any(x >= s for x, s in zip(extra, p["lhs_dilation"])):
            return self._unsupported(eqn, scope, "transposed convolution with this padding")
        (x,) = self._transpose(ins[0], numbers.lhs_spec, scope)
        attrs: dict[str, Any] = dict(strides=list(p["lhs_dilation"]),
                                     dilations=list(p["rhs_dilation"]),
                                     pads=begin + [max(n, 0) for n in end])  # fmt: skip
        if any(extra):
            attrs["output_padding"] = extra
        (y,) = self.node("ConvTranspose", [x, Const(weights, w.name)], scope, **attrs)
        return self._transpose(y, tuple(np.argsort(numbers.out_spec)), scope)

    def _pool(self, eqn, ins, scope, op_type):
        p = eqn.params
        window, strides, padding = p["window_dimensions"], p["window_strides"], p["padding"]
        if any(d != 1 for d in (*p["base_dilation"], *p["window_dilation"])):
            return None
        spatial = [i for i, (w, s, pad) in enumerate(zip(window, strides, padding, strict=True))
                   if w != 1 or s != 1 or pad != (0, 0)]  # fmt: skip
        rest = [i for i in range(len(window)) if i not in spatial]
        if len(rest) != 2 or not spatial:
            return None
        perm = (*rest, *spatial)
        (x,) = self._transpose(ins[0], perm, scope)
        attrs: dict[str, Any] = dict(
            kernel_shape=[window[i] for i in spatial],
            strides=[strides[i] for i in spatial],
            pads=[padding[i][0] for i in spatial] + [padding[i][1] for i in spatial],
        )
        if op_type == "AveragePool":
            attrs["count_include_pad"] = 1
        (y,) = self.node(op_type, [x], scope, **attrs)
        if op_type == "AveragePool":  # JAX sums the window: undo the mean's division
            size = np.array(math.prod(window), eqn.invars[0].aval.dtype)
            (y,) = self.node("Mul", [y, self.const(size, "window_size")], scope)
        return self._transpose(y, tuple(np.argsort(perm)), scope)

    def _p_reduce_window_max(self, eqn, ins, scope):
        return self._pool(eqn, ins, scope, "MaxPool") or self._unsupported(
            eqn, scope, "a max window over other than two non-window axes, or with dilation"
        )

    def _p_reduce_window_sum(self, eqn, ins, scope):
        return self._pool(eqn, ins, scope, "AveragePool") or self._unsupported(
            eqn, scope, "a sum window over other than two non-window axes, or with dilation"
        )

    def _scan(self, eqn, ins, scope):
        p = eqn.params
        length = p["length"]
        if not isinstance(length, int):
            return self._unsupported(eqn, scope, "jax.lax.scan over a symbolic length")
        n_consts, n_carry = p["num_consts"], p["num_carry"]
        consts, carry, xs = (
            ins[:n_consts],
            ins[n_consts : n_consts + n_carry],
            ins[n_consts + n_carry :],
        )
        body: ClosedJaxpr = p["jaxpr"]
        ys_steps = []
        steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
        for t in steps:
            index = self.const(np.array(t, np.int64), "step")
            x_t = [self.node("Gather", [x, index], scope, axis=0)[0] for x in xs]
            outs = self.run(body.jaxpr, body.consts, [*consts, *carry, *x_t], scope)
            carry, ys = outs[:n_carry], outs[n_carry:]
            ys_steps.append(ys)
        if p["reverse"]:
            ys_steps.reverse()
        stacked = []
        for k in range(len(eqn.outvars) - n_carry):
            zero = self.const(np.array([0], np.int64), "axes")
            parts = [self.node("Unsqueeze", [ys[k], zero], scope)[0] for ys in ys_steps]
            stacked.append(self.node("Concat", parts, scope, axis=0)[0])
        return [*carry, *stacked]

    def _unsupported(self, eqn, scope, what):
        raise ONNXExportError(
            f"df.export_onnx: layer {self.layer(scope)!r} uses {what} (JAX operation "
            f"{eqn.primitive.name!r} at {_where(eqn)}), which has no ONNX lowering in difffn. "
            "Fix: express it with operations that lower, or give the sizes in the layouts."
        )


def _uses(jaxpr) -> dict[int, int]:
    """How many times each variable (by id) is read by the equations and the outputs."""
    counts: dict[int, int] = {}
    for v in [*(v for e in jaxpr.eqns for v in e.invars), *jaxpr.outvars]:
        if not isinstance(v, Literal):
            counts[id(v)] = counts.get(id(v), 0) + 1
    return counts


_SOFTMAX = ("reduce_max", "max", "broadcast_in_dim", "stop_gradient", "sub", "exp", "reduce_sum",
            "broadcast_in_dim", "div")  # fmt: skip


def _softmax_at(eqns, i, uses):
    """``(x, axis, y, count)`` where ``eqns[i : i + count]`` compute ``y =
    jax.nn.softmax(x, axis)`` (the equations JAX writes for it) and nothing else reads their
    intermediate values, so ONNX's ``Softmax`` replaces them; else None."""
    window = eqns[i : i + len(_SOFTMAX)]
    if tuple(e.primitive.name for e in window) != _SOFTMAX:
        return None
    top, clamp, b1, stop, sub, exp, total, b2, div = window
    axes = top.params["axes"]
    if len(axes) != 1 or tuple(total.params["axes"]) != tuple(axes):
        return None
    x = top.invars[0]
    steps = [
        (clamp.invars[1], top), (b1.invars[0], clamp), (stop.invars[0], b1),
        (sub.invars[1], stop), (exp.invars[0], sub), (total.invars[0], exp),
        (b2.invars[0], total), (div.invars[0], exp), (div.invars[1], b2),
    ]  # fmt: skip
    if sub.invars[0] is not x or any(v is not e.outvars[0] for v, e in steps):
        return None
    if not isinstance(clamp.invars[0], Literal) or clamp.invars[0].val != -np.inf:
        return None
    expected = {id(e.outvars[0]): 1 for e in (top, clamp, b1, stop, sub, total, b2)}
    expected[id(exp.outvars[0])] = 2
    if any(uses.get(k, 0) != n for k, n in expected.items()):
        return None
    return x, int(axes[0]), div.outvars[0], len(_SOFTMAX)


_SOFTMAX_RULE = ("reduce_max", "convert_element_type", "max", "broadcast_in_dim", "sub", "exp",
                 "reduce_sum", "broadcast_in_dim", "div")  # fmt: skip


def _softmax_call(eqn) -> int | None:
    """The axis, where ``eqn`` is ``jax.nn.softmax`` with JAX's own tangent rule (the
    ``custom_jvp_call`` that ``jax.softmax_custom_jvp`` makes, as ``df.ops`` uses it); else None."""
    sub = _sub_jaxpr(eqn)
    if eqn.primitive.name != "custom_jvp_call" or not isinstance(sub, ClosedJaxpr):
        return None
    inner = sub.jaxpr
    if tuple(e.primitive.name for e in inner.eqns) != _SOFTMAX_RULE or len(inner.invars) != 2:
        return None
    top, cast, clamp, b1, sub_, exp, total, b2, div = inner.eqns
    x, initial = inner.invars
    axes = top.params["axes"]
    steps = [
        (top.invars[0], x), (cast.invars[0], initial), (clamp.invars[0], cast.outvars[0]),
        (clamp.invars[1], top.outvars[0]), (b1.invars[0], clamp.outvars[0]),
        (sub_.invars[0], x), (sub_.invars[1], b1.outvars[0]), (exp.invars[0], sub_.outvars[0]),
        (total.invars[0], exp.outvars[0]), (b2.invars[0], total.outvars[0]),
        (div.invars[0], exp.outvars[0]), (div.invars[1], b2.outvars[0]),
    ]  # fmt: skip
    if (
        len(axes) != 1
        or tuple(total.params["axes"]) != tuple(axes)
        or any(a is not b for a, b in steps)
        or list(inner.outvars) != [div.outvars[0]]
        or not isinstance(eqn.invars[1], Literal)
        or eqn.invars[1].val != -np.inf
    ):
        return None
    return int(axes[0])


def _where(eqn) -> str:
    from jax._src import source_info_util  # the one way JAX offers to print an equation's line

    return source_info_util.summarize(eqn.source_info)
