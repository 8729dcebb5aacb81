r"""Metrics for ``trainnet`` and ``testnet``: accuracy, precision, recall, fscore, auc, rmse.

A metric is *streaming*: ``init(Y)`` makes an empty state from an example prediction,
``update(state, Y, T)`` adds a mini-batch and ``compute(state)`` gives the value, so a
validation set is scored as a whole (precision over all of it, not an average of mini-batch
precisions). All three are pure JAX and run inside ``jax.jit``. ``maximize`` says whether larger
is better (used by ``objective_metric_name`` and ``output_network="best-validation"``).

Conventions (as in `df._scoring._losses`): ``Y`` is formatted or plain
batch-first/classes-last; ``T`` is one-hot (or, for one output channel, 0/1) of ``Y``'s shape, or
integer labels without the ``C`` axis.

* ``accuracy``: percentage of correct classifications (0 to 100, as MATLAB reports it).
* ``precision``, ``recall``, ``fscore`` (F1): macro-averaged over the classes that occur in the
  targets or predictions (0/0 counts as 0); with one output channel, binary (threshold 0.5) and
  for the positive class.
* ``auc``: area under the one-vs-rest ROC curve, macro-averaged over the classes that have
  positives and negatives; scores are binned on a logit scale (2048 bins over (-16, 16)), ties
  within a bin count one half.
* ``rmse``: root of the mean squared error over all elements.
* A callable ``fn(Y, T) -> scalar`` is averaged over mini-batches weighted by their number of
  observations; give it a ``maximize = True`` attribute if larger is better.

Padded sequences: the built-in metrics' ``update`` and ``__call__`` take ``mask=``, a boolean
``(batch, time)`` array (or ``(batch,)``) as the losses take it (``difffn._scoring._losses``): only
the real steps count, each as one observation. A custom ``Metric`` or callable receives the mask
when its ``update`` (callable: its signature) has a ``mask`` parameter.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._core import Data, OptionsError, Output, PyTree, stripdims
from .._core import user_code as _user_code
from ._losses import _float, _layout, _mask_of, _observations, _targets, canonical, check_labels

_AUC_BINS = 2048
_AUC_LOGIT_RANGE = 16.0


class Metric:
    """Base class of streaming metrics (subclass it for a custom metric with its own state).

    Attributes:
      name: the key in the training history (``"accuracy"``).
      title: the column title in the verbose table (``"Accuracy"``).
      maximize: whether larger values are better.
    """

    name: str = "metric"
    title: str = "Metric"
    maximize: bool = False
    class_labels: bool = False  # integer targets are class labels (range-checked on the host)

    def init(self, Y: Data) -> PyTree:
        """An empty state, from an example prediction (shapes only)."""
        raise NotImplementedError

    def update(self, state: PyTree, Y: Data, T: Data) -> PyTree:
        """The state with the mini-batch ``(Y, T)`` added."""
        raise NotImplementedError

    def compute(self, state: PyTree) -> jax.Array:
        """The metric value (a scalar) of the accumulated state."""
        raise NotImplementedError

    def merge(self, state: PyTree, other: object) -> PyTree:
        """Two states combined; the default adds them (counts, sums, histograms)."""
        return jax.tree.map(jnp.add, state, other)

    def __call__(self, Y: Data, T: Data, mask: jax.Array | None = None) -> Output:
        """The metric of one batch (``mask``: padded sequences' mask, see the module notes)."""
        kwargs = {} if mask is None else {"mask": mask}
        return self.compute(self.update(self.init(Y), Y, T, **kwargs))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.__dict__.items()))))


def _weights(who: str, Y, mask, c):
    """Per prediction (``Y`` without its class axis ``c``, flattened) 1 at a real step and 0
    at padding; None without a mask."""
    m = _mask_of(who, Y, mask)
    if m is None:
        return None
    m = jnp.broadcast_to(m, jnp.shape(_float(Y)))
    return (m if c is None else jnp.take(m, 0, axis=c)).reshape(-1).astype(jnp.float32)


def _class_indices(who: str, Y, T):
    """(predicted, true, number of classes, binary flag): flat integer class indices."""
    _, _, c = _layout(Y)
    y = _float(Y)
    t = _targets(who, Y, T)
    binary = c is None or y.shape[c] == 1
    labels = jnp.issubdtype(t.dtype, jnp.integer) and (binary or t.shape != y.shape)
    if binary:
        score = y if c is None else jnp.squeeze(y, c)
        predicted = (score >= 0.5).astype(jnp.int32)
        if not labels:
            t = (t >= 0.5).astype(jnp.int32)
        true = t.reshape(score.shape) if t.size == score.size else t
        k = 2
    else:  # integer targets of the predictions' shape are one-hot, like float ones
        assert c is not None  # not binary: there is a class axis
        predicted = jnp.argmax(y, axis=c)
        true = t if labels else jnp.argmax(t, axis=c)
        k = y.shape[c]
    if labels:
        check_labels(who, true, k)
    if true.shape != predicted.shape:
        raise OptionsError(
            f"{who}: targets of shape {t.shape} do not match predictions of shape {y.shape}. "
            "Fix: one-hot targets of the predictions' shape, or integer labels of that shape "
            "without the class axis."
        )
    return predicted.reshape(-1), true.reshape(-1).astype(jnp.int32), k, binary


class _Confusion(Metric):
    """Metrics computed from a confusion matrix (rows: true class, columns: predicted)."""

    class_labels = True

    def init(self, Y: Data) -> PyTree:
        _, _, c = _layout(Y)
        data = stripdims(Y)
        binary = c is None or data.shape[c] == 1
        k = 2 if binary else data.shape[c]
        return {
            "confusion": jnp.zeros((k, k), jnp.float32),
            "binary": jnp.asarray(binary, jnp.float32),
        }

    def update(self, state: PyTree, Y: Data, T: Data, mask: jax.Array | None = None) -> PyTree:
        predicted, true, k, _ = _class_indices(self.name, Y, T)
        hits = jax.nn.one_hot(predicted, k, dtype=jnp.float32)
        weights = _weights(self.name, Y, mask, _layout(Y)[2])
        if weights is not None:
            hits = hits * weights[:, None]
        counts = jax.nn.one_hot(true, k, dtype=jnp.float32).T @ hits
        return {**state, "confusion": state["confusion"] + counts}

    def _per_class(self, confusion):
        tp = jnp.diag(confusion)
        predicted = jnp.sum(confusion, axis=0)
        actual = jnp.sum(confusion, axis=1)
        precision = jnp.where(predicted > 0, tp / jnp.maximum(predicted, 1), 0.0)
        recall = jnp.where(actual > 0, tp / jnp.maximum(actual, 1), 0.0)
        present = (predicted + actual) > 0
        return precision, recall, present

    def _average(self, state, values, present):
        macro = jnp.sum(jnp.where(present, values, 0.0)) / jnp.maximum(jnp.sum(present), 1)
        return jnp.where(state["binary"] > 0, values[-1], macro)


class Accuracy(_Confusion):
    """Classification accuracy in percent (MATLAB's ``"accuracy"``)."""

    name: str = "accuracy"
    title: str = "Accuracy"
    maximize: bool = True

    def compute(self, state: PyTree) -> jax.Array:
        confusion = state["confusion"]
        return 100.0 * jnp.trace(confusion) / jnp.maximum(jnp.sum(confusion), 1)


class Precision(_Confusion):
    """Precision (macro-averaged over classes; the positive class's when binary)."""

    name: str = "precision"
    title: str = "Precision"
    maximize: bool = True

    def compute(self, state: PyTree) -> jax.Array:
        precision, _, present = self._per_class(state["confusion"])
        return self._average(state, precision, present)


class Recall(_Confusion):
    """Recall (macro-averaged over classes; the positive class's when binary)."""

    name: str = "recall"
    title: str = "Recall"
    maximize: bool = True

    def compute(self, state: PyTree) -> jax.Array:
        _, recall, present = self._per_class(state["confusion"])
        return self._average(state, recall, present)


class FScore(_Confusion):
    """F1 score (macro-averaged over classes; the positive class's when binary)."""

    name: str = "fscore"
    title: str = "FScore"
    maximize: bool = True

    def compute(self, state: PyTree) -> jax.Array:
        precision, recall, present = self._per_class(state["confusion"])
        total = precision + recall
        f1 = jnp.where(total > 0, 2 * precision * recall / jnp.where(total > 0, total, 1), 0.0)
        return self._average(state, f1, present)


class AUC(Metric):
    """Area under the ROC curve (macro-averaged over classes with both kinds of targets)."""

    name: str = "auc"
    title: str = "AUC"
    maximize: bool = True
    class_labels = True

    def init(self, Y: Data) -> PyTree:
        _, _, c = _layout(Y)
        data = stripdims(Y)
        k = 1 if c is None or data.shape[c] == 1 else data.shape[c]
        zeros = jnp.zeros((k, _AUC_BINS), jnp.float32)
        return {"positive": zeros, "negative": zeros}

    def update(self, state: PyTree, Y: Data, T: Data, mask: jax.Array | None = None) -> PyTree:
        _, _, c = _layout(Y)
        y = _float(Y)
        t = _targets(self.name, Y, T)
        k = state["positive"].shape[0]
        weights = _weights(self.name, Y, mask, c)
        if k == 1:
            scores = (y if c is None else jnp.squeeze(y, c)).reshape(-1, 1)
            if not jnp.issubdtype(t.dtype, jnp.integer):
                t = t >= 0.5
            positive = t.reshape(-1, 1).astype(jnp.float32)
        else:
            assert c is not None  # init found k > 1 classes on the class axis
            scores = jnp.moveaxis(y, c, -1).reshape(-1, k)
            if jnp.issubdtype(t.dtype, jnp.integer) and t.shape != y.shape:
                check_labels(self.name, t, k)
                positive = jax.nn.one_hot(t.reshape(-1), k, dtype=jnp.float32)
            else:
                positive = (jnp.moveaxis(t, c, -1).reshape(-1, k) >= 0.5).astype(jnp.float32)
        p = jnp.clip(scores, 1e-12, 1 - 1e-7)
        logit = jnp.log(p) - jnp.log1p(-p)
        scale = _AUC_BINS / (2 * _AUC_LOGIT_RANGE)
        bins = jnp.clip(
            jnp.floor((logit + _AUC_LOGIT_RANGE) * scale).astype(jnp.int32), 0, _AUC_BINS - 1
        )
        classes = jnp.broadcast_to(jnp.arange(k), bins.shape)
        negative = 1.0 - positive
        if weights is not None:
            positive, negative = positive * weights[:, None], negative * weights[:, None]
        pos = state["positive"].at[classes, bins].add(positive)
        neg = state["negative"].at[classes, bins].add(negative)
        return {"positive": pos, "negative": neg}

    def compute(self, state: PyTree) -> jax.Array:
        pos, neg = state["positive"], state["negative"]
        below = jnp.cumsum(neg, axis=1) - neg  # negatives in lower bins
        wins = jnp.sum(pos * (below + 0.5 * neg), axis=1)
        n_pos, n_neg = jnp.sum(pos, axis=1), jnp.sum(neg, axis=1)
        valid = (n_pos > 0) & (n_neg > 0)
        per_class = jnp.where(valid, wins / jnp.maximum(n_pos * n_neg, 1), 0.0)
        return jnp.sum(per_class) / jnp.maximum(jnp.sum(valid), 1)


class RMSE(Metric):
    """Root-mean-square error over every predicted value (padded time steps left out)."""

    name: str = "rmse"
    title: str = "RMSE"
    maximize: bool = False

    def init(self, Y: Data) -> PyTree:
        return {"sum": jnp.zeros((), jnp.float32), "count": jnp.zeros((), jnp.float32)}

    def update(self, state: PyTree, Y: Data, T: Data, mask: jax.Array | None = None) -> PyTree:
        y = _float(Y)
        t = _targets(self.name, Y, T).astype(y.dtype)
        if t.shape != y.shape:
            raise OptionsError(
                f"rmse: targets of shape {t.shape} do not match predictions of shape {y.shape}."
            )
        squares, count = jnp.square(y - t), y.size
        m = _mask_of(self.name, Y, mask)
        if m is not None:
            squares = jnp.where(m, squares, 0)
            count = jnp.sum(m) * (y.size // m.size)
        return {
            "sum": state["sum"] + jnp.sum(squares).astype(jnp.float32),
            "count": state["count"] + count,
        }

    def compute(self, state: PyTree) -> jax.Array:
        return jnp.sqrt(state["sum"] / jnp.maximum(state["count"], 1))


class FunctionMetric(Metric):
    """A callable ``fn(Y, T) -> scalar``, averaged over mini-batches weighted by observations.

    Multi-output losses used as metrics receive all outputs and targets
    (``fn(Y1, ..., T1, ...)``); pass them as tuples to ``update``.
    """

    def __init__(
        self, fn: Callable[..., Any], *, name: str | None = None, maximize: bool | None = None
    ) -> None:
        if not callable(fn):
            raise OptionsError(
                f"FunctionMetric: fn must be a callable fn(Y, T) returning a scalar; got "
                f"{type(fn).__name__} {fn!r}. Fix: e.g. FunctionMetric(lambda Y, T: "
                "jnp.mean(jnp.abs(df.stripdims(Y) - T)), name='mae')."
            )
        self.fn = fn
        self.name: str = name or getattr(fn, "__name__", type(fn).__name__)
        self.title: str = self.name
        self.maximize: bool = bool(getattr(fn, "maximize", False) if maximize is None else maximize)

    def init(self, Y: Data) -> PyTree:
        return {"sum": jnp.zeros((), jnp.float32), "count": jnp.zeros((), jnp.float32)}

    def update(
        self,
        state: PyTree,
        Y: Data | tuple[Data, ...],
        T: Data | tuple[Data, ...],
        mask: jax.Array | None = None,
    ) -> PyTree:
        ys = Y if isinstance(Y, tuple) else (Y,)
        ts = T if isinstance(T, tuple) else (T,)
        kwargs = {}
        if mask is None:
            n = _observations(ys[0])
        else:
            if not takes_mask(self.fn):
                raise OptionsError(
                    f"metric {self.name!r} is scored on padded sequences, but {self.name} takes "
                    "no mask, so padded steps would count. Fix: give it a parameter mask=None "
                    "(a boolean (batch, time) array, True at real steps; e.g. pass it on to "
                    "df.losses functions), or score sequence-to-one outputs."
                )
            kwargs["mask"] = mask
            m = _mask_of(self.name, ys[0], mask)
            assert m is not None  # a mask was given
            n = jnp.sum(m)
        value = _user_code.call(
            self.fn,
            *ys,
            *ts,
            what=f"metric {self.name!r}",
            call_fix="a metric takes the network outputs, then the targets, fn(Y1, ..., T1, "
            "...), and returns a scalar.",
            error=OptionsError,
            **kwargs,
        )
        if value is None:
            raise OptionsError(
                f"metric {self.name!r} returned None; a metric must return a scalar. Fix: add "
                "the missing `return`."
            )
        value = jnp.asarray(value)
        if value.ndim != 0:
            raise OptionsError(
                f"metric {self.name!r} returned an array of shape {value.shape}; a metric must "
                "return a scalar."
            )
        return {
            "sum": state["sum"] + n * value.astype(jnp.float32),
            "count": state["count"] + n,
        }

    def compute(self, state: PyTree) -> jax.Array:
        return state["sum"] / jnp.maximum(state["count"], 1)


METRICS = {
    "accuracy": Accuracy,
    "precision": Precision,
    "recall": Recall,
    "fscore": FScore,
    "auc": AUC,
    "rmse": RMSE,
}


def takes_mask(fn) -> bool:
    """Whether a callable (a loss, a metric function or a ``Metric.update``) has a ``mask``
    parameter (or ``**kwargs``)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "mask" or p.kind is p.VAR_KEYWORD for p in parameters)


def get_metric(spec, *, who: str = "trainnet") -> Metric:
    """A ``Metric`` from a name, a ``Metric`` instance or a callable ``fn(Y, T)``."""
    if isinstance(spec, Metric):
        return spec
    if isinstance(spec, str):
        cls = METRICS.get(canonical(spec).replace("-", ""))
        if cls is None:
            raise OptionsError(
                f"{who}: unknown metric {spec!r}; the built-in metrics are {list(METRICS)}. Fix: "
                "use one of those names, or pass a callable fn(Y, T) returning a scalar, or a "
                "df.metrics.Metric."
            )
        return cls()
    if isinstance(spec, type):
        raise OptionsError(
            f"{who}: the metric {spec.__name__} is a class. Fix: pass an instance, "
            f"{spec.__name__}(), a name such as 'accuracy', or a function fn(Y, T)."
        )
    if callable(spec):
        return FunctionMetric(spec)
    raise OptionsError(
        f"{who}: a metric must be a name ({list(METRICS)}), a callable fn(Y, T) or a "
        f"df.metrics.Metric; got {type(spec).__name__}."
    )


def accuracy(Y: Data, T: Data) -> jax.Array:
    """Percentage of correct classifications (0 to 100).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> Y = jnp.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
      >>> float(df.metrics.accuracy(Y, jnp.array([0, 1, 1, 1])))
      75.0
    """
    return Accuracy()(Y, T)


def precision(Y: Data, T: Data) -> jax.Array:
    """Macro-averaged precision (binary, positive class, for one output channel)."""
    return Precision()(Y, T)


def recall(Y: Data, T: Data) -> jax.Array:
    """Macro-averaged recall (binary, positive class, for one output channel)."""
    return Recall()(Y, T)


def fscore(Y: Data, T: Data) -> jax.Array:
    """Macro-averaged F1 score (binary, positive class, for one output channel)."""
    return FScore()(Y, T)


def auc(Y: Data, T: Data) -> jax.Array:
    """Area under the ROC curve, one-vs-rest, macro-averaged (binned, see the module notes).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> float(df.metrics.auc(jnp.array([[0.1], [0.4], [0.35], [0.8]]), jnp.array([0, 0, 1, 1])))
      0.75
    """
    return AUC()(Y, T)


def rmse(Y: Data, T: Data) -> jax.Array:
    """Root mean squared error over all elements.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> float(df.metrics.rmse(jnp.array([[3.0, 4.0]]), jnp.zeros((1, 2))))
      3.5355...
    """
    return RMSE()(Y, T)
