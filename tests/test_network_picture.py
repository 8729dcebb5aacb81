"""``net.summary()`` (connections, counts and bytes, layouts of imported networks) and
``net.plot()`` (the layer graph: its boxes, arrows and layout labels, in the figure and the SVG).

Counts and bytes are checked against numpy's sizes of the parameter tables, layouts against the
shapes of values the network really computes, the picture's edges against ``net.connections``.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

import difffn as df

L = df.layers


def residual(key):
    net = df.Network(
        [
            L.FeatureInput(3, normalization="none", name="in"),
            L.FullyConnected(4, name="a"),
            L.ReLU(name="r"),
            L.FullyConnected(4, name="b"),
            L.Addition(2, name="add"),
            L.BatchNorm(name="bn"),
        ],
        connections=[("r", "add/in2")],
    )
    return net.initialize(key=key)


def columns(text):
    lines = text.splitlines()
    header = lines[0].split()
    starts = [lines[0].index(h) for h in header]
    rows = []
    for line in lines[2:]:
        if not re.match(r"\d+  ", line):  # the totals after the rows: "6 layers, ..."
            break
        cells = [line[s:e].strip() for s, e in zip(starts, [*starts[1:], None])]
        rows.append(dict(zip(header, cells)))
    return header, rows


def test_summary_of_a_graph_names_sources_and_counts_values_and_bytes(key):
    net = residual(key)
    text = net.summary()
    header, rows = columns(text)
    assert header == [
        "#", "name", "type", "inputs", "outputs", "from", "learnables", "state", "description"
    ]  # fmt: skip
    by_name = {r["name"]: r for r in rows}
    assert by_name["add"]["from"] == "b, r" and by_name["in"]["from"] == "<in>"
    assert by_name["add"]["inputs"] == "?,4:BC, ?,4:BC"
    sizes = {}  # per layer, numpy's count of the parameter tables
    for path, value in net.learnables.items():
        sizes.setdefault(path.split("/")[0], 0)
        sizes[path.split("/")[0]] += np.asarray(value).size
    states = {}
    for path, value in net.state.items():
        states.setdefault(path.split("/")[0], 0)
        states[path.split("/")[0]] += np.asarray(value).size
    for name, row in by_name.items():
        assert int(row["learnables"].replace(",", "")) == sizes.get(name, 0), name
        assert int(row["state"]) == states.get(name, 0), name
    learn_bytes = sum(np.asarray(v).nbytes for v in net.learnables.values())
    state_bytes = sum(np.asarray(v).nbytes for v in net.state.values())
    learn, state = sum(sizes.values()), sum(states.values())
    assert text.splitlines()[-1] == (
        f"{learn} learnable parameters ({learn_bytes} bytes), {state} state values "
        f"({state_bytes} bytes), {learn + state} in total ({learn_bytes + state_bytes} bytes)"
    )
    assert (learn, state) == (3 * 4 + 4 + 4 * 4 + 4 + 8, 8)


def test_the_summary_layouts_are_the_shapes_the_network_computes(key):
    net = residual(key)
    _, rows = columns(net.summary())
    x = np.ones((5, 3), np.float32)
    for row in rows:
        y = net.predict(x, outputs=row["name"])
        sizes, fmt = row["outputs"].split(":")
        assert fmt == y.format
        assert [int(s) if s != "?" else 5 for s in sizes.split(",")] == list(y.shape)


def test_a_chain_has_no_from_column_and_float64_counts_eight_bytes(key, x64):
    net = df.Network([L.FeatureInput(2, name="in"), L.FullyConnected(3, name="fc")])
    net = net.initialize(key=key)
    net = net.replace(learnables={k: np.asarray(v, np.float64) for k, v in net.learnables.items()})
    header, _ = columns(net.summary())
    assert "from" not in header
    assert net.summary().splitlines()[-1].startswith("9 learnable parameters (72 bytes)")


def test_an_imported_network_shows_its_layouts_before_it_runs():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc"),
            helper.make_node("Softmax", ["h"], ["y"], name="sm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        [
            numpy_helper.from_array(rng.standard_normal((3, 5)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    net = df.import_onnx(model)
    assert net.recorded_layouts is None  # nothing ran: the summary propagates the layouts
    _, rows = columns(net.summary())
    assert [(r["inputs"], r["outputs"]) for r in rows] == [
        ("?,3:BC", "?,3:BC"), ("?,3:BC", "?,5:BC"), ("?,5:BC", "?,5:BC")
    ]  # fmt: skip
    assert net.predict(np.ones((2, 3), np.float32)).shape == (2, 5)


# -- the picture ---------------------------------------------------------------------------------


def test_the_plot_draws_every_layer_and_connection_with_its_layout(key, tmp_path):
    net = residual(key)
    figure = net.plot(tmp_path / "net.svg", title="residual")
    ax = figure.axes[0]
    boxes = {
        t.get_gid(): t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("layer:")
    }
    assert boxes == {f"layer:{lyr.name}": f"{lyr.name}\n{lyr.type}" for lyr in net.layers}
    arrows = sorted(p.get_gid() for p in ax.patches if (p.get_gid() or "").startswith("edge:"))
    assert arrows == sorted(f"edge:{a}->{b}" for a, b in net.connections)
    labels = {
        t.get_gid(): t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("layout:")
    }
    x = np.ones((5, 3), np.float32)
    for source, target in net.connections:
        computed = net.predict(x, outputs=source.split("/")[0])
        label = labels[f"layout:{source}->{target}"]
        assert label == "?," + ",".join(map(str, computed.shape[1:])) + ":" + computed.format
    # the boxes are in rows by depth: the skip connection's target is below both its sources
    y = {t.get_gid()[6:]: t.get_position()[1] for t in ax.texts if t.get_gid().startswith("layer:")}
    assert y["in"] < y["a"] < y["r"] < y["b"] < y["add"] < y["bn"]
    svg = (tmp_path / "net.svg").read_text()
    ids = set(re.findall(r'id="((?:layer|edge|layout):[^"]+)"', svg))
    assert {i.replace("&gt;", ">") for i in ids} == set(boxes) | set(arrows) | set(labels)


def test_the_png_has_the_figure_size(key, tmp_path):
    from matplotlib.image import imread

    figure = residual(key).plot(tmp_path / "net.png")
    pixels = imread(tmp_path / "net.png")
    width, height = figure.get_size_inches() * 100
    assert pixels.shape[:2] == (round(height), round(width))
    assert pixels[..., :3].min() < 0.5  # something is drawn (dark arrows and text)


def test_plot_errors_name_the_fix(key, tmp_path, monkeypatch):
    net = residual(key)
    with pytest.raises(
        df.NetworkError,
        match=r"got '\.jpeg', expected one of \['\.png', '\.svg', '\.pdf'\]\. Fix: path='network\.png'",
    ):
        net.plot(tmp_path / "net.jpeg")
    with pytest.raises(
        df.NetworkError, match=r"the folder .*missing' does not exist\. Fix: create it first"
    ):
        net.plot(tmp_path / "missing" / "net.png")
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(
        df.MissingDependencyError,
        match=r"Network\.plot draws with matplotlib, which is not installed\. Fix: pip install 'difffn\[plot\]'",
    ):
        net.plot()
