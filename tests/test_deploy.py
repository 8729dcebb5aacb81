"""df.export / df.load_exported: the compiled predict as a file, run without the layer classes."""

from __future__ import annotations

import importlib
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import run_python

import difffn as df

CUSTOM_LAYERS = textwrap.dedent(
    '''
    """A custom layer for the export tests; the loading process never imports this module."""

    import jax
    import jax.numpy as jnp

    import difffn as df


    class SReLU(df.Layer):
        """SReLU with per-channel thresholds and slopes and a hand-written backward."""

        left_threshold: jax.Array | None = df.learnable()
        left_slope: jax.Array | None = df.learnable()
        right_threshold: jax.Array | None = df.learnable()
        right_slope: jax.Array | None = df.learnable()

        def initialize(self, layout, *, key):
            c = layout.size("C")
            k = jax.random.split(key, 4)
            return self.replace(
                left_threshold=jax.random.uniform(k[0], (1, c), minval=-0.6, maxval=-0.1),
                left_slope=jax.random.uniform(k[1], (1, c), minval=0.0, maxval=0.5),
                right_threshold=jax.random.uniform(k[2], (1, c), minval=0.1, maxval=0.6),
                right_slope=jax.random.uniform(k[3], (1, c), minval=0.0, maxval=0.5),
            )

        def predict(self, x):
            tl, al = self.left_threshold, self.left_slope
            tr, ar = self.right_threshold, self.right_slope
            return jnp.where(x <= tl, tl + al * (x - tl), jnp.where(x >= tr, tr + ar * (x - tr), x))

        def backward(self, x, y, dy, memory):
            tl, al = self.left_threshold, self.left_slope
            tr, ar = self.right_threshold, self.right_slope
            left, right = x <= tl, x >= tr
            dx = dy * jnp.where(left, al, jnp.where(right, ar, 1.0))
            def total(v):
                return jnp.sum(v, axis=0, keepdims=True)
            return (
                dx,
                total(jnp.where(left, dy * (1 - al), 0.0)),
                total(jnp.where(left, dy * (x - tl), 0.0)),
                total(jnp.where(right, dy * (1 - ar), 0.0)),
                total(jnp.where(right, dy * (x - tr), 0.0)),
            )


    def network():
        return df.Network(
            [
                df.layers.FeatureInput(6, name="in"),
                df.layers.FullyConnected(5, name="fc1"),
                SReLU(name="srelu"),
                df.layers.FullyConnected(3, name="fc2"),
                df.layers.Softmax(name="softmax"),
            ]
        )
    '''
)

LOADER = textwrap.dedent(
    """
    import importlib.util, sys
    import jax, jax.numpy as jnp, numpy as np
    import difffn as df

    folder = sys.argv[1]
    model = df.load_exported(folder + "/model.difffn")
    assert "custom_layers_for_export" not in sys.modules
    assert importlib.util.find_spec("custom_layers_for_export") is None
    x = np.load(folder + "/x.npy", allow_pickle=False)
    y = model(x)
    assert df.dims(y) == "BC", df.dims(y)
    np.testing.assert_allclose(y.data, np.load(folder + "/y.npy", allow_pickle=False), rtol=1e-6)
    weights = jnp.arange(3.0).reshape(1, 3)
    grad = jax.grad(lambda x: jnp.sum(model(x).data * weights))(x)
    np.testing.assert_allclose(grad, np.load(folder + "/grad.npy", allow_pickle=False),
                               rtol=1e-5, atol=1e-7)
    one = jax.jit(model)(x[:1])
    np.testing.assert_allclose(one.data, np.load(folder + "/y.npy", allow_pickle=False)[:1],
                               rtol=1e-6)
    print("ok", [name for name, cls in model.layers if cls.endswith("SReLU")])
    """
)


@pytest.fixture
def custom_module(tmp_path):
    (tmp_path / "custom_layers_for_export.py").write_text(CUSTOM_LAYERS)
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("custom_layers_for_export")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("custom_layers_for_export", None)


def test_a_custom_layer_network_runs_where_its_module_cannot_be_imported(
    custom_module, tmp_path, key
):
    net = custom_module.network().initialize(key=key)
    df.export(net, tmp_path / "model.difffn")
    x = np.asarray(jax.random.normal(jax.random.key(1), (7, 6)), np.float32)
    weights = jnp.arange(3.0).reshape(1, 3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.asarray(net.predict(x).data))
    grad = jax.jit(jax.grad(lambda x: jnp.sum(net.predict(x).data * weights)))(x)
    np.save(tmp_path / "grad.npy", np.asarray(grad))
    # the subprocess runs from the repository root, without tmp_path on its path
    result = run_python(LOADER, str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok ['srelu']"


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """A small image network and its export (built once: initialization compiles ops)."""
    net = image_net(jax.random.key(0))
    path = df.export(
        net, df.Layout((None, 8, 8, 1), "BSSC"), tmp_path_factory.mktemp("cnn") / "cnn.difffn"
    )
    return net, path


def image_net(key):
    return df.Network(
        [
            df.layers.ImageInput((8, 8, 1), normalization="none", name="in"),
            df.layers.Conv2D(3, 4, padding="same", name="conv"),
            df.layers.BatchNorm(name="bn"),
            df.layers.ReLU(name="relu"),
            df.layers.MaxPool2D(2, stride=2, name="pool"),
            df.layers.Flatten(name="flat"),
            df.layers.FullyConnected(10, name="fc"),
            df.layers.Softmax(name="softmax"),
        ]
    ).initialize(key=key)


def test_symbolic_batch_jit_and_gradients_match_predict(cnn):
    net, path = cnn
    model = df.load_exported(path)
    assert model.input_names == ("in",) and model.output_names == ("softmax",)
    assert model.input_layouts == (df.Layout((None, 8, 8, 1), "BSSC"),)
    assert model.output_formats == ("BC",) and len(model.platforms) == 1
    assert "ExportedNetwork(inputs=[in: " in repr(model)

    def loss(f, x):
        return jnp.sum(df.stripdims(f(x)) * jnp.arange(10.0).reshape(1, 10))

    grad = jax.jit(jax.grad(loss, argnums=1), static_argnums=0)
    for batch in (1, 5):
        x = jax.random.uniform(jax.random.key(batch), (batch, 8, 8, 1))
        expected = net.predict(x).data
        np.testing.assert_allclose(model(x).data, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            jax.jit(model)(df.dlarray(x, "BSSC")).data, expected, rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(grad(model, x), grad(net.predict, x), rtol=1e-4, atol=1e-6)


def test_fixed_sizes_several_inputs_and_outputs(tmp_path, key):
    net = df.Network(
        [
            df.layers.FeatureInput(3, name="a"),
            df.layers.FeatureInput(2, name="b"),
            df.layers.Concatenation(2, name="cat"),
            df.layers.FullyConnected(4, name="fc"),
            df.layers.ReLU(name="relu"),
        ],
        connections=[("a", "cat/in1"), ("b", "cat/in2"), ("cat", "fc"), ("fc", "relu")],
        outputs=["fc", "relu"],
    ).initialize(key=key)
    with pytest.raises(
        df.SerializationError, match=r"could not be exported .*\(4, 3\), \(batch, 2\)"
    ):
        df.export(net, df.Layout((4, 3), "BC"), df.Layout((None, 2), "BC"), tmp_path / "x.difffn")
    path = df.export(
        net, df.Layout((4, 3), "BC"), df.Layout((4, 2), "BC"), path=tmp_path / "two.difffn"
    )
    model = df.load_exported(path)
    assert model.input_layouts == (df.Layout((4, 3), "BC"), df.Layout((4, 2), "BC"))
    a, b = jnp.ones((4, 3)), jnp.arange(8.0).reshape(4, 2)
    got, expected = model(a, b), net.predict(a, b)
    assert len(got) == 2
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g.data, e.data, rtol=1e-6)
    with pytest.raises(
        df.NetworkError, match=r"input 'a' expects Layout\(\(4, 3\), 'BC'\).*\(5, 3\)"
    ):
        model(jnp.ones((5, 3)), jnp.ones((5, 2)))


def test_call_errors(cnn):
    net, path = cnn
    model = df.load_exported(path)
    with pytest.raises(df.NetworkError, match=r"takes 1 input\(s\) \['in'\]; got 2"):
        model(jnp.ones((1, 8, 8, 1)), jnp.ones((1, 8, 8, 1)))
    with pytest.raises(df.NetworkError, match=r"expects format 'BSSC'; got 'SSCB'"):
        model(df.dlarray(jnp.ones((8, 8, 1, 2)), "SSCB"))
    with pytest.raises(df.NetworkError, match=r"expects Layout\(\(None, 8, 8, 1\), 'BSSC'\)"):
        model(jnp.ones((2, 8, 8)))
    with pytest.raises(df.NetworkError, match=r"input 'in' is complex \(complex64\).*Fix"):
        model(jnp.ones((2, 8, 8, 1), jnp.complex64))
    np.testing.assert_allclose(  # integers cast like numbers do
        model(jnp.ones((2, 8, 8, 1), jnp.int32)).data,
        net.predict(jnp.ones((2, 8, 8, 1))).data,
        rtol=1e-6,
    )


def test_a_model_exported_for_another_platform_says_so(tmp_path, key):
    net = df.Network(
        [df.layers.FeatureInput(3, normalization="none", name="in"), df.layers.ReLU(name="r")]
    ).initialize(key=key)
    path = df.export(
        net, df.Layout((None, 3), "BC"), path=tmp_path / "tpu.difffn", platforms=("tpu",)
    )
    model = df.load_exported(path)
    here = jax.export.default_export_platform()
    with pytest.raises(
        df.SerializationError,
        match=rf"was exported for platforms \['tpu'\]; this machine runs '{here}'\. Fix: export "
        rf"with platforms=\('{here}', \.\.\.\)",
    ):
        model(jnp.ones((2, 3)))


class Eager(df.Layer):
    acceleratable = False

    def predict(self, x):
        return x if float(jnp.sum(x)) > 0 else -x


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda net, p: df.export(net), r"the last argument must be the file path.*got nothing"),
        (
            lambda net, p: df.export(net, df.Layout((None, 3), "BC")),
            r"the last argument must be the file path.*got Layout",
        ),
        (lambda net, p: df.export([], p), r"expected a df.Network; got list"),
        (
            lambda net, p: df.export(
                df.Network([df.layers.FeatureInput(3), df.layers.FullyConnected(2)]), p
            ),
            r"not initialized",
        ),
        (
            lambda net, p: df.export(
                df.Network([df.layers.FeatureInput(3, name="in"), Eager(name="e")]).initialize(
                    key=jax.random.key(0)
                ),
                p,
            ),
            r"layer\(s\) \['e'\] set acceleratable = False",
        ),
        (
            lambda net, p: df.export(net, p, platforms=("gpu",)),
            r"platforms has 'gpu', which is not a platform JAX exports for; they are \['cpu', "
            r"'cuda', 'rocm', 'tpu'\]\. JAX names GPUs 'cuda' \(NVIDIA\) or 'rocm' \(AMD\)",
        ),
    ],
)
def test_export_errors(tmp_path, key, call, message):
    net = df.Network([df.layers.FeatureInput(3, name="in")]).initialize(key=key)
    with pytest.raises(df.SerializationError, match=message):
        call(net, tmp_path / "x.difffn")


def test_wrong_layout_for_an_input_layer(cnn, tmp_path):
    net, _ = cnn
    with pytest.raises(df.NetworkError, match=r"input layer expects"):
        df.export(net, df.Layout((None, 8, 8, 3), "BSSC"), tmp_path / "x.difffn")


def test_damaged_and_foreign_files(cnn, tmp_path):
    net, _ = cnn
    path = df.export(net, tmp_path / "cnn.difffn")
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) - 10])
    with pytest.raises(df.SerializationError, match=r"is truncated"):
        df.load_exported(path)
    saved = df.save(tmp_path / "net.difffn", net)
    with pytest.raises(df.SerializationError, match=r"holds a difffn 'network', not a 'exported'"):
        df.load_exported(saved)
    exported = df.export(net, tmp_path / "cnn2.difffn")
    with pytest.raises(df.SerializationError, match=r"holds a difffn 'exported', not a 'network'"):
        df.load(exported, like=net)


def test_the_file_holds_no_pickle(cnn):
    blob = cnn[1].read_bytes()
    assert b"\x80\x04\x95" not in blob and b"\x80\x05\x95" not in blob


def test_vjp_order_two_gives_second_derivatives(tmp_path, key):
    net = df.Network(
        [
            df.layers.FeatureInput(3, name="in"),
            df.layers.FullyConnected(4, name="fc"),
            df.layers.ELU(name="elu"),
            df.layers.FullyConnected(1, name="out"),
        ]
    ).initialize(key=key)
    model = df.load_exported(df.export(net, tmp_path / "second.difffn", vjp_order=2))
    assert model.vjp_order == 2
    x = jax.random.normal(jax.random.key(3), (2, 3))

    def second_order(predict):
        def loss(x):
            return jnp.sum(df.stripdims(predict(x)) ** 2)

        return jax.grad(lambda x: jnp.sum(jnp.tanh(jax.grad(loss)(x))))(x)

    np.testing.assert_allclose(second_order(model), second_order(net.predict), rtol=1e-4, atol=1e-6)
    first = df.load_exported(df.export(net, tmp_path / "first.difffn"))
    assert first.vjp_order == 1
    with pytest.raises(ValueError, match="No VJP is available"):
        second_order(first)  # jax.export's own message: the file has no second-order VJP
    with pytest.raises(df.SerializationError, match=r"vjp_order is -1; expected a non-negative"):
        df.export(net, tmp_path / "bad.difffn", vjp_order=-1)


def test_a_file_from_before_vjp_order_still_loads(cnn, tmp_path):
    from difffn._persistence import _container

    _, path = cnn
    payload = _container.read(path, "exported")
    del payload["vjp_order"]
    _container.write(tmp_path / "old.difffn", "exported", payload)
    assert df.load_exported(tmp_path / "old.difffn").vjp_order == 1
