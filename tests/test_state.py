"""TrainingState: its checkpoint payload is written and read back to the same progress."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose
from training_layers import regression_net

import difffn as df
from difffn._devices._sharding import Placement
from difffn._layer._parameters import learnable_mask
from difffn._training import _rowlog
from difffn._training._state import Checkpoint, TrainingState, plain_row, same_key, split


def a_state(net, opt_state, key):
    index = tuple(i for i, m in enumerate(jax.tree.leaves(learnable_mask(net))) if m)
    learnables, others = split(net, index)
    return TrainingState(
        treedef=jax.tree.structure(net),
        learnable_index=index,
        learnables=learnables,
        others=others,
        opt_state=opt_state,
        key=key,
        shuffle_seed=(1, 2, 3),
    )


def test_the_payload_round_trip_restores_every_field(tmp_path):
    net = regression_net().initialize(key=jax.random.key(0))
    written = a_state(net, {"m": jnp.arange(3.0)}, jax.random.key(5))
    written.iteration, written.epoch, written.batch = 7, 2, 3
    written.order = np.array([2, 0, 1], np.int32)
    written.training_rows = [{"iteration": 7, "loss": jnp.float32(0.5)}]
    written.record_validation(
        {"iteration": 7, "loss": 0.25}, objective="loss", maximize=False, keep=True
    )
    written.stop_reason = "Stopped by output_fcn"
    _rowlog.repair(tmp_path / "net_history__0123456789abcdef.difffnlog")
    _rowlog.append(
        tmp_path / "net_history__0123456789abcdef.difffnlog",
        (0, [plain_row(r) for r in written.training_rows]),
        (0, [plain_row(r) for r in written.validation_rows]),
    )
    payload = written.to_payload(
        elapsed=1.5,
        fingerprint={"loss": "'mse'"},
        run_key=jax.random.key(9),
        history={"file": "net_history__0123456789abcdef.difffnlog", "training": 1, "validation": 1},
        data_batch_size=None,
    )
    checkpoint = Checkpoint.from_payload(payload, str(tmp_path / "checkpoint.difffn"))
    assert (checkpoint.iteration, checkpoint.epoch, checkpoint.fingerprint) == (
        7,
        2,
        {"loss": "'mse'"},
    )
    assert same_key(checkpoint.run_key, jax.random.key(9))

    read = a_state(net, {"m": jnp.zeros(3)}, jax.random.key(0))
    assert read.restore(checkpoint, placement=Placement("auto")) is None  # nothing lost
    assert (read.iteration, read.epoch, read.batch, read.elapsed) == (7, 2, 3, 1.5)
    assert read.stop_reason is None  # an output_fcn stop is a pause
    np.testing.assert_array_equal(read.order, [2, 0, 1])
    assert_tree_allclose(read.opt_state, {"m": jnp.arange(3.0)})
    assert same_key(read.key, jax.random.key(5))
    assert (read.best_objective, read.best_iteration) == (0.25, 7)
    assert_tree_allclose(read.best().learnables, net.learnables)
    assert read.training_rows == [{"iteration": 7, "loss": 0.5}]


def test_a_payload_of_another_kind_or_a_newer_version_is_refused():
    with pytest.raises(df.SerializationError, match="does not hold a difffn training checkpoint"):
        Checkpoint.from_payload({"format": "difffn.network"}, "file")
    with pytest.raises(df.SerializationError, match="format version 99, newer than"):
        Checkpoint.from_payload({"format": "difffn.checkpoint", "format_version": 99}, "file")
