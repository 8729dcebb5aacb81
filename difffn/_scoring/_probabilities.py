"""The logits guard: ``"crossentropy"`` expects probabilities, as MATLAB's does.

A network that ends in logits (no ``Softmax``) trained with ``"crossentropy"`` still trains: the
loss falls (``log`` of values bounded below by ``eps``) while accuracy stays at chance.
``check_probabilities`` looks at the network's output on the first batch and names the two fixes:
a ``Softmax`` layer, or the logits loss (``"crossentropy-logits"``).
"""

from __future__ import annotations

import numpy as np

from .._core import OptionsError, stripdims
from ._losses import _layout, crossentropy, index_crossentropy

_TOLERANCE = 1e-3  # float32 softmax outputs sum to one within far less


def needs_probabilities(loss_fn) -> bool:
    """Whether the loss reads its predictions as probabilities over ``C``."""
    return loss_fn in (crossentropy, index_crossentropy)


def check_probabilities(who: str, loss_name: str, Y) -> None:
    """Raise when ``Y`` (the network's output on a first batch) is not probabilities over ``C``.

    Args:
      who: the caller, for the message.
      loss_name: the loss as the user named it.
      Y: the network's output (formatted, or plain batch-first with classes last).

    Raises:
      OptionsError: values outside [0, 1], or (with several classes) not summing to one over
        ``C``; the message offers a ``Softmax`` layer or ``"crossentropy-logits"``.
    """
    data = np.asarray(stripdims(Y), dtype=np.float64)
    if data.size == 0 or not np.all(np.isfinite(data)):
        return  # NaN and inf are the non-finite check's to report
    _, _, c = _layout(Y)
    low, high = float(data.min()), float(data.max())
    problem = None
    if low < -_TOLERANCE or high > 1 + _TOLERANCE:
        problem = f"values in [{low:.3g}, {high:.3g}], outside [0, 1]"
    elif c is not None and data.shape[c] > 1:
        sums = data.sum(axis=c)
        worst = float(np.abs(sums - 1).max())
        if worst > _TOLERANCE:
            problem = f"sums over the class axis 'C' from {sums.min():.3g} to {sums.max():.3g}"
    if problem is None:
        return
    raise OptionsError(
        f"{who}: the loss {loss_name!r} expects probabilities (as MATLAB's crossentropy), but "
        f"the network's output on the first batch has {problem}: it looks like logits. "
        "Trained on logits, the loss falls while the accuracy stays at chance. Fix: end the "
        "network with df.layers.Softmax(), or train with loss='crossentropy-logits' (the "
        "softmax inside the loss: df.losses.crossentropy(Y, T, from_logits=True))."
    )
