"""Metrics for training and testing (``df.metrics.accuracy``, ..., and ``df.metrics.Metric``).

See :mod:`difffn._metrics` for the definitions and the streaming ``Metric`` interface.
"""

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
from ._metrics import precision as precision
from ._metrics import recall as recall
from ._metrics import rmse as rmse

__all__ = [
    "AUC",
    "RMSE",
    "Accuracy",
    "FScore",
    "FunctionMetric",
    "Metric",
    "Precision",
    "Recall",
    "accuracy",
    "auc",
    "fscore",
    "precision",
    "recall",
    "rmse",
]
