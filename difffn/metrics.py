"""Metrics for training and testing (``df.metrics.accuracy``, ..., and ``df.metrics.Metric``).

See `df._scoring._metrics` for the definitions and the streaming ``Metric`` interface.
"""

from ._scoring import AUC as AUC
from ._scoring import RMSE as RMSE
from ._scoring import Accuracy as Accuracy
from ._scoring import FScore as FScore
from ._scoring import FunctionMetric as FunctionMetric
from ._scoring import Metric as Metric
from ._scoring import Precision as Precision
from ._scoring import Recall as Recall
from ._scoring import accuracy as accuracy
from ._scoring import auc as auc
from ._scoring import fscore as fscore
from ._scoring import precision as precision
from ._scoring import recall as recall
from ._scoring import rmse as rmse

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
