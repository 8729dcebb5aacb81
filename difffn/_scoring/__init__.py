"""Losses and metrics (the functions behind `df.losses` and `df.metrics`).

MATLAB's loss functions on formatted or plain arrays, and the streaming `Metric` interface with the
built-in metrics.

This file is the package's internal API: the floors above import these names from here, and
nothing else from the package's modules (tests/test_architecture.py holds it).
"""

from ._losses import CLASS_LOSSES as CLASS_LOSSES
from ._losses import LOSSES as LOSSES
from ._losses import _layout as prediction_layout
from ._losses import binary_crossentropy as binary_crossentropy
from ._losses import canonical as canonical
from ._losses import check_class_targets as check_class_targets
from ._losses import check_labels as check_labels
from ._losses import crossentropy as crossentropy
from ._losses import crossentropy_logits as crossentropy_logits
from ._losses import get_loss as get_loss
from ._losses import huber as huber
from ._losses import index_crossentropy as index_crossentropy
from ._losses import l1loss as l1loss
from ._losses import l2loss as l2loss
from ._losses import loss_name as loss_name
from ._losses import mse as mse
from ._metrics import AUC as AUC
from ._metrics import RMSE as RMSE
from ._metrics import Accuracy as Accuracy
from ._metrics import FScore as FScore
from ._metrics import FunctionMetric as FunctionMetric
from ._metrics import Metric as Metric
from ._metrics import Precision as Precision
from ._metrics import Recall as Recall
from ._metrics import accuracy as accuracy
from ._metrics import auc as auc
from ._metrics import fscore as fscore
from ._metrics import get_metric as get_metric
from ._metrics import precision as precision
from ._metrics import recall as recall
from ._metrics import rmse as rmse
from ._metrics import takes_mask as takes_mask
from ._probabilities import check_probabilities as check_probabilities
from ._probabilities import needs_probabilities as needs_probabilities

__all__ = [
    "AUC",
    "Accuracy",
    "CLASS_LOSSES",
    "FScore",
    "FunctionMetric",
    "LOSSES",
    "Metric",
    "Precision",
    "RMSE",
    "Recall",
    "accuracy",
    "auc",
    "binary_crossentropy",
    "canonical",
    "check_class_targets",
    "check_labels",
    "check_probabilities",
    "crossentropy",
    "crossentropy_logits",
    "fscore",
    "get_loss",
    "get_metric",
    "huber",
    "index_crossentropy",
    "l1loss",
    "l2loss",
    "loss_name",
    "mse",
    "needs_probabilities",
    "precision",
    "prediction_layout",
    "recall",
    "rmse",
    "takes_mask",
]
