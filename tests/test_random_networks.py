"""Random small networks, some invalid: everything works or raises a ``df.Error`` (issue 12).

Hypothesis builds chains and small two-branch graphs from built-in layers with random options
(some out of range), random input sizes and random data layouts (some that do not fit), then
constructs, initializes, predicts, saves and loads them; single layers go through
``df.check_layer`` on small layouts. A user mistake must be a ``df.Error``; any other exception
is a failure found. The examples are derandomized (one fixed sequence, the same in CI and on
every machine); ``DIFFFN_HYPOTHESIS_RANDOM=1`` draws new ones when hunting for failures.
"""

from __future__ import annotations

import functools
import os
import tempfile

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings

import difffn as df
from difffn import layers as L

RANDOM = os.environ.get("DIFFFN_HYPOTHESIS_RANDOM") == "1"
KEY = jax.random.key(0)


def bounded(n: int):
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=not RANDOM,
        phases=(Phase.explicit, Phase.reuse, Phase.generate),  # no shrinking: bounded time
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# Mostly valid options (so that most networks get as far as save and load), some invalid: 0 and
# -1 sizes, probabilities outside [0, 1), negative or zero epsilon and alpha, group counts that
# do not divide the channels, negative scales.
sizes = st.integers(1, 4) | st.sampled_from([0, -1])
probabilities = st.sampled_from([0.3, 0.0, 1.0, 1.5, -0.1])

feature_layers = st.one_of(
    st.builds(functools.partial, st.just(L.FullyConnected), sizes),
    st.just(L.ReLU),
    st.builds(functools.partial, st.just(L.ELU), alpha=st.sampled_from([1.0, 0.1, 0.5, -2.0])),
    st.builds(functools.partial, st.just(L.Dropout), probabilities),
    st.builds(
        functools.partial, st.just(L.BatchNorm), epsilon=st.sampled_from([1e-5, 1e-3, 0.0, -1.0])
    ),
    st.just(L.Softmax),
    st.builds(functools.partial, st.just(L.LeakyReLU), st.sampled_from([0.01, 0.2, "a"])),
    st.builds(functools.partial, st.just(L.ClippedReLU), st.sampled_from([6.0, 1.0, -1.0])),
    st.sampled_from([L.GELU, L.Tanh, L.Swish, L.LayerNorm]),
)
image_layers = st.one_of(
    st.builds(
        functools.partial,
        st.just(L.Conv2D),
        st.integers(1, 3) | st.just(0),
        sizes,
        stride=st.integers(0, 2),
        padding=st.sampled_from([0, 1, "same", "sam"]),
    ),
    st.builds(functools.partial, st.just(L.MaxPool2D), st.integers(0, 3), stride=st.integers(1, 2)),
    st.builds(
        functools.partial, st.just(L.AveragePool2D), st.integers(0, 3), stride=st.integers(1, 2)
    ),
    st.sampled_from([L.GlobalAveragePool2D, L.GlobalMaxPool2D]),
    st.builds(functools.partial, st.just(L.GroupNorm), st.sampled_from([1, 2, "channel-wise", 0])),
    st.builds(functools.partial, st.just(L.Resize2D), scale=st.sampled_from([2, 0.5, -1])),
    st.just(L.BatchNorm),
    st.just(L.ReLU),
    st.just(L.Flatten),
)
sequence_layers = st.one_of(
    st.builds(
        functools.partial,
        st.just(L.LSTM),
        sizes,
        output_mode=st.sampled_from(["sequence", "last", "all"]),
    ),
    st.builds(
        functools.partial, st.just(L.GRU), sizes, output_mode=st.sampled_from(["sequence", "last"])
    ),
    st.builds(
        functools.partial,
        st.just(L.Conv1D),
        st.integers(0, 3),
        sizes,
        padding=st.sampled_from(["causal", "same", 0, "valid"]),
    ),
    st.just(L.ReLU),
)


@st.composite
def chains(draw):
    """An input layer, a few layers of its kind (or another kind: a format mistake), and data."""
    kind = draw(st.sampled_from(["feature", "image", "sequence"]))
    batch = draw(st.integers(0, 3))
    if kind == "feature":
        c = draw(st.integers(1, 4))
        first, data_shape, body = (
            L.FeatureInput(c),
            (batch, draw(st.sampled_from([c, c + 1]))),
            feature_layers,
        )
    elif kind == "image":
        h, c = draw(st.integers(1, 5)), draw(st.integers(1, 2))
        first = L.ImageInput((h, h, c), normalization="none")
        data_shape, body = (batch, h, draw(st.sampled_from([h, h + 1])), c), image_layers
    else:
        c, t = draw(st.integers(1, 3)), draw(st.integers(1, 4))
        first, data_shape, body = L.SequenceInput(c), (batch, t, c), sequence_layers
    mixed = st.one_of(body, feature_layers, image_layers) if draw(st.booleans()) else body
    return first, draw(st.lists(mixed, min_size=1, max_size=3)), np.ones(data_shape, np.float32)


@st.composite
def graphs(draw):
    """Two feature branches merged by an addition or a concatenation."""
    a, b = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    merge = draw(st.sampled_from([L.Addition, L.Concatenation]))
    fa, fb = draw(feature_layers), draw(feature_layers)

    def layers():
        return [
            L.FeatureInput(a, name="a"),
            fa(name="fa"),
            L.FeatureInput(b, name="b"),
            fb(name="fb"),
            merge(name="merge"),
            L.FullyConnected(2, name="out"),
        ]

    connections = [("a", "fa"), ("b", "fb"), ("fa", "merge/in1"), ("fb", "merge/in2")]
    connections.append(("merge", "out"))
    return layers, connections, (np.ones((2, a), np.float32), np.ones((2, b), np.float32))


def _exercise(make, data) -> None:
    """Build, initialize, predict, save and load; only a df.Error may stop it."""
    try:
        net = make().initialize(key=KEY)
        before = net.predict(*data)
        with tempfile.TemporaryDirectory() as folder:
            path = df.save(os.path.join(folder, "net.difffn"), net)
            loaded = df.load(path, like=make())
        after = loaded.predict(*data)
    except df.Error as error:
        event(f"{type(error).__name__} while building, predicting or saving")
        return
    event("worked, and the loaded network predicts the same")
    for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
@bounded(10)
@given(chains())
def test_random_chains_work_or_raise_a_df_error(chain):
    first, factories, x = chain
    _exercise(lambda: df.Network([first, *(make() for make in factories)]), (x,))


@pytest.mark.slow
@bounded(8)
@given(graphs())
def test_random_graphs_work_or_raise_a_df_error(graph):
    layers, connections, xs = graph
    _exercise(lambda: df.Network(layers(), connections=connections), xs)


@st.composite
def single_layers(draw):
    """A layer factory and a small layout of its kind (or, sometimes, of another kind)."""
    if draw(st.booleans()):
        layer, layout = draw(feature_layers), df.Layout((2, draw(st.integers(1, 3))), "BC")
    else:
        layer = draw(
            st.sampled_from([L.ReLU, L.GlobalAveragePool2D, functools.partial(L.MaxPool2D, 2)])
        )
        h = draw(st.integers(1, 3))
        layout = df.Layout((2, h, h, 1), draw(st.sampled_from(["BSSC", "BCSS"])))
    return layer, layout


@pytest.mark.slow
@bounded(3)
@given(single_layers())
def test_check_layer_on_random_layers_reports_or_raises_a_df_error(subject):
    make, layout = subject
    try:
        report = df.check_layer(make(), layout)
    except df.Error:
        return
    assert isinstance(report, df.CheckReport)
