"""Hostile files and faults: nothing read or written outside the user's folder, nothing raw,
nothing silent (issue 26). Crafted payloads are written with their checksum recomputed
(``container.write``), so the payload's own checks must catch them; symbolic links, hard links,
FIFOs and devices are planted where difffn opens files on the user's behalf."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import difffn as df
from difffn._persistence import container
from difffn._training import _checkpoint, _progress, _rowlog


def network():
    return df.Network(
        [
            df.layers.FeatureInput(4, normalization="none", name="in"),
            df.layers.FullyConnected(3, name="fc"),
            df.layers.Softmax(name="sm"),
        ]
    )


def data(n=16, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4)).astype(np.float32)
    T = np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)]
    return X, T


def options(folder=None, **more):
    return df.TrainingOptions(
        "adam",
        max_epochs=1,
        mini_batch_size=8,
        verbose=False,
        checkpoint_path=None if folder is None else str(folder),
        **more,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One checkpointed run of this release: its folder, newest checkpoint (an orbax folder with
    its manifest) and history log's name (JSON lines)."""
    folder = tmp_path_factory.mktemp("run")
    X, T = data()
    df.trainnet(X, T, network(), "crossentropy", options(folder), key=jax.random.key(1))
    checkpoint = _checkpoint.checkpoints(folder)[0]
    assert checkpoint.is_dir()
    log = next(folder.glob("net_history__*.jsonl"))
    return folder, checkpoint, log.name


# Single-file checkpoints of an earlier release (with their binary .difffnlog) still resume.
BEFORE = Path(__file__).parent / "data" / "before_move" / "checkpoints"
OLD = (
    BEFORE,
    next(BEFORE.glob("net_checkpoint__3__*.difffn")),
    next(BEFORE.glob("net_history__*.difffnlog")).name,
)


def old_run():
    """The network and data of the run that wrote ``OLD`` (tests/data/before_move/make.py)."""
    if str(BEFORE.parent) not in sys.path:
        sys.path.insert(0, str(BEFORE.parent))
    import make

    return make.network(), make.data()


def old_options():
    return df.TrainingOptions(
        "sgdm", max_epochs=2, mini_batch_size=8, shuffle="never", verbose=False
    )


def source(kind, run):
    return run if kind == "folder" else OLD


def _reseal(checkpoint: Path) -> None:
    """Write the checkpoint folder's manifest again, as the writer does: the size and SHA-256 of
    every file, sealed by the SHA-256 of that listing (so only the content's checks remain)."""
    listing = {}
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        name = path.relative_to(checkpoint).as_posix()
        if name != "difffn_manifest.json":
            data = path.read_bytes()
            listing[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    seal = hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()
    body = {"format": "difffn.checkpoint-manifest", "algorithm": "sha256", "files": listing}
    (checkpoint / "difffn_manifest.json").write_text(json.dumps({**body, "seal": seal}))


def _plain(value):
    return value.tolist() if isinstance(value, np.ndarray) else value


def craft(kind, run, tmp_path, change) -> Path:
    """A copy in ``tmp_path`` of a checkpoint and its log with ``change`` applied to what the
    checkpoint holds, its checksums recomputed: for a folder (``kind="folder"``) the orbax
    progress JSON (numpy arrays as JSON lists) with the manifest written again; for a file of
    an earlier release (``"file"``) the container's payload."""
    folder, checkpoint, log = source(kind, run)
    target = tmp_path / checkpoint.name
    if kind == "folder":
        shutil.copytree(checkpoint, target)
        progress_file = target / "progress" / "metadata"
        progress = json.loads(progress_file.read_text())
        change(progress)
        progress_file.write_text(json.dumps(progress, default=_plain))
        _reseal(target)
    else:
        payload = container.read(checkpoint, "checkpoint")
        change(payload)
        container.write(target, "checkpoint", payload)
    (tmp_path / log).write_bytes((folder / log).read_bytes())
    return target


KINDS = ["folder", "file"]


def test_a_crafted_folder_checkpoint_that_changes_nothing_still_resumes(run, tmp_path):
    path = craft("folder", run, tmp_path, lambda p: None)  # the helper writes what difffn reads
    _, info = df.trainnet(
        *data(), network(), "crossentropy", options(), resume_from=path, key=jax.random.key(1)
    )
    assert len(info.training_history) == 2


def test_a_file_checkpoint_of_an_earlier_release_crafted_to_change_nothing_resumes(tmp_path):
    path = craft("file", None, tmp_path, lambda p: None)
    net, (X, T) = old_run()
    _, info = df.trainnet(
        X, T, net, df.losses.crossentropy, old_options(), resume_from=path, key=jax.random.key(1)
    )
    assert len(info.training_history) == 6


# -- 1. nothing outside the folder ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["../../x.jsonl", "../../x.difffnlog", "/etc/passwd", "/dev/zero", "sub/x.jsonl", ".."],
)
@pytest.mark.parametrize("kind", KINDS)
def test_a_history_log_name_that_is_a_path_is_refused(run, tmp_path, kind, name):
    path = craft(kind, run, tmp_path, lambda p: p["history"].update(file=name))
    with pytest.raises(
        df.SerializationError, match=r"is malformed: the history log's name is .*bare file name"
    ):
        df.trainnet(*data(), network(), "crossentropy", options(), resume_from=path)


@pytest.mark.parametrize("plant", ["symlink", "fifo", "device"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_log_planted_as_a_link_fifo_or_device_is_not_read(run, tmp_path, kind, plant):
    path = craft(kind, run, tmp_path, lambda p: None)
    folder, _, name = source(kind, run)
    log = tmp_path / name
    log.unlink()
    if plant == "symlink":
        (tmp_path / "elsewhere").write_bytes((folder / name).read_bytes())
        log.symlink_to(tmp_path / "elsewhere")
    elif plant == "fifo":
        os.mkfifo(log)  # opening it for reading would block forever
    else:
        log.symlink_to("/dev/zero")  # read until memory runs out
    checkpoint = _checkpoint.find(path)
    assert checkpoint.history["training"] > 0  # rows the log would have given
    training, validation, problem = checkpoint.history_rows()
    assert training == [] and validation == []
    assert re.search(r"symbolic link|not a regular file \(it is a FIFO\)", problem)


@pytest.mark.parametrize("plant", ["symlink", "hardlink", "fifo"])
def test_training_never_writes_through_a_planted_log(run, tmp_path, plant):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    log = folder / run[2]  # the same run (data, options, key) logs to the same name
    if plant == "symlink":
        log.symlink_to(victim)
    elif plant == "hardlink":
        os.link(victim, log)
    else:
        os.mkfifo(log)
    reason = {
        "symlink": r"is a symbolic link; difffn does not follow links",
        "hardlink": r"has 2 hard links",
        "fifo": r"is not a regular file \(it is a FIFO\)",
    }[plant]
    X, T = data()
    with pytest.warns(df.CheckpointWarning, match=reason):
        net, info = df.trainnet(
            X, T, network(), "crossentropy", options(folder), key=jax.random.key(1)
        )
    assert victim.read_bytes() == b"precious"
    assert info.stop_reason == "Max epochs completed"


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_planted_as_a_link_in_a_folder_is_skipped_not_followed(run, tmp_path, kind):
    _, checkpoint, _ = source(kind, run)
    suffix = ".difffn" if kind == "file" else ""
    planted = tmp_path / f"net_checkpoint__99__2099_01_01__00_00_00{suffix}"
    planted.symlink_to(checkpoint)
    if kind == "folder":
        shutil.copytree(checkpoint, tmp_path / checkpoint.name)
    else:
        (tmp_path / checkpoint.name).write_bytes(checkpoint.read_bytes())
    with pytest.warns(df.CheckpointWarning, match=r"skipping the damaged.*symbolic link"):
        found = _checkpoint.find(tmp_path)
    assert Path(found.source).name == checkpoint.name


@pytest.mark.parametrize(
    "name, message",
    [
        ("../outside.txt", r"lists '\.\./outside\.txt', which is not a file inside the checkpoint"),
        ("/etc/passwd", r"lists '/etc/passwd', which is not a file inside the checkpoint folder"),
        ("arrays/../../outside.txt", r"lists 'arrays/\.\./\.\./outside\.txt', which is not"),
        ("planted", r"the file planted is not a regular file of the checkpoint folder"),
    ],
)
def test_a_manifest_never_names_a_file_outside_its_folder(run, tmp_path, name, message):
    path = craft("folder", run, tmp_path, lambda p: None)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"secret")
    (path / "planted").symlink_to(outside)
    manifest = json.loads((path / "difffn_manifest.json").read_text())
    manifest["files"][name] = {"size": 6, "sha256": hashlib.sha256(b"secret").hexdigest()}
    seal = hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()
    (path / "difffn_manifest.json").write_text(json.dumps({**manifest, "seal": seal}))
    with pytest.raises(df.SerializationError, match=rf"is damaged: .*{message}"):
        _checkpoint.find(path)


@pytest.mark.parametrize("plant", ["symlink", "fifo"])
def test_a_manifest_planted_as_a_link_or_fifo_is_not_read(run, tmp_path, plant):
    path = craft("folder", run, tmp_path, lambda p: None)
    manifest = path / "difffn_manifest.json"
    manifest.rename(tmp_path / "elsewhere.json")
    if plant == "symlink":
        manifest.symlink_to(tmp_path / "elsewhere.json")
    else:
        os.mkfifo(manifest)  # reading it would block forever
    with pytest.raises(
        df.SerializationError, match=r"symbolic link; difffn does not follow|it is a FIFO"
    ):
        _checkpoint.find(path)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda n: n["layers"][0].pop("name"), r"the network's structure\['layers'\]\[0\] lacks"),
        (lambda n: n.update(connections=[0, 0]), r"structure\['connections'\]\[0\] should be"),
        (lambda n: n.update(layers="x"), r"the network's structure\['layers'\] should be list"),
    ],
)
def test_a_crafted_network_structure_in_a_folder_checkpoint_is_named(
    run, tmp_path, change, message
):
    path = craft("folder", run, tmp_path, lambda p: change(p["network"]))
    with pytest.raises(df.SerializationError, match=message):
        df.trainnet(*data(), network(), "crossentropy", options(), resume_from=path)


@pytest.mark.parametrize("what", ["fifo", "/dev/zero", "folder"])
def test_load_of_a_fifo_device_or_folder_is_named_without_reading(tmp_path, what):
    path = tmp_path / "net.difffn"
    if what == "fifo":
        os.mkfifo(path)
    elif what == "folder":
        path.mkdir()
    else:
        path = Path(what)
    with pytest.raises(df.SerializationError, match=r"is not a regular file|is a folder"):
        df.load(path, like=network())


# -- 2. load_exported: a schema, and JAX's errors named --------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    path = tmp_path_factory.mktemp("exported") / "net.difffn"
    net = network().initialize(key=jax.random.key(0))
    return df.export(net, df.Layout((None, 4), "BC"), path), net


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p.pop("input_layouts"), r"the payload lacks 'input_layouts'"),
        (lambda p: p.update(input_names="in"), r"\['input_names'\] should be list, not str"),
        (lambda p: p["structure"]["layers"][0].pop("class"), r"\[0\] lacks 'class'"),
        (lambda p: p.update(input_dtypes=["os.system"]), r"'os.system', not a dtype name"),
        (lambda p: p.update(output_formats=["QQ"]), r"\['output_formats'\]\[0\] is 'QQ'"),
        (lambda p: p["input_layouts"][0].update(shape=[-5, 4]), r"sizes are >= 0"),
        (lambda p: p.update(input_names=["a", "b"]), r"lists 2 input names, 1 input layouts"),
        (
            lambda p: p["input_layouts"][0].update(shape=[-1, 4, 2], format="BCT"),
            r"input 1 of its module is float32\[.*4\]; its description says",
        ),
        (lambda p: p.update(vjp_order=-1), r"vjp_order is -1"),
        (lambda p: p.update(platforms=["gpu"]), r"platforms has \['gpu'\]"),
        (lambda p: p.update(exported=b"\x00" * 64), r"is not a serialized jax.export function"),
        (lambda p: p.update(exported="text"), r"\['exported'\] should be bytes, not str"),
    ],
)
def test_load_exported_checks_every_field(exported, tmp_path, change, message):
    payload = container.read(exported[0], "exported")
    change(payload)
    path = tmp_path / "crafted.difffn"
    container.write(path, "exported", payload)
    with pytest.raises(df.SerializationError, match=message):
        df.load_exported(path)


@pytest.mark.parametrize("kind", ["network", "exported", "checkpoint"])
def test_a_payload_that_is_a_list_is_named(tmp_path, kind):
    path = tmp_path / "list.difffn"
    container.write(path, kind, [1, 2, 3])  # type: ignore[arg-type]
    load = {
        "network": lambda: df.load(path, like=network()),
        "exported": lambda: df.load_exported(path),
        "checkpoint": lambda: _checkpoint.find(path),
    }[kind]
    with pytest.raises(df.SerializationError, match=r"is malformed: the payload is a list"):
        load()


def test_the_exported_file_still_agrees_with_the_network(exported):
    path, net = exported
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    model = df.load_exported(path)
    np.testing.assert_allclose(
        np.asarray(model(x).data), np.asarray(net.predict(x).data), rtol=1e-6
    )


# -- 3. ONNX import: bounded, every inconsistency named -----------------------------------------


def onnx_model(nodes, initializers, *, x_type=TensorProto.FLOAT):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", x_type, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ints(values, name):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def floats(values, name):
    return numpy_helper.from_array(np.array(values, np.float32), name)


def huge(op):
    add = helper.make_node("Add", ["x", "c"], ["y"], name="add")
    if op == "ConstantOfShape":
        return onnx_model(
            [helper.make_node(op, ["s"], ["c"], name="big")], [ints([2**20] * 3, "s")]
        ), add
    if op == "Expand":
        nodes = [helper.make_node(op, ["one", "s"], ["c"], name="big")]
        return onnx_model(nodes, [ints([2**20] * 3, "s"), floats([1.0], "one")]), add
    if op == "Tile":
        nodes = [helper.make_node(op, ["one", "s"], ["c"], name="big")]
        return onnx_model(nodes, [ints([2**31], "s"), floats([1.0], "one")]), add
    nodes = [helper.make_node(op, ["a", "b", "d"], ["c"], name="big")]
    return onnx_model(nodes, [floats(0.0, "a"), floats(1e15, "b"), floats(1.0, "d")]), add


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand", "Range", "Tile"])
def test_a_constant_folded_node_of_huge_size_is_refused_before_it_is_built(op):
    model, add = huge(op)
    model.graph.node.append(add)
    with pytest.raises(
        df.ONNXImportError,
        match=rf"node 'big' \({op}\): its output would have the shape .*"
        r"more than the 4294967296 bytes.*max_tensor_bytes",
    ):
        df.import_onnx(model)


def test_a_huge_size_computed_from_a_runtime_shape_is_refused():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Mul", ["s", "k"], ["s2"], name="times"),
        helper.make_node("ConstantOfShape", ["s2"], ["c"], name="fill"),
        helper.make_node("Add", ["x", "c"], ["y"], name="add"),
    ]
    model = onnx_model(nodes, [ints([2**20, 2**20], "k")])
    with pytest.raises(df.ONNXImportError, match=r"node 'fill' \(ConstantOfShape\): its output"):
        df.import_onnx(model)


def test_max_tensor_bytes_bounds_and_raises_the_limit():
    nodes = [
        helper.make_node("ConstantOfShape", ["s"], ["c"], name="fill"),
        helper.make_node("Add", ["x", "c"], ["y"], name="add"),
    ]
    # a (1, 8) fill (32 bytes, more than its 16-byte shape initializer) broadcast over any batch
    # size, as the import's stand-in batch needs
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [ints([1, 8], "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(df.ONNXImportError, match=r"node 'fill'.*\(float32, 32 bytes\), more than"):
        df.import_onnx(model, max_tensor_bytes=24)
    with pytest.raises(df.ONNXImportError, match=r"max_tensor_bytes is 0; expected a positive"):
        df.import_onnx(model, max_tensor_bytes=0)
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    net = df.import_onnx(model, max_tensor_bytes=32)
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(np.asarray(df.stripdims(net.predict(x))), want)


@pytest.mark.parametrize("bad", ["int64", "string"])
def test_mistyped_matmul_inputs_are_named(bad):
    if bad == "int64":
        w = ints(np.ones((3, 3)), "w")
        message = r"its inputs 'x' \(tensor\(float\)\) and 'w' \(tensor\(int64\)\) must have one"
    else:
        w = helper.make_tensor("w", TensorProto.STRING, [1], [b"a"])
        message = r"input 1 \('w'\) is tensor\(string\); the operator takes"
    model = onnx_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [w])
    with pytest.raises(df.ONNXImportError, match=rf"node 'mm' \(MatMul\): {message}"):
        df.import_onnx(model)


def test_initializer_dims_that_do_not_fit_the_data_are_named():
    w = numpy_helper.from_array(np.ones((3, 3), np.float32), "w")
    w.ClearField("raw_data")
    w.float_data.extend([1.0] * 4)  # 4 values for dims (3, 3)
    model = onnx_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [w])
    with pytest.raises(df.ONNXImportError, match=r"'w'|w\)"):
        df.import_onnx(model)


@pytest.fixture
def external(tmp_path):
    """An ONNX file keeping its weight in ``w.bin`` beside it; its path and the weight."""
    weight = np.arange(9, dtype=np.float32).reshape(3, 3)
    model = onnx_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [numpy_helper.from_array(weight, "w")],
    )
    path = tmp_path / "model.onnx"
    onnx.save_model(
        model, str(path), save_as_external_data=True, location="w.bin", size_threshold=0
    )
    return path, weight


def _set_external(path: Path, **fields) -> None:
    model = onnx.load(str(path), load_external_data=False)
    tensor = model.graph.initializer[0]
    for entry in tensor.external_data:
        if entry.key in fields:
            entry.value = str(fields.pop(entry.key))
    for key, value in fields.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    onnx.save(model, str(path))


def test_external_data_is_read_and_agrees_with_onnx_runtime(external):
    path, weight = external
    x = np.ones((2, 3), np.float32)
    net = df.import_onnx(path)
    (want,) = ort.InferenceSession(str(path)).run(None, {"x": x})
    np.testing.assert_allclose(np.asarray(df.stripdims(net.predict(x))), want, rtol=1e-6)


@pytest.mark.parametrize("plant", ["file", "folder", "fifo"])
def test_external_data_behind_a_link_or_in_a_fifo_is_refused(external, tmp_path, plant):
    path, _ = external
    data = tmp_path / "w.bin"
    if plant == "file":
        data.rename(tmp_path / "real.bin")
        data.symlink_to(tmp_path / "real.bin")
    elif plant == "folder":
        (tmp_path / "real").mkdir()
        data.rename(tmp_path / "real" / "w.bin")
        (tmp_path / "sub").symlink_to(tmp_path / "real")
        _set_external(path, location="sub/w.bin")
    else:
        data.unlink()
        os.mkfifo(data)
    with pytest.raises(df.ONNXImportError, match=r"tensor 'w'.*symbolic link.*not a regular"):
        df.import_onnx(path)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"length": 999999}, r"asks for 999999 bytes from offset \d+; the file has \d+ bytes"),
        ({"offset": 2**40}, r"from offset 1099511627776; the file has"),
        ({"offset": "x"}, r"offset 'x' and length .* not whole numbers"),
        ({"length": 16}, r"dims \[3, 3\] .*36 bytes; the external data .* holds 16"),
        ({"location": "../w.bin"}, r"outside the model's folder"),
    ],
)
def test_crafted_external_data_fields_are_named(external, fields, message):
    path, _ = external
    _set_external(path, **fields)
    with pytest.raises(df.ONNXImportError, match=message):
        df.import_onnx(path)


def test_an_onnx_path_that_is_a_fifo_is_named_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "model.onnx")
    with pytest.raises(df.ONNXImportError, match=r"not a regular file \(it is a FIFO\)"):
        df.import_onnx(tmp_path / "model.onnx")


# -- 4. crafted key fields and progress files -----------------------------------------------------


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("impl", "os.system", r"\['impl'\] is 'os.system', which is not a PRNG implementation"),
        ("data", np.zeros((3,), np.uint32), r"\['data'\] should be uint32 of shape \(2,\).*(3,)"),
        (
            "data",
            np.zeros((2,), np.float32),
            {
                "file": r"\['data'\] should be uint32 .*it is float32",
                "folder": r"\['data'\] holds \[0\.0, 0\.0\], not uint32 values",  # JSON
            },
        ),
        ("impl", 7, r"\['impl'\] should be str, not int"),
    ],
)
@pytest.mark.parametrize("key", ["key", "run_key"])
@pytest.mark.parametrize("kind", KINDS)
def test_crafted_checkpoint_keys_are_named(run, tmp_path, kind, key, field, value, message):
    path = craft(kind, run, tmp_path, lambda p: p[key].update({field: value}))
    message = message[kind] if isinstance(message, dict) else message
    with pytest.raises(df.SerializationError, match=rf"\[{key!r}\]{message}"):
        df.trainnet(*data(), network(), "crossentropy", options(), resume_from=path)


@pytest.mark.parametrize("order", ["zeros", "outside", "shorter", "longer"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_crafted_epoch_order_is_named(run, tmp_path, kind, order):
    if kind == "folder":
        net, (X, T), opts, loss = network(), data(), options(), "crossentropy"
    else:
        net, (X, T) = old_run()
        opts, loss = old_options(), df.losses.crossentropy
    crafted = {  # permutations of another length than the observations' gathered silently
        "zeros": np.zeros(len(X), np.int32),
        "outside": np.arange(8, dtype=np.int32) + 50,
        "shorter": np.arange(8, dtype=np.int32),
        "longer": np.arange(len(X) + 8, dtype=np.int32)[::-1],
    }[order]
    path = craft(kind, run, tmp_path, lambda p: p.update(order=crafted))
    with pytest.raises(df.SerializationError, match=r"its epoch order is not a permutation"):
        df.trainnet(X, T, net, loss, opts, resume_from=path, key=jax.random.key(1))


def test_a_raw_uint32_key_still_resumes(tmp_path):
    X, T = data()
    key = jax.random.PRNGKey(3)
    df.trainnet(X, T, network(), "crossentropy", options(tmp_path), key=key)
    assert _checkpoint.find(tmp_path).payload["run_key"]["impl"] is None


def _progress_file(folder: Path, progress: dict) -> None:
    import orbax.checkpoint as ocp

    from difffn._training import _checkpoint_sharded

    manager = _checkpoint_sharded._manager(folder)
    manager.save(
        1,
        args=ocp.args.Composite(
            arrays=ocp.args.StandardSave({"a": np.zeros(2, np.float32)}),
            progress=ocp.args.JsonSave(progress),
        ),
        force=True,
    )
    manager.wait_until_finished()
    manager.close()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p.pop("iteration"), r"the progress lacks 'iteration'"),
        (lambda p: p.update(epoch="1"), r"\['epoch'\] should be int, not str"),
        (lambda p: p["key"].update(impl="os.system"), r"'os.system', which is not a PRNG"),
        (lambda p: p["key"].update(data=[1, 2, 3]), r"uint32 of shape \(2,\).*shape \(3,\)"),
        (lambda p: p["key"].update(data=[-1, 2**40]), r"holds \[-1, 1099511627776\], not uint32"),
        (lambda p: p.update(layout={"learnables": "x"}), r"\['layout'\]\['learnables'\] should"),
        (
            lambda p: p.update(layout={"learnables": [["[0]", 4, "float32"]]}),
            r"\['layout'\]\['learnables'\]\[0\] is \['\[0\]', 4, 'float32'\], not \[path, shape",
        ),
        (lambda p: p.update(format_version="2"), r"\['format_version'\] should be int"),
    ],
)
@pytest.mark.parametrize("kind", ["folder", "step"])
def test_crafted_multi_process_progress_files_are_named(run, tmp_path, kind, change, message):
    """The progress item of a checkpoint folder of this release (crafted, manifest recomputed),
    and of a ``<step>`` folder that multi-process runs of earlier releases wrote."""
    from difffn._training import _checkpoint_sharded

    if kind == "folder":
        with pytest.raises(df.SerializationError, match=message):
            _checkpoint.find(craft("folder", run, tmp_path, change))
        return

    state_key = {"data": [0, 1], "impl": "threefry2x32"}
    progress = {
        "format": _checkpoint_sharded.FORMAT,
        "format_version": 2,
        "iteration": 1,
        "epoch": 1,
        "batch": 0,
        "order": None,
        "key": dict(state_key),
        "run_key": dict(state_key),
        "shuffle_seed": [1],
        "best": None,
        "bad_validations": 0,
        "elapsed": 0.5,
        "stop_reason": None,
        "data_batch_size": None,
        "data_position": None,
        "fingerprint": {},
        "training_rows": [],
        "validation_rows": [],
        "layout": {},
    }
    _progress_file(tmp_path / "ok", progress)
    assert _checkpoint.find(tmp_path / "ok").iteration == 1  # the uncrafted file reads
    change(progress)
    _progress_file(tmp_path / "bad", progress)
    with pytest.raises(df.SerializationError, match=message):
        _checkpoint.find(tmp_path / "bad")


# -- 5. ordinary mistakes -------------------------------------------------------------------------


def test_jax_numpy_functions_name_df_ops_and_stripdims_and_operators_keep_the_format():
    x = df.dlarray(jnp.ones((2, 3)), "BC")
    for fn in (jnp.exp, jnp.sum, jax.nn.relu):
        with pytest.raises(df.FormatError, match=r"'BC' was passed to a jax.numpy.*df\.ops.*"):
            fn(x)
        with pytest.raises(TypeError):  # also what JAX itself raises for a non-array
            fn(x)
    w = jnp.full((2, 3), 2.0)
    assert (w * x).format == "BC" and (w + x).format == "BC"
    np.testing.assert_array_equal(np.asarray((w * x).data), np.full((2, 3), 2.0))
    np.testing.assert_allclose(np.asarray(jnp.exp(df.stripdims(x))), np.e, rtol=1e-6)


def test_a_jax_numpy_call_in_a_layer_names_the_layer():
    class Exp(df.Layer):
        formattable = True

        def predict(self, x):
            return jnp.exp(x)

    with pytest.raises(
        df.FormatError,
        match=r"Exp.predict \(layer 'exp'\) \(at .*\): a df.FormattedArray 'BC' "
        r"was passed to a jax.numpy or jax.nn function.*df\.stripdims",
    ):
        df.Network([df.layers.FeatureInput(3, normalization="none"), Exp(name="exp")])


def test_a_typo_in_a_learnables_path_is_named_with_a_suggestion():
    net = network().initialize(key=jax.random.key(0))
    with pytest.raises(df.NetworkError, match=r"'fc/weigths' is not in this table\. Did you mean "
                       r"'fc/weights'\?"):  # fmt: skip
        net.learnables["fc/weigths"]
    with pytest.raises(KeyError):  # a Mapping's lookups still raise KeyError
        net.learnables["fc/weigths"]
    with pytest.raises(df.NetworkError, match=r"'weights' is not a parameter path"):
        net.learnables["weights"]
    assert net.learnables.get("nope/x") is None and "weights" not in net.learnables


def endless(X, T, batch=8):
    while True:
        for start in range(0, len(X), batch):
            yield X[start : start + batch], T[start : start + batch]


def test_endless_training_and_validation_iterables_stop_with_steps_options():
    X, T = data()
    opts = df.TrainingOptions(
        "adam",
        max_epochs=2,
        steps_per_epoch=3,
        validation_data=endless(X, T),
        validation_steps=2,
        validation_frequency=3,
        verbose=False,
    )
    _, info = df.trainnet(endless(X, T), network(), "crossentropy", opts)
    assert info.training_history["iteration"][-1] == 6
    assert len(info.validation_history) >= 2


def test_an_epoch_of_unknown_length_is_said_to_be_running(capsys):
    X, T = data()
    batches = [(X[i : i + 8], T[i : i + 8]) for i in range(0, 16, 8)]

    class Batches:  # re-iterable, without len()
        def __iter__(self):
            return iter(batches)

    opts = df.TrainingOptions("adam", max_epochs=2, verbose=True, verbose_frequency=1)
    df.trainnet(Batches(), network(), "crossentropy", opts)
    assert "Epoch 1 is running; its length is unknown" in capsys.readouterr().out


_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _frames(text: str) -> list[str]:
    """What a terminal shows, frame by frame: rich's escape codes removed, split at each
    carriage return or line."""
    return [f.strip() for f in re.split(r"[\r\n]", _ESCAPES.sub("", text)) if f.strip()]


def _reporter(stream, monkeypatch):
    clock = iter(range(10**6))  # a second per reading: every tick redraws (rich's bar is
    monkeypatch.setattr(_progress.time, "perf_counter", lambda: float(next(clock)))  # throttled)
    return _progress.Reporter(
        verbose=True, metric_titles=[], validation=False, total_iterations=None, stream=stream,
        max_epochs=3,
    )  # fmt: skip


def test_the_progress_bar_says_unknown_length_until_the_first_epoch_ends(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    reporter = _reporter(stream, monkeypatch)
    assert reporter.mode == "terminal"
    for iteration in (1, 2, 3):  # an epoch of 3 iterations, its length unknown while it runs
        reporter.tick(iteration, 1)
    frames = _frames(stream.getvalue())
    assert re.search(r"\b3/\? +\(an epoch of unknown length is running\) epoch 1/3,", frames[-1])
    reporter.tick(4, 2)  # the first epoch ended: 3 epochs of 3 iterations
    frame = _frames(stream.getvalue())[-1]
    assert re.search(r"\b4/9 +epoch 2/3, [\d.]+ it/s, \d\d:\d\d:\d\d left", frame)
    assert "unknown" not in frame
    reporter.finish("Max epochs completed")
    assert _frames(stream.getvalue())[-1] == "Training stopped: Max epochs completed"


def test_plain_progress_lines_say_unknown_length_until_the_first_epoch_ends(monkeypatch):
    stream = io.StringIO()  # not a terminal: plain lines, no control characters
    reporter = _reporter(stream, monkeypatch)
    assert reporter.mode == "plain"
    for iteration in range(1, 61):  # an epoch of 60 iterations, its length unknown while it runs
        reporter.tick(iteration, 1)
    for iteration in range(61, 181):
        reporter.tick(iteration, 2 + (iteration - 61) // 60)
    reporter.finish("Max epochs completed")
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines[-1] == "Training stopped: Max epochs completed"
    progress = lines[:-1]
    assert progress and all(line.startswith("Progress: iteration ") for line in progress)
    assert re.fullmatch(
        r"Progress: iteration 50, \(an epoch of unknown length is running\) epoch 1/3, .*",
        progress[0],
    )
    after = progress[1:]  # once the first epoch ended, the total of 3 epochs of 60
    assert after and all(re.match(r"Progress: iteration \d+/180, epoch [23]/3, ", a) for a in after)
    assert after[-1].startswith("Progress: iteration 180/180, epoch 3/3, ")
    assert not any("unknown" in a for a in after)


# -- 6. nothing silent ----------------------------------------------------------------------------


def test_nan_in_validation_data_warns_once():
    X, T = data()
    Xv, Tv = data(8, seed=1)
    Xv[3, 1] = np.nan
    Xv[5, 0] = np.inf
    opts = options(validation_data=(Xv, Tv), validation_frequency=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, info = df.trainnet(X, T, network(), "crossentropy", opts)
    said = [w for w in caught if issubclass(w.category, df.DataWarning)]
    assert len(said) == 1
    assert re.search(r"validation data holds 2 NaN or Inf value\(s\)", str(said[0].message))
    assert len(info.validation_history) >= 2  # validated more than once, said once


def test_finite_validation_data_says_nothing():
    X, T = data()
    opts = options(validation_data=data(8, seed=1), validation_frequency=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", df.DataWarning)
        df.trainnet(X, T, network(), "crossentropy", opts)


def test_a_temporary_file_removed_by_another_writer_names_the_cause(tmp_path, monkeypatch):
    replace = os.replace

    def another_run_cleaned_up(src, dst):
        os.unlink(src)  # what a second run's pruning did to the first run's file in flight
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", another_run_cleaned_up)
    net = network().initialize(key=jax.random.key(0))
    with pytest.raises(df.SerializationError, match=r"removed while it was being written, by "
                       r"another process: two runs .* one folder.*Fix: give each run its own"):  # fmt: skip
        df.save(tmp_path / "net.difffn", net)


def test_pruning_leaves_a_fresh_temporary_file_of_another_run(tmp_path):
    fresh = tmp_path / ".net_checkpoint__5__2026_01_01__00_00_00.difffn.abc.tmp"
    stale = tmp_path / ".net_checkpoint__4__2026_01_01__00_00_00.difffn.def.tmp"
    fresh.write_bytes(b"x")
    stale.write_bytes(b"x")
    old = os.stat(stale).st_mtime - 2 * _checkpoint.STALE
    os.utime(stale, (old, old))
    _checkpoint.prune(tmp_path, 1)
    assert fresh.exists() and not stale.exists()


def test_the_log_name_form_is_what_the_writer_makes():
    name = _rowlog.file_name("0123456789abcdef")
    assert _rowlog.NAME.fullmatch(name)


def test_a_node_name_that_is_not_utf8_is_named(tmp_path):
    """protobuf gives a string field that is not valid UTF-8 back as bytes (found by fuzzing)."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="NODEX")]
    data = onnx_model(nodes, []).SerializeToString().replace(b"NODEX", b"NOD\xffX")
    path = tmp_path / "bad_name.onnx"
    path.write_bytes(data)
    with pytest.raises(
        df.ONNXImportError, match=r"node 0 of the graph has a name that is not valid"
    ):
        df.import_onnx(path)
