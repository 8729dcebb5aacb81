"""df.save / df.load: round trips, structure checks, damaged files, atomic writes."""

from __future__ import annotations

import os
import stat
import struct
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose, unwritable_folder
from test_network import Dense, Features, RunningMean, Tanh, mlp

import difffn as df
from difffn._persistence import _container


@pytest.fixture
def net(key):
    n = df.Network(
        [
            Features(name="in"),
            Dense(name="fc1"),
            Tanh(name="act"),
            RunningMean(name="rm"),
            Dense(size=2, name="fc2"),
        ]
    ).initialize(key=key)
    n = n.replace(state={"rm/mean": jnp.arange(4.0)})
    return df.set_l2_factor(df.set_learn_rate_factor(n, "fc1/w", 0.25), "fc2/b", 3.0)


def structure():
    return df.Network(
        [
            Features(name="in"),
            Dense(name="fc1"),
            Tanh(name="act"),
            RunningMean(name="rm"),
            Dense(size=2, name="fc2"),
        ]
    )


def test_round_trip_restores_values_state_factors_and_layouts(net, tmp_path):
    path = df.save(tmp_path / "net.difffn", net)
    for like in (structure(), structure().initialize(key=jax.random.key(5))):
        loaded = df.load(path, like=like)
        assert_tree_allclose(loaded.learnables, net.learnables, rtol=0, atol=0)
        assert_tree_allclose(loaded.state, net.state, rtol=0, atol=0)
        assert df.get_learn_rate_factor(loaded, "fc1/w") == 0.25
        assert df.get_l2_factor(loaded, "fc2/b") == 3.0
        x = jnp.ones((2, 3))
        np.testing.assert_array_equal(loaded.predict(x).data, net.predict(x).data)
    assert "?,3:BC" in loaded.summary()


def test_network_without_input_layers_restores_its_layouts(tmp_path, key):
    net = df.Network([Dense(name="fc")]).initialize(df.Layout((None, 3), "BC"), key=key)
    path = df.save(tmp_path / "n.difffn", net)
    loaded = df.load(path, like=df.Network([Dense(name="fc")]))
    np.testing.assert_array_equal(
        loaded.predict(jnp.ones((2, 3))).data, net.predict(jnp.ones((2, 3))).data
    )


def test_nested_network_parameters_round_trip(tmp_path, key):
    from test_layer import Siamese

    inner = df.Network([Dense(name="fc")]).initialize(df.Layout((None, 3), "BC"), key=key)
    inner = df.set_learn_rate_factor(inner, "fc/w", 0.5)
    outer = df.Network([Siamese(encoder=inner, name="siam")]).initialize(
        df.Layout((None, 3), "BC"), df.Layout((None, 3), "BC"), key=key
    )
    path = df.save(tmp_path / "n.difffn", outer)
    loaded = df.load(path, like=outer)
    assert_tree_allclose(loaded.learnables, outer.learnables, rtol=0, atol=0)
    assert df.get_learn_rate_factor(loaded, "siam/encoder/fc/w") == 0.5


@pytest.mark.parametrize(
    "like, message",
    [
        (
            lambda: df.Network(
                [
                    Features(name="in"),
                    Dense(name="fc1", size=5),
                    Tanh(name="act"),
                    RunningMean(name="rm"),
                    Dense(size=2, name="fc2"),
                ]
            ),
            r"does not match the network at parameter '\.fc1\.w': the network expects shape "
            r"\(3, 5\) float32; the file has \(3, 4\) float32",
        ),
        (
            lambda: mlp(),
            r"does not match the network at layer 4: the network has 'fc2'.*the file has 'rm'",
        ),
        (
            lambda: df.Network(
                [
                    Features(name="in"),
                    Dense(name="fc1"),
                    Tanh(name="act"),
                    RunningMean(name="rm"),
                    Dense(size=2, name="fc2"),
                ],
                connections=[("in", "rm")],
            ),
            r"connected differently",
        ),
    ],
    ids=["shape", "layers", "connections"],
)
def test_a_file_of_another_structure_names_the_first_difference(net, tmp_path, like, message):
    path = df.save(tmp_path / "net.difffn", net)
    with pytest.raises(df.SerializationError, match=message):
        df.load(path, like=like())


def test_dtype_mismatch_is_named(tmp_path, key, x64):
    net64 = jax.tree.map(lambda v: v.astype(jnp.float64), structure().initialize(key=key))
    path = df.save(tmp_path / "net.difffn", net64)
    with pytest.raises(
        df.SerializationError,
        match=r"parameter '\.fc1\.w': the network expects shape \(3, 4\) float32; the file has "
        r"\(3, 4\) float64",
    ):
        df.load(
            path,
            like=jax.tree.map(lambda v: v.astype(jnp.float32), structure().initialize(key=key)),
        )


def _damage(path, how):
    blob = path.read_bytes()
    if how == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    elif how == "corrupted":
        middle = len(blob) // 2
        path.write_bytes(blob[:middle] + bytes([blob[middle] ^ 0xFF]) + blob[middle + 1 :])
    elif how == "newer":
        header = bytearray(blob)
        struct.pack_into("<I", header, 8, _container.VERSION + 1)
        path.write_bytes(bytes(header))
    elif how == "foreign":
        path.write_bytes(b"PK\x03\x04 this is a zip file, not a difffn file" * 4)
    elif how == "empty":
        path.write_bytes(b"")


@pytest.mark.parametrize(
    "how, message",
    [
        (
            "truncated",
            r"is truncated or has trailing bytes: expected a payload of \d+ bytes, found \d+",
        ),
        ("corrupted", r"is corrupted: its checksum does not match its contents"),
        (
            "newer",
            r"was written by a newer difffn \(file format version 2; this version reads up to 1\)",
        ),
        ("foreign", r"is not a difffn file"),
        ("empty", r"is not a difffn file"),
    ],
)
def test_damaged_files_are_clear_errors(net, tmp_path, how, message):
    path = df.save(tmp_path / "net.difffn", net)
    _damage(path, how)
    with pytest.raises(df.SerializationError, match=message):
        df.load(path, like=structure())


def test_missing_file_and_bad_arguments(net, tmp_path):
    with pytest.raises(df.SerializationError, match=r"does not exist"):
        df.load(tmp_path / "nope.difffn", like=structure())
    with pytest.raises(
        df.SerializationError,
        match=r"needs a df\.Network giving the structure .*; got dict\. Fix: ",
    ):
        df.load(tmp_path / "x", like={})
    with pytest.raises(
        df.SerializationError,
        match=r"df\.save\(path, net\) expected a df\.Network as net; got list",
    ):
        df.save(tmp_path / "x", [])
    with pytest.raises(df.SerializationError, match=r"the folder .* does not exist"):
        df.save(tmp_path / "no" / "such" / "folder.difffn", net)


@pytest.mark.parametrize("failing", ["replace", "fsync"])
def test_a_crash_during_the_write_keeps_the_old_file(net, tmp_path, monkeypatch, failing):
    path = df.save(tmp_path / "net.difffn", net)
    before = path.read_bytes()
    changed = net.replace(learnables=net.learnables.map(lambda v: v + 1))

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, boom)
    with pytest.raises(
        df.SerializationError, match=r"could not write .*No space left on device.*unchanged"
    ):
        df.save(path, changed)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["net.difffn"]  # no temporary file left behind


def test_files_hold_no_pickle(net, tmp_path):
    blob = df.save(tmp_path / "net.difffn", net).read_bytes()
    assert b"pickle" not in blob and b"\x80\x04\x95" not in blob  # no pickle protocol frames


def test_input_statistics_computed_by_trainnet_load_into_a_fresh_network(tmp_path):
    def fresh():
        return df.Network(
            [
                df.layers.FeatureInput(3, normalization="zscore", name="in"),
                df.layers.FullyConnected(2, name="fc"),
            ]
        )

    X = np.random.default_rng(0).normal(2.0, 3.0, size=(32, 3)).astype(np.float32)
    options = df.TrainingOptions(max_epochs=1, mini_batch_size=16, verbose=False)
    trained, _ = df.trainnet(X, X[:, :2], fresh(), "mse", options)
    loaded = df.load(df.save(tmp_path / "net.difffn", trained), like=fresh())
    assert_tree_allclose(loaded.learnables, trained.learnables, rtol=0, atol=0)
    for name in ("mean", "standard_deviation"):
        np.testing.assert_array_equal(
            getattr(loaded.layer("in"), name), getattr(trained.layer("in"), name)
        )
    np.testing.assert_array_equal(loaded.predict(X).data, trained.predict(X).data)


# -- folders that refuse files, file modes, foreign files (issue 12 items 2, 9, 11) ---------------


def test_saving_into_a_read_only_folder_is_a_named_error(net, tmp_path):
    folder = unwritable_folder(tmp_path)
    with pytest.raises(
        df.SerializationError,
        match=r"could not write .*: cannot create a file in .*\(Permission denied\)\. The "
        r"previous file, if any, is unchanged\. Fix: write to a folder you can write to",
    ):
        df.save(folder / "net.difffn", net)
    with pytest.raises(df.SerializationError, match=r"cannot create a file in '/proc'"):
        df.save("/proc/net.difffn", net)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_follow_the_umask_like_ordinary_files(net, tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        path = df.save(tmp_path / "net.difffn", net)
        (tmp_path / "ordinary").write_bytes(b"")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "ordinary").stat().st_mode) == mode


@pytest.mark.parametrize("header", [b"PK\x03\x04", b"difffn"], ids=["foreign", "claimed-length"])
def test_a_large_file_is_refused_from_its_header_without_reading_it(net, tmp_path, header):
    path = tmp_path / "big.difffn"
    if header == b"difffn":  # a real header whose length disagrees with the file's size
        header = df.save(tmp_path / "net.difffn", net).read_bytes()[: _container._HEADER.size]
    with open(path, "wb") as file:
        file.write(header)
        file.truncate(1 << 30)  # 1 GiB, sparse: nothing is stored on the disk
    tracemalloc.start()
    try:
        with pytest.raises(
            df.SerializationError, match=r"is not a difffn file|is truncated or has trailing"
        ):
            df.load(path, like=structure())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the payload was never read


def _rewrite(path, kind, change):
    payload = _container.read(path, kind)
    change(payload)
    _container.write(path, kind, payload)  # a good checksum over a bad payload


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p.pop("structure"), r"the payload lacks 'structure'"),
        (
            lambda p: p["parameters"][0].pop("dtype"),
            r"the payload\['parameters'\]\[0\] lacks 'dtype'",
        ),
        (
            lambda p: p["parameters"][0].update(shape="3"),
            r"the payload\['parameters'\]\[0\]\['shape'\] should be list, not str",
        ),
        (
            lambda p: p["values"].clear(),
            r"parameter '.*' is listed with shape .* but has no values",
        ),
        (
            lambda p: p["values"].update({k: v[:1] for k, v in p["values"].items()}),
            r"is listed with shape \(\d+, \d+\) but has values of shape \(1, \d+\)",
        ),
        (lambda p: p.update(format_version="1"), r"\['format_version'\] should be int, not str"),
    ],
    ids=["no-structure", "no-dtype", "shape-type", "no-values", "value-shape", "version-type"],
)
def test_a_well_checksummed_malformed_file_is_a_named_error(net, tmp_path, change, message):
    path = df.save(tmp_path / "net.difffn", net)
    _rewrite(path, "network", change)
    with pytest.raises(df.SerializationError, match=rf"is malformed: .*{message}.*Fix:"):
        df.load(path, like=structure())
