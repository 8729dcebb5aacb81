"""df.data.digits: shapes, ranges, the fixed stratified split, and the missing-extra error."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import difffn as df


def test_digits_shapes_types_and_ranges():
    X_train, T_train, X_test, T_test = df.data.digits()
    assert X_train.shape == (1347, 8, 8, 1) and X_test.shape == (450, 8, 8, 1)
    assert X_train.dtype == X_test.dtype == np.float32
    assert T_train.dtype == T_test.dtype == np.int32
    assert X_train.min() == 0.0 and X_train.max() == 1.0
    assert set(np.unique(T_train)) == set(range(10))


def test_digits_split_is_fixed_stratified_and_disjoint():
    a = df.data.digits()
    b = df.data.digits()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    X_train, T_train, X_test, T_test = a
    counts = np.bincount(T_test, minlength=10) / (
        np.bincount(T_test, minlength=10) + np.bincount(T_train, minlength=10)
    )
    np.testing.assert_allclose(counts, 0.25, atol=0.01)
    train = {x.tobytes() for x in X_train}
    assert sum(x.tobytes() in train for x in X_test) < 5  # only true duplicate images


def test_digits_values_are_sklearn_values_over_16():
    from sklearn.datasets import load_digits

    X_train, T_train, X_test, T_test = df.data.digits()
    images = load_digits().images
    assert np.isin((X_train[0, ..., 0] * 16).astype(int), np.arange(17)).all()
    assert any(np.array_equal(X_train[0, ..., 0] * 16, image) for image in images[:20])


def test_missing_scikit_learn_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r"pip install 'difffn\[examples\]'"):
        df.data.digits()
