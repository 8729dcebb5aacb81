"""Data sources: arrays and iterables answer training's questions alike, validation included."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from training_layers import regression_data, regression_net

import difffn as df
from difffn._batching import _sources as sources
from difffn._batching._sources import ArraySource, IterableSource, source
from difffn._devices._sharding import Placement


def batches_of(X, T, size):
    return [(X[i : i + size], T[i : i + size]) for i in range(0, len(X), size)]


def test_arrays_and_their_batches_give_the_same_observations_in_order():
    X, T = regression_data(40)
    net = regression_net()
    arrays = source("test", (X, T), net, role="validation")
    iterable = source("test", batches_of(X, T, 16), net, role="validation")
    assert isinstance(arrays, ArraySource) and isinstance(iterable, IterableSource)
    a, b = list(arrays.in_order(16)), list(iterable.in_order())
    assert [len(x[0]) for x, _ in a] == [16, 16, 8]  # the last, smaller batch is included
    for (xa, ta), (xb, tb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa[0], xb[0])
        np.testing.assert_array_equal(ta[0], tb[0])
    np.testing.assert_array_equal(arrays.first_inputs()[0], X[:1])
    np.testing.assert_array_equal(iterable.first_inputs()[0], X[:16])
    assert (arrays.count, arrays.iterations(16), iterable.iterations()) == (40, 2, 3)


def test_training_feeds_of_arrays_and_of_an_iterable():
    X, T = regression_data(40)
    net = regression_net()
    placement = Placement("auto")
    arrays = ArraySource("test", X, T, net)
    arrays.place(placement)
    order = arrays.epoch_order(1, "never", (0,))
    feeds = list(arrays.epoch_feeds(order, 1, placement, 16))  # resumed after one batch
    assert [spec for spec, _ in feeds] == [("gather", 16, (0,), (0,), 16)]  # 16: not padded
    assert int(feeds[0][1][3]) == 1  # the batch index the step gathers
    iterable = IterableSource("test", batches_of(X, T, 16), net, max_epochs=2)
    feeds = list(iterable.epoch_feeds(None, 0, placement))
    assert [spec for spec, _ in feeds] == [("direct", (0,), (0,), None)] * 2  # 8 are dropped
    assert iterable.data_batch_size == 16


def test_shuffles_are_fixed_by_the_seed():
    X, T = regression_data(40)
    arrays = ArraySource("test", X, T, regression_net())
    once = [arrays.epoch_order(e, "once", (1, 2)) for e in (1, 2)]
    every = [arrays.epoch_order(e, "every-epoch", (1, 2)) for e in (1, 2)]
    np.testing.assert_array_equal(once[0], once[1])
    assert not np.array_equal(every[0], every[1])
    np.testing.assert_array_equal(every[1], arrays.epoch_order(2, "every-epoch", (1, 2)))


def test_statistics_sample_and_fingerprint():
    X, T = regression_data(40)
    net = regression_net()
    iterable = IterableSource("test", batches_of(X, T, 4), net)  # 10 batches; 8 are sampled
    assert iterable.statistics_sample(0).shape == (32, 3)
    assert ArraySource("test", X, T, net).statistics_sample(0) is X
    assert list(ArraySource("test", X, T, net).fingerprint()) == ["data X[0]", "data T[0]"]
    assert iterable.fingerprint()["data"] == "an iterable list of 10 training batches"


@pytest.mark.parametrize(
    "data, match",
    [
        (3, "validation_data must be an iterable of"),
        ([(np.zeros((4, 3)),)], "each batch must be a tuple"),
    ],
)
def test_validation_data_errors_name_validation_data(data, match):
    with pytest.raises(df.OptionsError, match=match):
        s = source("trainnet", data, regression_net(), role="validation")
        list(s.in_order(4))


def test_array_errors_name_the_role():
    X, T = regression_data(8)
    with pytest.raises(df.OptionsError, match="validation_data T must be an array"):
        ArraySource("trainnet", X, "T", regression_net(), role="validation")
    with pytest.raises(df.OptionsError, match="the validation inputs and targets have different"):
        ArraySource("trainnet", X, T[:4], regression_net(), role="validation")


def test_multi_process_shares_of_different_sizes_are_refused(monkeypatch):
    # global_batch compares the processes' first batch sizes through _distributed.gather_rows
    # (process_allgather); here it stands for a second process whose batches have one row more.
    # The real collective runs in tests/test_multihost.py.
    X, T = regression_data(12)
    data = IterableSource("trainnet", batches_of(X, T, 3), regression_net())
    monkeypatch.setattr(sources, "gather_rows", lambda x, axis: np.concatenate([x, x + 1], axis))
    placement = SimpleNamespace(mesh="a mesh", multi_host=True, processes=2)
    with pytest.raises(
        df.OptionsError,
        match=r"trainnet: execution_environment='multi-host' joins every process's own batch .*"
        r"different sizes \(process 0: 3, process 1: 4\)\. Fix: yield batches of the same size "
        r"in every process \(e\.g\. 3 rows each\)",
    ):
        sources.global_batch(data, placement, None)
    monkeypatch.setattr(sources, "gather_rows", lambda x, axis: np.concatenate([x, x], axis))
    assert sources.global_batch(data, placement, None) == (6, 2)  # 2 shares of 3
