"""Tests of difffn/_sequences.py: padding, truncation, splitting and buckets of sequences of
different lengths (``df.padsequences``, the ``sequence_*`` options), and the named errors for
bad sequence data."""

from __future__ import annotations

import numpy as np
import pytest

import difffn as df
from difffn._batching._sequences import SequenceOptions, bucket, place, windows

L = df.layers


def _sequences(lengths, channels=2, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n, channels)).astype(np.float32) for n in lengths]


def _net(channels=2):
    return [L.SequenceInput(channels), L.GRU(3, output_mode="last"), L.FullyConnected(2),
            L.Softmax()]  # fmt: skip


@pytest.mark.parametrize("direction", ["right", "left"])
def test_padsequences_places_each_sequence_and_marks_it(direction):
    seqs = _sequences([3, 1, 4])
    x, mask = df.padsequences(seqs, direction=direction, padding_value=-7.0)
    assert x.format == "BTC" and x.shape == (3, 4, 2)
    data = np.asarray(x.data)
    for b, s in enumerate(seqs):
        n = len(s)
        real = slice(0, n) if direction == "right" else slice(4 - n, 4)
        np.testing.assert_array_equal(data[b, real], s)
        assert mask[b].sum() == n and mask[b, real].all()
        np.testing.assert_array_equal(data[b][~mask[b]], -7.0)


def test_padsequences_truncates_like_matlab():
    seqs = [np.arange(5.0)[:, None], np.arange(2.0)[:, None]]
    right, _ = df.padsequences(seqs, length="shortest")
    left, _ = df.padsequences(seqs, length="shortest", direction="left")
    assert np.asarray(right.data)[0, :, 0].tolist() == [0.0, 1.0]  # keeps the start
    assert np.asarray(left.data)[0, :, 0].tolist() == [3.0, 4.0]  # keeps the end
    fixed, mask = df.padsequences(seqs, length=3)
    assert np.asarray(fixed.data)[:, :, 0].tolist() == [[0, 1, 2], [0, 1, 0]]
    assert mask.tolist() == [[True, True, True], [True, True, False]]


def test_padsequences_other_format():
    x, mask = df.padsequences(_sequences([2, 3]), fmt="TBC")
    assert x.format == "TBC" and x.shape == (3, 2, 2) and mask.shape == (2, 3)


@pytest.mark.parametrize(
    ("bucketing", "expected"),
    [("power-of-two", [1, 2, 4, 4, 8, 128, 256]), (8, [8, 8, 8, 8, 8, 104, 200]),
     ("none", [1, 2, 3, 4, 5, 100, 200])],
)  # fmt: skip
def test_bucket(bucketing, expected):
    assert [bucket(n, bucketing) for n in (1, 2, 3, 4, 5, 100, 200)] == expected


def test_split_windows_cover_every_step_once():
    """sequence_length=L: chunks of L steps (the last padded to L), each real step in exactly
    one chunk, in order, for both padding directions."""
    seqs = [np.arange(n, dtype=np.float32)[:, None] + 100 * i for i, n in enumerate([7, 2, 5])]
    lengths = np.array([7, 2, 5])
    for direction in ("right", "left"):
        options = SequenceOptions(3, 0.0, direction, "power-of-two")
        chunks = windows(lengths, options)
        assert len(chunks) == 3 and all(w.size == 3 for w in chunks)
        seen = [[] for _ in seqs]
        for w in chunks:
            out, mask = place(seqs, 0, w, direction, -1.0)
            for b in range(3):
                seen[b] += out[b, mask[b], 0].tolist()
        assert seen == [s[:, 0].tolist() for s in seqs]


def test_sequence_options_in_training_options():
    options = df.TrainingOptions(
        sequence_length=16, sequence_padding_direction="left", sequence_padding_value=-1,
        sequence_bucketing=4,
    )  # fmt: skip
    assert options.sequence_length == 16 and options.sequence_padding_value == -1.0
    assert SequenceOptions.of(df.TrainingOptions()) == SequenceOptions()
    assert "sequence_length=16" in repr(options)


@pytest.mark.parametrize(
    ("option", "value", "match"),
    [
        ("sequence_length", 0, r"must be 'longest', 'shortest' or a positive int"),
        ("sequence_length", "long", r"got 'long'"),
        ("sequence_length", 2.5, r"got 2\.5"),
        ("sequence_padding_direction", "both", r"'right' or 'left'; got 'both'"),
        ("sequence_padding_value", "zero", r"a real number; got 'zero'"),
        ("sequence_bucketing", 0, r"'power-of-two', 'none' or a positive int k"),
    ],
)
def test_bad_sequence_options_are_named(option, value, match):
    with pytest.raises(df.OptionsError, match=f"TrainingOptions: {option} .*{match}"):
        df.TrainingOptions(**{option: value})
    with pytest.raises(df.OptionsError, match=f"minibatchpredict: {option} .*{match}"):
        df.minibatchpredict(df.Network(_net()), _sequences([2, 3]), **{option: value})


def test_sequences_mixing_ranks_are_named():
    seqs = _sequences([3, 4]) + [np.ones(5, np.float32)]
    with pytest.raises(df.OptionsError, match=r"X\[2\] has shape \(5,\).*ranks \[1, 2\]"):
        df.trainnet(seqs, np.array([0, 1, 0]), _net(), "crossentropy", df.TrainingOptions())


def test_sequences_of_one_channel_without_channel_axis_get_a_hint(key):
    seqs = [np.ones((4, 1), np.float32), np.ones(2, np.float32)]
    with pytest.raises(df.OptionsError, match=r"x\[:, None\]"):
        df.minibatchpredict(df.Network(_net(1)).initialize(key=key), seqs)


def test_sequences_mixing_channel_counts_are_named():
    seqs = _sequences([3, 4]) + _sequences([2], channels=3)
    with pytest.raises(df.OptionsError, match=r"X\[0\] has shape \(3, 2\), X\[2\] has \(2, 3\)"):
        df.trainnet(seqs, np.array([0, 1, 0]), _net(), "crossentropy", df.TrainingOptions())


def test_step_targets_of_other_lengths_are_named():
    seqs = _sequences([3, 4])
    labels = [np.zeros(3, np.int32), np.zeros(5, np.int32)]
    net = [L.SequenceInput(2), L.GRU(3), L.FullyConnected(2), L.Softmax()]
    with pytest.raises(df.OptionsError, match=r"T\[1\] has shape \(5,\) but sequence 1 has 4"):
        df.trainnet(seqs, labels, net, "crossentropy", df.TrainingOptions())
    with pytest.raises(df.OptionsError, match=r"1 per-step target sequences for 2 input"):
        df.trainnet(seqs, labels[:1], net, "crossentropy", df.TrainingOptions())


def test_too_few_sequence_targets_and_empty_sequences_are_named():
    seqs = _sequences([3, 4, 2])
    with pytest.raises(df.OptionsError, match=r"T has 2 targets for 3 sequences"):
        df.trainnet(seqs, np.array([0, 1]), _net(), "crossentropy", df.TrainingOptions())
    with pytest.raises(df.OptionsError, match=r"X\[1\] has no time steps"):
        df.trainnet([seqs[0], np.zeros((0, 2), np.float32)], np.array([0, 1]), _net(),
                    "crossentropy", df.TrainingOptions())  # fmt: skip


def test_min_length_is_checked_on_the_real_lengths():
    net = [L.SequenceInput(2, min_length=3), L.GRU(3, output_mode="last"),
           L.FullyConnected(2), L.Softmax()]  # fmt: skip
    with pytest.raises(df.OptionsError, match=r"sequence 1 has 2 time steps.*min_length=3"):
        df.trainnet(_sequences([4, 2]), np.array([0, 1]), net, "crossentropy",
                    df.TrainingOptions())  # fmt: skip
