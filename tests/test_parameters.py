"""The one walk over annotated parameters: leaf order, kinds and paths, factors, tables, files."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import difffn as df
from difffn._layer._parameters import count, leaf_kinds, learnable_mask, walk
from difffn._network._factors import leaf_factors


class Holder(df.Layer):
    """A learnable network, a learnable, a state and an array property: every kind of field."""

    net: df.Network | None = df.learnable(default=None)
    scale: jax.Array | None = df.learnable(default=None)
    count: jax.Array | None = df.state(default=None)
    offsets: jax.Array | None = None  # a property holding an array: a constant leaf
    label: str = "h"  # a hashable property: static, no leaf

    def predict(self, x):
        return df.stripdims(self.net.predict(x)) * self.scale + self.offsets, self.count


@pytest.fixture
def outer(key):
    inner = df.Network([df.layers.FullyConnected(2, name="fc")]).initialize(
        df.Layout((None, 3), "BC"), key=key
    )
    holder = Holder(
        net=inner, scale=jnp.ones((1, 2)), count=jnp.zeros(()), offsets=jnp.zeros((1, 2)), name="h"
    )
    return df.Network(
        [df.layers.FeatureInput(3, normalization="none", name="in"), holder]
    ).initialize(key=key)


def test_walk_follows_jaxs_own_leaf_order_and_key_paths(outer):
    entries = list(walk(outer))
    with_paths = jax.tree_util.tree_flatten_with_path(outer)[0]
    walked = [(p, leaf) for p in entries for leaf in p.leaves]
    assert len(walked) == len(with_paths) == 5
    for (p, leaf), (key_path, jax_leaf) in zip(walked, with_paths, strict=True):
        assert leaf is jax_leaf
        assert "." + p.path.replace("/", ".") == jax.tree_util.keystr(key_path)
    assert [(p.path, p.kind, p.nested) for p in entries] == [
        ("h/net", "learnable", True),
        ("h/net/fc/weights", "learnable", False),
        ("h/net/fc/bias", "learnable", False),
        ("h/scale", "learnable", False),
        ("h/count", "state", False),
        ("h/offsets", "constant", False),
    ]
    fc = entries[1]
    assert (fc.layer_path, fc.field, fc.owners) == ("h/net/fc", "weights", (entries[0],))


def test_kinds_mask_and_count(outer):
    assert leaf_kinds(outer) == ["learnable"] * 3 + ["state", "constant"]
    assert jax.tree.leaves(learnable_mask(outer)) == [True] * 3 + [False] * 2
    assert count(outer, "learnable") == 3 * 2 + 2 + 2 and count(outer, "state") == 1
    assert "10 learnables" in repr(outer)
    assert leaf_kinds({"a": jnp.ones(2)}) == ["constant"]  # not a layer: nothing is learnable


def test_factors_multiply_through_a_nested_network(outer):
    net = df.set_learn_rate_factor(outer, "h/net", 0.5)
    net = df.set_learn_rate_factor(net, "h/net/fc/weights", 0.1)
    assert leaf_factors(net, "learn_rate_factor") == [0.05, 0.5, 1.0, 0.0, 0.0]
    # FullyConnected's bias has MATLAB's L2 factor 0
    assert leaf_factors(net, "l2_factor") == [1.0, 0.0, 1.0, 0.0, 0.0]


def test_tables_list_every_field_by_path(outer):
    assert list(outer.learnables) == ["h/net/fc/weights", "h/net/fc/bias", "h/scale"]
    assert list(outer.state) == ["h/count"]
    updated = outer.replace(learnables={"h/net/fc/bias": jnp.ones(2)})
    assert float(updated.layer("h").net.learnables["fc/bias"].sum()) == 2.0


def test_factors_set_on_nested_fields_survive_save_and_load(outer, tmp_path):
    net = df.set_learn_rate_factor(outer, "h/net", 0.5)
    net = df.set_l2_factor(net, "h/net/fc/weights", 0.25)
    path = df.save(tmp_path / "net.difffn", net)
    loaded = df.load(path, like=outer)
    assert df.get_learn_rate_factor(loaded, "h/net") == 0.5
    assert df.get_l2_factor(loaded, "h/net/fc/weights") == 0.25
    assert leaf_factors(loaded, "l2_factor") == leaf_factors(net, "l2_factor")
