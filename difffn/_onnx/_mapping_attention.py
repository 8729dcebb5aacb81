r"""Multi-head self-attention written out in ONNX nodes, found and imported as ``SelfAttention``.

Exporters write attention as a subgraph (what ``torch.onnx.export`` writes for
``nn.MultiheadAttention`` with constant shapes, and hand-built transformer graphs):

.. code-block:: text

    q = Transpose(Reshape(MatMul(x, Wq) + bq, [0, 0, H, d]), [0, 2, 1, 3])
    k = Transpose(Reshape(MatMul(x, Wk) + bk, [0, 0, H, d]), [0, 2, 3, 1])
    v = Transpose(Reshape(MatMul(x, Wv) + bv, [0, 0, H, d]), [0, 2, 1, 3])
    a = MatMul(Softmax(MatMul(q, k) / sqrt(d), axis=-1), v)
    y = MatMul(Reshape(Transpose(a, [0, 2, 1, 3]), [0, 0, H*d]), Wo) + bo

(keys may also be transposed in two steps; the scale may be a ``Mul`` by $1/\sqrt d$; the
biases may be missing). `fuse` runs before the import walk: it replaces every such subgraph
whose inner tensors feed nothing else with one node of difffn's own (domain ``difffn.fused``,
op ``SelfAttention``), which the importer maps to ``df.layers.SelfAttention`` when the input is
batch first (``"BTC"``), and otherwise runs with `self_attention`, the same computation in
ONNX's axis order. Shapes given by ``Shape``/``Gather``/``Concat`` subgraphs (dynamic exports)
are not matched: those graphs import node by node.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from ..layers import SelfAttention
from ._labels import keep
from ._load import Node
from ._mapping_base import absent, add, const, runtime, source
from ._ops import FUSED_DOMAIN, FrozenArray, aligned, fused

_PROJECTIONS = ("query", "key", "value", "output")


class _Graph:
    """The nodes of a graph by output, with every tensor's consumers and constants."""

    def __init__(self, spec):
        self.spec = spec
        self.producer = {out: node for node in spec.nodes for out in node.outputs if out}
        self.consumers: dict[str, list[Node]] = {}
        for node in spec.nodes:
            for name in node.inputs:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {info.name for info in spec.outputs}

    def constant(self, name: str):
        value = self.spec.initializers.get(name)
        if isinstance(value, np.ndarray):
            return value
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            attribute = dict(node.attributes).get("value")
            return attribute.array if isinstance(attribute, FrozenArray) else None
        return None

    def only_consumer(self, name: str) -> Node | None:
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.outputs:
            return None
        return users[0]

    def made_by(self, name: str, op_type: str) -> Node | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None


def _perm(node) -> tuple[int, ...]:
    return tuple(dict(node.attributes).get("perm", ()))


def _projection(g: _Graph, name: str):
    """``name = Reshape(MatMul(x, W) [+ b], [0, 0, H, d])``: (x, W, b or "", H, d, nodes)."""
    reshape = g.made_by(name, "Reshape")
    if reshape is None:
        return None
    target = g.constant(reshape.inputs[1])
    if target is None or target.shape != (4,) or tuple(target[:2]) != (0, 0) or min(target[2:]) < 1:
        return None
    heads, size = int(target[2]), int(target[3])
    nodes, bias, inner = [reshape], "", reshape.inputs[0]
    add_node = g.made_by(inner, "Add")
    if add_node is not None:
        for i in (0, 1):
            b = g.constant(add_node.inputs[i])
            if b is not None and b.shape == (heads * size,):
                bias, inner = add_node.inputs[i], add_node.inputs[1 - i]
                nodes.append(add_node)
                break
        else:
            return None
    matmul = g.made_by(inner, "MatMul")
    if matmul is None:
        return None
    w = g.constant(matmul.inputs[1])
    if w is None or w.ndim != 2 or w.shape[1] != heads * size:
        return None
    nodes.append(matmul)
    return matmul.inputs[0], matmul.inputs[1], bias, heads, size, nodes


def _keys(g: _Graph, name: str):
    """Keys transposed to ``(N, H, d, T)``: one Transpose [0, 2, 3, 1], or two."""
    last = g.made_by(name, "Transpose")
    if last is None:
        return None
    if _perm(last) == (0, 2, 3, 1):
        found = _projection(g, last.inputs[0])
        return None if found is None else (*found[:5], [last, *found[5]])
    first = g.made_by(last.inputs[0], "Transpose")
    if _perm(last) != (0, 1, 3, 2) or first is None or _perm(first) != (0, 2, 1, 3):
        return None
    found = _projection(g, first.inputs[0])
    return None if found is None else (*found[:5], [last, first, *found[5]])


def _heads(g: _Graph, name: str):
    """Queries or values: ``Transpose(projection, [0, 2, 1, 3])``."""
    node = g.made_by(name, "Transpose")
    if node is None or _perm(node) != (0, 2, 1, 3):
        return None
    found = _projection(g, node.inputs[0])
    return None if found is None else (*found[:5], [node, *found[5]])


def _scaled(g: _Graph, name: str, size: int):
    """``name = MatMul(q, k) / sqrt(d)`` (or ``* 1/sqrt(d)``): (q, k, nodes)."""
    node = g.producer.get(name)
    if node is None or node.op_type not in ("Div", "Mul"):
        return None
    scale = g.constant(node.inputs[1])
    wanted = math.sqrt(size) if node.op_type == "Div" else 1 / math.sqrt(size)
    if scale is None or scale.size != 1 or not math.isclose(float(scale.reshape(())), wanted,
                                                            rel_tol=1e-6):  # fmt: skip
        return None
    scores = g.made_by(node.inputs[0], "MatMul")
    if scores is None:
        return None
    return scores.inputs[0], scores.inputs[1], [node, scores]


def _match(g: _Graph, softmax: Node):
    axis = dict(softmax.attributes).get("axis", -1)
    if axis not in (-1, 3):
        return None
    weighted = g.only_consumer(softmax.outputs[0])
    if weighted is None or weighted.op_type != "MatMul" or weighted.inputs[0] != softmax.outputs[0]:
        return None
    values = _heads(g, weighted.inputs[1])
    if values is None:
        return None
    x, *_, heads, size, _ = values
    scaled = _scaled(g, softmax.inputs[0], size)
    if scaled is None:
        return None
    queries, keys = _heads(g, scaled[0]), _keys(g, scaled[1])
    if queries is None or keys is None:
        return None
    parts = [queries, keys, values]
    if any(p[0] != x or p[3] != heads for p in parts) or queries[4] != keys[4]:
        return None
    # after attention: heads back together, then the output projection
    merged = g.only_consumer(weighted.outputs[0])
    if merged is None or merged.op_type != "Transpose" or _perm(merged) != (0, 2, 1, 3):
        return None
    reshape = g.only_consumer(merged.outputs[0])
    target = None if reshape is None else g.constant(reshape.inputs[1])
    if reshape is None or reshape.op_type != "Reshape" or target is None:
        return None
    if tuple(target) != (0, 0, heads * values[4]):
        return None
    out = g.only_consumer(reshape.outputs[0])
    w_out = None if out is None else g.constant(out.inputs[1])
    if out is None or out.op_type != "MatMul" or w_out is None or w_out.ndim != 2:
        return None
    nodes = [softmax, weighted, merged, reshape, out, *scaled[2]]
    for part in parts:
        nodes += part[5]
    b_out, result = "", out.outputs[0]
    bias_add = g.only_consumer(result)
    if bias_add is not None and bias_add.op_type == "Add":
        other = bias_add.inputs[1] if bias_add.inputs[0] == result else bias_add.inputs[0]
        b = g.constant(other)
        if b is not None and b.shape == (w_out.shape[1],):
            b_out, result = other, bias_add.outputs[0]
            nodes.append(bias_add)
    inner = {t for node in nodes for t in node.outputs} - {result}
    if any(t in g.outputs or any(u not in nodes for u in g.consumers.get(t, [])) for t in inner):
        return None  # an inner tensor is used elsewhere: keep the nodes
    inputs = [x]
    for part in parts:
        inputs += [part[1], part[2]]
    inputs += [out.inputs[1], b_out]
    fused_node = Node(
        "SelfAttention",
        FUSED_DOMAIN,
        softmax.name.rsplit("/", 1)[0] or softmax.name,
        tuple(inputs),
        (result,),
        (("num_heads", heads),),
    )
    return fused_node, nodes


def fuse(spec):
    """``spec`` with each self-attention subgraph replaced by one ``SelfAttention`` node."""
    g = _Graph(spec)
    position = {id(node): i for i, node in enumerate(spec.nodes)}
    replaced: dict[int, Node | None] = {}
    for node in spec.nodes:
        if node.op_type != "Softmax" or id(node) in replaced:
            continue
        found = _match(g, node)
        if found is None:
            continue
        fused_node, nodes = found
        for old in nodes:
            replaced[id(old)] = None
        # the fused node takes the place of the last of its nodes (its inputs exist by then)
        last = max(nodes, key=lambda n: position[id(n)])
        replaced[id(last)] = fused_node
    if not replaced:
        return spec
    kept = []
    for node in spec.nodes:
        if id(node) not in replaced:
            kept.append(node)
        elif replaced[id(node)] is not None:
            kept.append(replaced[id(node)])
    return dataclasses.replace(spec, nodes=kept)


@fused("SelfAttention", labels=keep)
def self_attention(a, x, wq, bq, wk, bk, wv, bv, wo, bo):
    """The fused subgraph in ONNX's order: ``x`` is ``(N, T, C)``."""
    heads = int(a.get("num_heads"))

    def project(w, b):
        y = jnp.matmul(x, w) if b is None else jnp.add(*aligned(jnp.matmul(x, w), b))
        return jnp.reshape(y, (*y.shape[:2], heads, -1))

    q, k, v = project(wq, bq), project(wk, bk), project(wv, bv)
    scores = jnp.einsum("nthd,nshd->nhts", q, k) / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    y = jnp.einsum("nhts,nshd->nthd", weights, v)
    y = jnp.matmul(jnp.reshape(y, (*y.shape[:2], -1)), wo)
    return y if bo is None else jnp.add(*aligned(y, bo))


def map_self_attention(imp, info, out_shapes, out_dtypes, out_labels):
    """The fused node as ``df.layers.SelfAttention`` (batch-first input)."""
    x = runtime(imp, info, 0)
    params = [const(info, i) for i in range(1, 9)]
    if x is None or x.order is not None or x.labels != "BTC":
        return False
    weights = [p for p in params[0::2] if p is not None]
    if len(weights) < len(params[0::2]):
        return False
    heads = int(info.a.get("num_heads"))
    biases = [
        np.zeros(w.shape[1], w.dtype) if absent(info, 2 + 2 * k) else b
        for k, (w, b) in enumerate(zip(weights, params[1::2]))
    ]
    learnables = {}
    parts = []
    for k, (name, w, b) in enumerate(zip(_PROJECTIONS, weights, biases)):
        learnables[f"{name}_weights"], learnables[f"{name}_bias"] = w, b
        parts.append((f"{name}_weights", source(info, 1 + 2 * k)))
        has_bias = not absent(info, 2 + 2 * k)
        parts.append((f"{name}_bias", source(info, 2 + 2 * k) if has_bias else "zeros"))
    layer = SelfAttention(
        heads,
        int(weights[0].shape[1]),
        num_value_channels=int(weights[2].shape[1]),
        output_size=int(weights[3].shape[1]),
        name=imp.unique(info.node.name),
        description=f"ONNX self-attention nodes {info.node.name!r}: "
        + ", ".join(f"{field} = {where}" for field, where in parts),
        **learnables,
    )
    return add(imp, info, layer, [info.inputs[0]], out_labels, out_shapes, out_dtypes)
