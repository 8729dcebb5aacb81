"""ONNX ``LSTM`` and ``GRU`` nodes as difffn's ``LSTM``, ``BiLSTM`` and ``GRU`` layers.

ONNX and difffn order the gate blocks differently: an ONNX LSTM's are input, output, forget,
cell (``iofc``), difffn's (MATLAB's) input, forget, cell, output (``ifgo``); an ONNX GRU's are
update, reset, hidden (``zrh``), difffn's reset, update, candidate. ONNX keeps separate input
and recurrent biases where difffn adds them (except for the GRU's recurrent candidate bias,
which ``reset_gate_mode="recurrent-bias-after-multiplication"`` keeps apart, as ONNX's
``linear_before_reset=1`` does). ONNX's ``Y`` has a direction axis, ``(T, D, N, H)``; a difffn
layer returns ``(N, T, D*H)`` channels-last, the same values in the same storage order, so a
reshape (no transpose) gives ONNX's tensor.

A node maps when difffn computes exactly the same: a forward LSTM or GRU, a bidirectional LSTM
(``BiLSTM``), constant weights, default or sigmoid/hard-sigmoid gates and tanh/softsign states,
no clip, no peepholes, no ``sequence_lens``, constant initial states (or PyTorch's zeros of
the batch's size), and either ``Y`` or ``Y_h`` used (the layer has one output). Other RNN nodes
(a bidirectional GRU, initial states given as network inputs) run as ONNX operators.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..layers import GRU, LSTM, BiLSTM, FunctionLayer
from ._layers import NodeFunction
from ._mapping_base import absent, const, describe, floating, runtime, source, used
from ._ops import Attrs, FrozenArray

_GATE_FUNCTIONS = {"sigmoid": "sigmoid", "hardsigmoid": "hard-sigmoid"}
_STATE_FUNCTIONS = {"tanh": "tanh", "softsign": "softsign"}
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh")}


def _blocks(array, hidden: int, order) -> np.ndarray:
    """Gate blocks of ``hidden`` rows along axis 0, taken in ``order``."""
    return np.concatenate([array[k * hidden : (k + 1) * hidden] for k in order])


_IFGO = (0, 2, 3, 1)  # ONNX LSTM i, o, f, c -> i, f, c, o
_RZH = (1, 0, 2)  # ONNX GRU z, r, h -> r, z, h


def _common(imp, info):
    """What every mapped RNN node needs, or None: (x, W, R, directions, activation names)."""
    a = info.a
    x = runtime(imp, info, 0)
    w, r = const(info, 1), const(info, 2)
    if x is None or x.order is not None or not (floating(w) and floating(r)):
        return None
    directions = {"forward": 1, "bidirectional": 2}.get(a.get("direction", "forward"))
    if directions is None or w.shape[0] != directions or x.labels != _sequence_labels(a):
        return None
    if a.get("clip") is not None or not absent(info, 4):  # sequence_lens
        return None
    if a.get("activation_alpha") is not None or a.get("activation_beta") is not None:
        return None
    names = a.get("activations") or _DEFAULT_ACTIVATIONS[a.op_type] * directions
    per = len(_DEFAULT_ACTIVATIONS[a.op_type])
    names = [n.lower() for n in names]
    if len(names) != per * directions or names[:per] * directions != names:
        return None
    return x, w, r, directions, names[:per]


def _sequence_labels(a) -> str:
    return "BTC" if a.get("layout", 0) else "TBC"


def _initial(imp, info, i, directions: int, hidden: int):
    """Initial state ``i`` as difffn's ``(1, D*H)``, or None when it cannot be mapped.

    PyTorch writes the zero state of an RNN called without one as zeros of a size computed
    from the batch (``ConstantOfShape`` or ``Expand`` of ``Shape``): a program whose value is
    zeros (at the stand-in sizes, of shape ``(D, N, H)``) is the layer's zero state."""
    value = const(info, i)
    if absent(info, i) or _zeros(imp, info, i, directions, hidden):
        return np.zeros((1, directions * hidden), np.float32)
    if floating(value) and value.size == directions * hidden:
        per_direction = value.reshape(directions, hidden)  # (D, 1, H) or (1, D, H)
        return per_direction.reshape(1, directions * hidden)
    return None


def _zeros(imp, info, i, directions: int, hidden: int) -> bool:
    if i >= len(info.input_kinds) or info.input_kinds[i] != "program":
        return False
    value = imp.stand_in(info.inputs[i])
    x = imp.values[info.inputs[0]]
    batch = x.shape[x.labels.index("B")]
    return value.shape == (directions, batch, hidden) and not np.any(value)


def _outputs(imp, info, count: int):
    """Which of ``Y``, ``Y_h`` is used, or None when the layer cannot give it (both, or
    ``Y_c``)."""
    outputs = list(info.outputs) + [""] * (count - len(info.outputs))
    use = [used(imp, name) for name in outputs]
    if any(use[2:]) or use[0] == use[1]:
        return None
    return "Y" if use[0] else "Y_h"


def _lstm(imp, info, out_shapes, out_dtypes, out_labels):
    common = _common(imp, info)
    if common is None or not absent(info, 7) or info.a.get("input_forget", 0):  # 7: peepholes
        return False
    x, w, r, directions, (f, g, h) = common
    # difffn's LSTM has one state activation, for the cell input (g) and the output (h)
    gate, state = _GATE_FUNCTIONS.get(f), _STATE_FUNCTIONS.get(g)
    if gate is None or state is None or g != h:
        return False
    hidden = int(r.shape[-1])
    which = _outputs(imp, info, 3)
    hidden_state, cell_state = (_initial(imp, info, i, directions, hidden) for i in (5, 6))
    b = const(info, 3)
    if which is None or hidden_state is None or cell_state is None:
        return False
    if not (absent(info, 3) or floating(b)):
        return False
    weights, recurrent, biases = [], [], []
    for d in range(directions):
        weights.append(_blocks(w[d], hidden, _IFGO).T)
        recurrent.append(_blocks(r[d], hidden, _IFGO).T)
        if b is None:
            biases.append(np.zeros(4 * hidden, w.dtype))
        else:
            biases.append(_blocks(b[d, : 4 * hidden] + b[d, 4 * hidden :], hidden, _IFGO))
    cls = LSTM if directions == 1 else BiLSTM
    how = "iofc -> ifgo, transposed" + (", directions side by side" if directions == 2 else "")
    layer = cls(
        hidden,
        output_mode="sequence" if which == "Y" else "last",
        gate_activation_function=gate,
        state_activation_function=state,
        input_weights=jnp.asarray(np.concatenate(weights, axis=1)),
        recurrent_weights=jnp.asarray(np.concatenate(recurrent, axis=1)),
        bias=jnp.asarray(np.concatenate(biases)),
        hidden_state=jnp.asarray(hidden_state),
        cell_state=jnp.asarray(cell_state),
        name=imp.unique(info.node.name),
        description=describe(
            info,
            [
                ("input_weights", source(info, 1, how)),
                ("recurrent_weights", source(info, 2, how)),
                (
                    "bias",
                    source(info, 3, "W and R biases summed, iofc -> ifgo")
                    if b is not None
                    else "zeros (the node has none)",
                ),
            ],
        ),  # fmt: skip
    )
    return _place(imp, info, layer, x, which, directions, hidden, out_shapes, out_dtypes)


def _gru(imp, info, out_shapes, out_dtypes, out_labels):
    common = _common(imp, info)
    if common is None:
        return False
    x, w, r, directions, (gate, state) = common
    gate, state = _GATE_FUNCTIONS.get(gate), _STATE_FUNCTIONS.get(state)
    hidden = int(r.shape[-1])
    which = _outputs(imp, info, 2)
    hidden_state = _initial(imp, info, 5, directions, hidden)
    b = const(info, 3)
    if gate is None or state is None or directions != 1 or which is None or hidden_state is None:
        return False
    if not (absent(info, 3) or floating(b)):
        return False
    if b is None:
        w_bias = r_bias = np.zeros(3 * hidden, w.dtype)
    else:
        w_bias, r_bias = b[0, : 3 * hidden], b[0, 3 * hidden :]
    if not info.a.get("linear_before_reset", 0):
        # the reset gate multiplies the state before the recurrent product: every bias adds
        mode, bias, how = "before-multiplication", _blocks(w_bias + r_bias, hidden, _RZH), "summed"
    elif not r_bias.any():
        mode, bias, how = "after-multiplication", _blocks(w_bias, hidden, _RZH), "W biases"
    else:
        mode, how = "recurrent-bias-after-multiplication", "W biases, then R biases"
        bias = np.concatenate([_blocks(w_bias, hidden, _RZH), _blocks(r_bias, hidden, _RZH)])
    layer = GRU(
        hidden,
        output_mode="sequence" if which == "Y" else "last",
        reset_gate_mode=mode,
        gate_activation_function=gate,
        state_activation_function=state,
        input_weights=jnp.asarray(_blocks(w[0], hidden, _RZH).T),
        recurrent_weights=jnp.asarray(_blocks(r[0], hidden, _RZH).T),
        bias=jnp.asarray(bias),
        hidden_state=jnp.asarray(hidden_state),
        name=imp.unique(info.node.name),
        description=describe(
            info,
            [
                ("input_weights", source(info, 1, "zrh -> rzh, transposed")),
                ("recurrent_weights", source(info, 2, "zrh -> rzh, transposed")),
                (
                    "bias",
                    source(info, 3, f"{how}, zrh -> rzh")
                    if b is not None
                    else "zeros (the node has none)",
                ),
            ],
        ),  # fmt: skip
    )
    return _place(imp, info, layer, x, which, directions, hidden, out_shapes, out_dtypes)


def _place(imp, info, layer, x, which, directions, hidden, out_shapes, out_dtypes) -> bool:
    """Add the layer, and a reshape that gives its output ONNX's direction axis."""
    imp.place(layer, [info.inputs[0]])
    batch_first = bool(info.a.get("layout", 0))
    if which == "Y":
        inner_labels, target, shape = x.labels, info.outputs[0], out_shapes[0]
        # (T, N, D*H) -> (T, D, N, H); batch first (N, T, D*H) -> (N, T, D, H)
        labels = "BTUC" if batch_first else "TUBC"
        target_shape = [0, 0, directions, hidden] if batch_first else [0, directions, -1, hidden]
    else:
        inner_labels, target, shape = "BC", info.outputs[1], out_shapes[1]
        labels = "BUC" if batch_first else "UBC"
        target_shape = [0, directions, hidden] if batch_first else [directions, -1, hidden]
    axis = labels.index("U")
    inner_shape = tuple(n for i, n in enumerate(shape) if i != axis)[:-1] + (directions * hidden,)
    inner = f"{target}#difffn-{layer.name}"
    imp.set_output(inner, layer.name, "out", inner_labels, inner_shape, out_dtypes[0])
    fn = NodeFunction(
        "Reshape",
        Attrs("Reshape", (), max(info.a.opset, 14), layer.name, 1),
        (("input", 0, None), ("const", FrozenArray(np.array(target_shape, np.int64)))),
        (inner_labels,),
        (labels,),
        "reshape",
    )
    reshape = FunctionLayer(
        fn,
        formattable=True,
        num_inputs=1,
        name=imp.unique(f"{layer.name}_directions"),
        description=f"ONNX's direction axis of {target!r} (a reshape of stored data)",
    )
    imp.place(reshape, [inner])
    imp.set_output(target, reshape.name, "out", labels, shape, out_dtypes[0])
    return True


RULES = {"LSTM": _lstm, "GRU": _gru}
