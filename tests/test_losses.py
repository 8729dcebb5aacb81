"""Losses against hand-computed values (MATLAB's definitions), formats, targets and errors."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import difffn as df

Y = jnp.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])  # two observations, three classes


def test_crossentropy_one_hot_is_normalized_by_batch_size_only():
    T = jnp.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    expected = -(math.log(0.7) + math.log(0.8)) / 2
    assert float(df.losses.crossentropy(Y, T)) == pytest.approx(expected, rel=1e-6)


def test_crossentropy_integer_labels_equal_one_hot():
    labels = jnp.array([0, 2])
    one_hot = jax.nn.one_hot(labels, 3)
    assert float(df.losses.crossentropy(Y, labels)) == pytest.approx(
        float(df.losses.crossentropy(Y, one_hot)), rel=1e-6
    )
    assert float(df.losses.index_crossentropy(Y, labels)) == pytest.approx(
        -(math.log(0.7) + math.log(0.8)) / 2, rel=1e-6
    )


def test_crossentropy_sums_over_spatial_axes_and_divides_by_observations():
    # "BSC": 2 observations, 3 positions each: the loss sums the 6 terms and divides by 2.
    probabilities = jnp.full((2, 3, 4), 0.25)
    y = df.dlarray(probabilities, "BSC")
    labels = jnp.zeros((2, 3), jnp.int32)
    assert float(df.losses.crossentropy(y, labels)) == pytest.approx(-6 * math.log(0.25) / 2)


def test_crossentropy_uses_the_format_of_the_predictions():
    # "CB": classes first; targets given in the same layout.
    y = df.dlarray(Y.T, "CB")
    t = jnp.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    assert float(df.losses.crossentropy(y, t)) == pytest.approx(
        -(math.log(0.7) + math.log(0.8)) / 2, rel=1e-6
    )
    # formatted targets in another order are permuted to the predictions' format
    t_bc = df.dlarray(t.T, "BC")
    assert float(df.losses.crossentropy(y, t_bc)) == pytest.approx(
        -(math.log(0.7) + math.log(0.8)) / 2, rel=1e-6
    )


def test_crossentropy_bounds_probabilities_away_from_zero():
    value = df.losses.crossentropy(jnp.array([[0.0, 1.0]]), jnp.array([0]))
    assert np.isfinite(float(value))
    assert float(value) == pytest.approx(-math.log(np.finfo(np.float32).eps), rel=1e-5)


def test_crossentropy_normalization_none_returns_the_sum():
    T = jnp.array([0, 2])
    assert float(df.losses.crossentropy(Y, T, normalization="none")) == pytest.approx(
        -(math.log(0.7) + math.log(0.8)), rel=1e-6
    )


def test_binary_crossentropy():
    y = jnp.array([[0.9, 0.2], [0.4, 0.6]])
    t = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    expected = -(math.log(0.9) + math.log(0.8) + math.log(0.6) + math.log(0.6)) / 2
    assert float(df.losses.binary_crossentropy(y, t)) == pytest.approx(expected, rel=1e-6)


def test_mse_is_half_the_summed_squared_error_over_observations():
    y = jnp.array([[1.0, 2.0, 3.0], [0.0, -1.0, 2.0]])
    t = jnp.array([[0.0, 2.0, 1.0], [1.0, 1.0, 2.0]])
    # squared errors: 1 + 0 + 4 + 1 + 4 + 0 = 10; half, over 2 observations
    assert float(df.losses.mse(y, t)) == pytest.approx(10 / 2 / 2)


def test_l2loss_has_no_half_and_l1loss_sums_absolute_errors():
    y = jnp.array([[1.0, 2.0, 3.0], [0.0, -1.0, 2.0]])
    t = jnp.array([[0.0, 2.0, 1.0], [1.0, 1.0, 2.0]])
    assert float(df.losses.l2loss(y, t)) == pytest.approx(10 / 2)
    assert float(df.losses.l1loss(y, t)) == pytest.approx((1 + 0 + 2 + 1 + 2 + 0) / 2)
    assert float(df.losses.l1loss(y, t, normalization="all-elements")) == pytest.approx(6 / 6)
    assert float(df.losses.l2loss(y, t, normalization="none")) == pytest.approx(10)


def test_huber():
    y = jnp.array([[0.5, 3.0], [-2.0, 0.0]])
    t = jnp.zeros((2, 2))
    # |z| <= 1: z^2 / 2; else |z| - 1/2  ->  0.125 + 2.5 + 1.5 + 0
    assert float(df.losses.huber(y, t)) == pytest.approx(4.125 / 2)
    # transition point 2: 0.125 + 2*(3 - 1) + 0.5*4 + 0 = 6.125
    assert float(df.losses.huber(y, t, transition_point=2.0)) == pytest.approx(6.125 / 2)


def test_losses_are_differentiable_and_jit():
    t = jnp.array([0, 2])
    grad = jax.jit(jax.grad(lambda y: df.losses.crossentropy(y, t)))(Y)
    # d/dY of -sum(log Y[b, t_b]) / N is -1 / (N Y) at the target entries
    expected = np.zeros((2, 3))
    expected[0, 0] = -1 / (2 * 0.7)
    expected[1, 2] = -1 / (2 * 0.8)
    np.testing.assert_allclose(grad, expected, rtol=1e-5)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: df.losses.mse(jnp.ones((2, 3)), jnp.ones((3, 2))), "shape"),
        (
            lambda: df.losses.crossentropy(jnp.ones((2, 3)), jnp.zeros((3,), jnp.int32)),
            "without the class axis",
        ),
        (lambda: df.losses.index_crossentropy(Y, jnp.zeros((2, 3))), "integer class indices"),
        (lambda: df.losses.l1loss(Y, Y, normalization="mean"), "batch-size"),
        (lambda: df.losses.huber(Y, Y, transition_point=0), "transition_point"),
    ],
)
def test_bad_arguments_are_clear_errors(call, match):
    with pytest.raises(df.OptionsError, match=match):
        call()


# -- class labels are range-checked; integer one-hot is one-hot (issue 12 items 3, 10) ------------


@pytest.mark.parametrize(
    "labels, match",
    [
        (
            [1, 3],
            r"are class labels 1\.\.3, but the 3 classes are numbered 0\.\.2: these look like MATLAB's 1-based",
        ),
        (
            [0, -1],
            r"hold the class label -1, outside 0\.\.2 .*a negative label would silently pick",
        ),
        ([0, 7], r"hold the class label 7, outside 0\.\.2 for the 3 classes"),
    ],
)
@pytest.mark.parametrize("loss", [df.losses.crossentropy, df.losses.index_crossentropy])
def test_class_labels_out_of_range_are_named(loss, labels, match):
    with pytest.raises(df.OptionsError, match=match):
        loss(Y, jnp.array(labels))


def test_traced_labels_are_not_checked_but_concrete_ones_are_once():
    # under jit the check cannot read the values; trainnet and testnet check their data first
    value = jax.jit(df.losses.crossentropy)(Y, jnp.array([0, 2]))
    assert float(value) == pytest.approx(float(df.losses.crossentropy(Y, jnp.array([0, 2]))))


def test_integer_one_hot_targets_are_one_hot():
    one_hot = jax.nn.one_hot(jnp.array([0, 2]), 3)
    a = df.losses.crossentropy(Y, one_hot)
    b = df.losses.crossentropy(Y, one_hot.astype(jnp.int32))
    assert float(a) == float(b)
    with pytest.raises(
        df.OptionsError, match=r"have the predictions' shape \(2, 3\): one-hot, not class indices"
    ):
        df.losses.index_crossentropy(Y, one_hot.astype(jnp.int32))
