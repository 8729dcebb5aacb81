"""The package layout: files written before the floors became packages still load and resume."""

import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from helpers import assert_tree_allclose

import difffn as df

BEFORE = Path(__file__).parent / "data" / "before_move"
sys.path.insert(0, str(BEFORE))
import make  # noqa: E402  (the script that wrote the files: the same network, data and options)


def test_a_network_saved_before_the_move_loads():
    net = make.network()
    loaded = df.load(BEFORE / "network.difffn", like=net)
    assert_tree_allclose(loaded.learnables, net.learnables, rtol=0, atol=0)
    x = jnp.ones((2, 4))
    np.testing.assert_array_equal(loaded.predict(x).data, net.predict(x).data)


def test_an_export_written_before_the_move_runs():
    exported = df.load_exported(BEFORE / "network.export.difffn")
    x = jnp.linspace(-1, 1, 12).reshape(3, 4)
    np.testing.assert_allclose(
        np.asarray(exported.predict(x).data),
        np.asarray(make.network().predict(x).data),
        rtol=1e-6,
        atol=1e-6,
    )


def test_a_checkpoint_written_before_the_move_resumes_exactly(tmp_path):
    """The fingerprint names the loss by the module path it had then (difffn._losses).

    A fingerprint that differed would refuse the resume with a SerializationError.
    """
    folder = tmp_path / "checkpoints"
    shutil.copytree(BEFORE / "checkpoints", folder)
    first = next(folder.glob("net_checkpoint__3__*.difffn"))
    X, T = make.data()
    options = df.TrainingOptions(
        "sgdm",
        max_epochs=2,
        mini_batch_size=8,
        shuffle="never",
        verbose=False,
        checkpoint_path=folder,
        checkpoint_frequency=1,
    )
    net = make.network()
    resumed, _ = df.trainnet(
        X, T, net, df.losses.crossentropy, options, key=jax.random.key(1), resume_from=first
    )
    fresh, _ = df.trainnet(
        X,
        T,
        net,
        df.losses.crossentropy,
        options.replace(checkpoint_path=None),
        key=jax.random.key(1),
    )
    # Bit-exact in a plain process; the suite's process may pick other CPU kernels than the one
    # that wrote the file, so the last digits are not compared.
    assert_tree_allclose(resumed.learnables, fresh.learnables, rtol=1e-5, atol=1e-7)
