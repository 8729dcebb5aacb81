"""Loss functions with MATLAB's definitions (``df.losses.crossentropy``, ``df.losses.mse``, ...).

See `df._scoring._losses` for the conventions (formats, normalization, integer targets).
"""

from ._scoring import binary_crossentropy as binary_crossentropy
from ._scoring import crossentropy as crossentropy
from ._scoring import crossentropy_logits as crossentropy_logits
from ._scoring import huber as huber
from ._scoring import index_crossentropy as index_crossentropy
from ._scoring import l1loss as l1loss
from ._scoring import l2loss as l2loss
from ._scoring import mse as mse

__all__ = [
    "binary_crossentropy",
    "crossentropy",
    "crossentropy_logits",
    "huber",
    "index_crossentropy",
    "l1loss",
    "l2loss",
    "mse",
]
