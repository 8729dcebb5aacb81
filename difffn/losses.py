"""Loss functions with MATLAB's definitions (``df.losses.crossentropy``, ``df.losses.mse``, ...).

See :mod:`difffn._losses` for the conventions (formats, normalization, integer targets).
"""

from ._losses import binary_crossentropy as binary_crossentropy
from ._losses import crossentropy as crossentropy
from ._losses import huber as huber
from ._losses import index_crossentropy as index_crossentropy
from ._losses import l1loss as l1loss
from ._losses import l2loss as l2loss
from ._losses import mse as mse

__all__ = [
    "binary_crossentropy",
    "crossentropy",
    "huber",
    "index_crossentropy",
    "l1loss",
    "l2loss",
    "mse",
]
