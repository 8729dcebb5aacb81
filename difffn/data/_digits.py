"""scikit-learn's bundled 8x8 handwritten digits (1797 images, no download), split for training.

Images are float32 ``(N, 8, 8, 1)`` arrays laid out ``"BSSC"`` (NHWC) with values in [0, 1]
(scikit-learn's 0..16 divided by 16); labels are int32 digits 0-9. The split is fixed and
stratified: for each digit, a quarter of its images (rounded) chosen by a seeded permutation go
to the test set. Both sets keep scikit-learn's order. Plain numpy arrays: a network's
``ImageInput((8, 8, 1))`` gives them their format.
"""

from __future__ import annotations

import numpy as np

_TEST_FRACTION = 0.25
_SEED = 0


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits data set as ``(X_train, T_train, X_test, T_test)``.

    Returns:
      ``X_train`` float32 ``(1347, 8, 8, 1)``, ``T_train`` int32 ``(1347,)``, ``X_test`` float32
      ``(450, 8, 8, 1)``, ``T_test`` int32 ``(450,)``; images in [0, 1] with format ``"BSSC"``.

    Raises:
      ImportError: scikit-learn is not installed (it ships the data); the message says which
        extra to install.

    Examples:
      >>> import difffn as df
      >>> X_train, T_train, X_test, T_test = df.data.digits()
      >>> X_train.shape, X_train.dtype, T_test.shape, int(T_train.max())
      ((1347, 8, 8, 1), dtype('float32'), (450,), 9)
    """
    try:
        from sklearn.datasets import load_digits
        from sklearn.utils import Bunch
    except ImportError as error:
        raise ImportError(
            "df.data.digits() reads the digits data set that ships with scikit-learn, which is "
            "not installed. Fix: pip install 'difffn[examples]' (or pip install scikit-learn)."
        ) from error
    bunch = load_digits()
    assert isinstance(bunch, Bunch)  # typed Bunch | tuple; a tuple only with return_X_y
    images = (np.asarray(bunch.images, np.float32) / 16.0)[..., None]
    labels = np.asarray(bunch.target, np.int32)
    rng = np.random.default_rng(_SEED)
    test = np.zeros(len(labels), bool)
    for digit in range(10):
        members = np.flatnonzero(labels == digit)
        chosen = rng.permutation(members)[: int(round(_TEST_FRACTION * len(members)))]
        test[chosen] = True
    return images[~test], labels[~test], images[test], labels[test]
