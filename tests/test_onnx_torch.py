"""Models exported by PyTorch (``tests/data/torch_onnx``, made by its ``make_models.py``; torch
is not a test dependency): a ViT, GPT-2, BERT, (bi)LSTM/GRU classifiers with and without initial
states, a 1-D CNN and a U-Net, each exported by the TorchScript exporter and, where it works,
the dynamo exporter. difffn's import runs them at every stored batch size with ONNX Runtime's
outputs (and torch's), gives torch's float64 gradients, and exports them back to files that
ONNX Runtime runs with ``net.predict``'s outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest

import difffn as df
from difffn._onnx import _labels
from difffn._onnx._import import import_model

DATA = Path(__file__).parent / "data" / "torch_onnx"
MADE = json.loads((DATA / "models.json").read_text())
FILES = [(name, file) for name, files in MADE.items() for file in files]
BATCHES = (1, 2, 3, 5)


def _stored(name):
    with np.load(DATA / f"{name}.npz") as z:
        return dict(z)


def _session(path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _to_difffn(x, labels):
    return np.transpose(x, _labels.storage_perm(labels))


def _to_onnx(y, labels):
    return np.transpose(np.asarray(y), _labels.inverse(_labels.storage_perm(labels)))


def _predict(result, xs):
    net = result.network
    labels = list(result.input_labels.values())
    args = [_to_difffn(x, lab) for x, lab in zip(xs, labels)]
    ys = net.predict(*args)
    ys = ys if isinstance(ys, tuple) else (ys,)
    out_labels = list(result.output_labels.values())
    return [_to_onnx(df.stripdims(y), lab) for y, lab in zip(ys, out_labels)]


@pytest.fixture(scope="module")
def imported():
    cache = {}

    def get(file):
        if file not in cache:
            cache[file] = import_model(str(DATA / file))
        return cache[file]

    return get


@pytest.mark.parametrize(("name", "file"), FILES, ids=[f for _, f in FILES])
def test_runs_at_every_batch_size_like_onnx_runtime_and_torch(name, file, imported):
    stored = _stored(name)
    result = imported(file)
    session = _session(DATA / file)
    names = [i.name for i in session.get_inputs()]
    for batch in BATCHES:
        xs = [stored[f"x{i}_b{batch}"] for i in range(len(names))]
        expected = session.run(None, dict(zip(names, xs)))
        got = _predict(result, xs)
        assert len(got) == len(expected)
        for k, (y, e) in enumerate(zip(got, expected)):
            scale = float(np.max(np.abs(e))) + 1e-6
            assert y.shape == e.shape, (file, batch, k)
            np.testing.assert_allclose(y, e, atol=2e-5 * scale, rtol=1e-4)
            # and the file computes what torch computed
            np.testing.assert_allclose(e, stored[f"y{k}_b{batch}"], atol=2e-5 * scale, rtol=1e-4)


GRADIENTS = [(name, file) for name, file in FILES if "grad_out" in _stored(name)]


def _float64(net):
    def cast(leaf):
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.asarray(leaf, jnp.float64)
        return leaf

    return jax.tree.map(cast, net)


@pytest.mark.parametrize(("name", "file"), GRADIENTS, ids=[f for _, f in GRADIENTS])
def test_input_gradients_match_torch_in_float64(name, file, x64):
    stored = _stored(name)
    result = import_model(str(DATA / file))
    net = _float64(result.network)
    labels = list(result.input_labels.values())
    out_labels = list(result.output_labels.values())
    count = len([k for k in stored if k.startswith("grad_x")])
    xs = [_to_difffn(stored[f"grad_x{i}"], lab) for i, lab in zip(range(count), labels)]
    cot = jnp.asarray(stored["grad_cot"])

    def loss(x0):
        ys = net.predict(x0, *xs[1:])
        y = ys[0] if isinstance(ys, tuple) else ys
        y = jnp.transpose(df.stripdims(y), _labels.inverse(_labels.storage_perm(out_labels[0])))
        return jnp.sum(y * cot)

    grad = jax.grad(loss)(jnp.asarray(xs[0]))
    assert grad.dtype == jnp.float64
    expected = stored["grad_out"]
    got = _to_onnx(grad, labels[0])
    # The U-Net's exporters fold each batch norm into its convolution in float32, and difffn's
    # LSTM has one bias where ONNX has two (their float32 sum): the weights differ from torch's
    # float64 model by float32 rounding there (elsewhere the check is float64's).
    tolerance = 1e-5 if name in ("unet", "lstm", "bilstm", "lstm2", "seqlstm") else 1e-9
    scale = np.max(np.abs(expected))
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * 1e-2 * scale)


def _export_layouts(net, xs):
    """The input layouts at the sizes of ``xs`` (a network that computes sizes from shapes,
    or unrolls a recurrence, is traced at concrete sizes)."""
    return [df.Layout(x.shape, layout.format) for x, layout in zip(xs, net.input_layouts)]


@pytest.mark.parametrize(("name", "file"), FILES, ids=[f for _, f in FILES])
def test_exports_back_and_onnx_runtime_agrees_with_predict(name, file, imported, tmp_path):
    stored = _stored(name)
    result = imported(file)
    net = result.network
    assert all(isinstance(layer, df.InputLayer) for layer in net.input_layers)
    labels = list(result.input_labels.values())
    try:
        path = df.export_onnx(net, tmp_path / "back.onnx")
        batches = (2, 3)
    except df.ONNXExportError as error:
        assert "needs concrete sizes" in str(error)
        xs = [_to_difffn(stored[f"x{i}_b2"], lab) for i, lab in enumerate(labels)]
        path = df.export_onnx(net, *_export_layouts(net, xs), tmp_path / "back.onnx")
        batches = (2,)
    session = _session(path)
    names = [i.name for i in session.get_inputs()]
    assert names == list(net.input_names)
    for batch in batches:
        xs = [_to_difffn(stored[f"x{i}_b{batch}"], lab) for i, lab in enumerate(labels)]
        types = {"tensor(float)": np.float32, "tensor(int32)": np.int32,
                 "tensor(int64)": np.int64}  # fmt: skip
        feeds = {i.name: x.astype(types[i.type]) for i, x in zip(session.get_inputs(), xs)}
        got = session.run(None, feeds)
        ys = net.predict(*xs)
        ys = ys if isinstance(ys, tuple) else (ys,)
        for g, y in zip(got, ys):
            y = np.asarray(df.stripdims(y))
            scale = float(np.max(np.abs(y))) + 1e-6
            np.testing.assert_allclose(g, y, atol=2e-5 * scale, rtol=1e-4)


# PyTorch's LSTM/GRU nodes (batch first through Transpose, zero states of the batch's size)
# become difffn's recurrent layers; a bidirectional GRU (difffn has none) and states given as
# network inputs stay ONNX operators.
RECURRENT = {
    "lstm": ["LSTM"], "bilstm": ["BiLSTM"], "gru": ["GRU"], "lstm2": ["LSTM", "LSTM"],
    "seqlstm": ["LSTM"], "bigru": [], "bilstm_states": [], "bigru_states": [],
}  # fmt: skip
RECURRENT_FILES = [(n, f) for n, f in FILES if n in RECURRENT]


@pytest.mark.parametrize(("name", "file"), RECURRENT_FILES, ids=[f for _, f in RECURRENT_FILES])
def test_recurrent_nodes_import_as_difffn_layers_where_exact(name, file, imported):
    kinds = [type(layer).__name__ for layer in imported(file).network.layers]
    assert [k for k in kinds if k in ("LSTM", "BiLSTM", "GRU")] == RECURRENT[name]


SEQUENCES = [
    (n, f) for n, f in FILES if n in ("gpt2", "bert", "lstm", "gru", "bilstm", "bigru", "lstm2")
]


@pytest.mark.parametrize(("name", "file"), SEQUENCES, ids=[f for _, f in SEQUENCES])
def test_runs_at_another_sequence_length_like_onnx_runtime(name, file, imported):
    """The files' sequence axes are dynamic too: a shorter sequence (4 steps, not the 7-10 the
    references have) at batch 3, compared with ONNX Runtime."""
    stored = _stored(name)
    result = imported(file)
    session = _session(DATA / file)
    names = [i.name for i in session.get_inputs()]
    xs = [stored[f"x{i}_b3"][:, :4] for i in range(len(names))]
    expected = session.run(None, dict(zip(names, xs)))
    got = _predict(result, xs)
    for y, e in zip(got, expected):
        assert y.shape == e.shape
        scale = float(np.max(np.abs(e))) + 1e-6
        np.testing.assert_allclose(y, e, atol=2e-5 * scale, rtol=1e-4)
