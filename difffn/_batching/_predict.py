"""Prediction and testing in mini-batches: ``minibatchpredict``, ``testnet``, ``scores2label``.

``minibatchpredict`` runs ``net.predict`` (compiled and cached per input signature) on
mini-batches. When there is more than one mini-batch, the last partial one is padded to the
full size and the padding is cut from the outputs, so one compiled trace serves every batch.
Dispatch is asynchronous: the host queues every batch before anything waits. Lists of sequences
of different lengths go to ``_sequence_predict``.

With ``execution_environment="multi-device"`` or ``"multi-host"`` the network is replicated over
the mesh (``_sharding``) and each batch is split over it, padded to a multiple of the mesh's
``"data"`` size (the padding is cut from the outputs); the outputs come back whole, in every
process. In a multi-host run every process passes the same arrays, or (``testnet``) an
iterable of its own share of every batch, whose shares are joined in process order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._core import Data, FormattedArray, OptionsError, dlarray, stripdims
from .._core import batches as _batches
from .._devices import ENVIRONMENTS, Placement
from .._network import Network
from .._scoring import (
    CLASS_LOSSES,
    LOSSES,
    FunctionMetric,
    canonical,
    check_class_targets,
    get_metric,
)
from .._scoring import prediction_layout as _prediction_layout
from . import _sequence_predict
from ._sequence_source import has_sequences, metric_update
from ._sequences import SequenceOptions
from ._sources import IterableSource, arrays_of, gather_batch


def _opening(
    who: str,
    net,
    mini_batch_size,
    sequence_length,
    sequence_padding_value,
    sequence_padding_direction,
    sequence_bucketing,
) -> tuple[int, SequenceOptions]:
    """What ``minibatchpredict`` and ``testnet`` check first, in one place: the network, the
    mini-batch size and the sequence options; returns the size and the options."""
    if not isinstance(net, Network):
        raise OptionsError(f"{who}: net must be a df.Network; got {type(net).__name__}.")
    bad = isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int)
    if bad or mini_batch_size < 1:
        raise OptionsError(
            f"{who}: mini_batch_size must be a positive int; got {mini_batch_size!r}. Fix: e.g. "
            "mini_batch_size=128."
        )
    options = SequenceOptions.checked(
        who,
        sequence_length,
        sequence_padding_value,
        sequence_padding_direction,
        sequence_bucketing,
    )
    return mini_batch_size, options


def minibatchpredict(
    net: Network,
    *X: Data | Sequence[Any],
    mini_batch_size: int = 128,
    outputs: Any = None,
    acceleration: str = "auto",
    sequence_length: str | int = "longest",
    sequence_padding_value: float = 0.0,
    sequence_padding_direction: str = "right",
    sequence_bucketing: str | int = "power-of-two",
    uniform_output: bool = True,
    execution_environment: str = "auto",
) -> Any:
    """Predict in mini-batches (MATLAB ``minibatchpredict``).

    Args:
      net: an initialized ``df.Network``.
      *X: one array per network input (plain arrays take the input layer's format; the batch
        axis is the ``B`` label), or for an input with ``B`` and ``T`` a list of sequences of
        different lengths (one array per observation, e.g. ``(T_i, C)``).
      mini_batch_size: observations per batch (128).
      outputs: names of the outputs to return (default: the network outputs).
      acceleration: passed to ``net.predict``.
      sequence_length: how mini-batches of sequences are padded, truncated or split, as the
        ``df.TrainingOptions`` of the same name (padding is masked).
      sequence_padding_value: as the ``df.TrainingOptions`` of the same name.
      sequence_padding_direction: as the ``df.TrainingOptions`` of the same name.
      sequence_bucketing: as the ``df.TrainingOptions`` of the same name.
      uniform_output: for sequences, outputs with time steps padded to the longest sequence
        and stacked (True, MATLAB's default; the padding holds ``sequence_padding_value``), or
        a list with one array per sequence, padding removed (False).
      execution_environment: ``"auto"`` (default), ``"cpu"``, ``"gpu"``, ``"multi-device"``
        or ``"multi-host"`` (every process calls it with the same arrays and gets all the
        outputs), as in ``df.TrainingOptions``.

    Returns:
      The outputs for all observations, concatenated along their batch axis (one array, or a
      tuple for several outputs), formatted as ``net.predict`` formats them.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> net = df.Network([df.layers.FeatureInput(3, name="in"), df.layers.Softmax(name="sm")])
      >>> net = net.initialize(key=jax.random.key(0))
      >>> scores = df.minibatchpredict(net, jnp.zeros((300, 3)), mini_batch_size=128)
      >>> scores.format, scores.shape
      ('BC', (300, 3))
    """
    who = "minibatchpredict"
    size, sequence_options = _opening(
        who,
        net,
        mini_batch_size,
        sequence_length,
        sequence_padding_value,
        sequence_padding_direction,
        sequence_bucketing,
    )
    if has_sequences(X, net):
        _single_process_sequences(who, execution_environment)
        merged = _sequence_predict.predict(
            net,
            X,
            who=who,
            size=size,
            outputs=outputs,
            acceleration=acceleration,
            options=sequence_options,
            uniform_output=uniform_output,
        )
        return merged[0] if len(merged) == 1 else merged
    X = arrays_of(
        who,
        X[0] if len(X) == 1 and isinstance(X[0], list) else X,
        "X",
        len(net.input_names),
        net.input_names,
    )
    known = net.input_layouts
    axes = [
        _batches.batch_axis(x, lo.format if lo else None, what=f"{who}: input {k}")
        for k, (x, lo) in enumerate(zip(X, known, strict=True))
    ]
    counts = {_batches.count(x, a) for x, a in zip(X, axes, strict=True)}
    if len(counts) != 1:
        raise OptionsError(f"{who}: the inputs have different numbers of observations {counts}.")
    n = counts.pop()
    if n == 0:
        raise OptionsError(
            f"{who}: the inputs have no observations (X[0] has shape "
            f"{np.shape(stripdims(X[0]))}, 0 along its batch axis). Fix: pass the data."
        )
    placement = _placement(who, execution_environment)
    if placement is not None:
        net = placement.put(net)
    parts = 1 if placement is None else placement.data_size
    results = []
    for start in range(0, n, size):
        stop = min(start + size, n)
        xs = [_batches.slice_host(x, start, stop, a) for x, a in zip(X, axes, strict=True)]
        padded = size if n > size else stop - start
        padded = -(-padded // parts) * parts  # a whole number of rows per device
        if stop - start < padded:
            xs = [_batches.pad(x, padded, a) for x, a in zip(xs, axes, strict=True)]
        if placement is not None:
            xs = placement.put_inputs(xs, axes)
        ys = net.predict(*xs, outputs=outputs, acceleration=acceleration)
        ys = ys if isinstance(ys, tuple) else (ys,)
        if placement is not None:
            ys = placement.put(ys)  # whole, in every process
        if stop - start < padded:
            ys = tuple(_batches.slice_host(y, 0, stop - start, _output_axis(y)) for y in ys)
        results.append(ys)
    merged = tuple(
        _batches.concatenate([r[i] for r in results], _output_axis(results[0][i]))
        for i in range(len(results[0]))
    )
    return merged[0] if len(merged) == 1 else merged


def _placement(who: str, environment: str) -> Placement | None:
    """The devices of a prediction (None: JAX's default device, as ``net.predict`` has it)."""
    if environment not in ENVIRONMENTS:
        listed = ", ".join(repr(e) for e in ENVIRONMENTS)
        raise OptionsError(
            f"{who}: execution_environment must be one of {listed}; got {environment!r}."
        )
    return None if environment == "auto" else Placement(environment, who=who)


def _output_axis(y) -> int:
    _, b, _ = _prediction_layout(y)
    return 0 if b is None else b


def _metric_for(spec, who):
    if isinstance(spec, str) and canonical(spec) in LOSSES:
        return FunctionMetric(LOSSES[canonical(spec)], name=canonical(spec), maximize=False)
    return get_metric(spec, who=who)


def _single_process_sequences(who: str, environment) -> None:
    if environment in ("multi-device", "multi-host"):
        raise OptionsError(
            f"{who}: lists of sequences of different lengths run on one device; got "
            f"execution_environment={environment!r}. Fix: pad them to one length "
            "(df.padsequences) and pass the padded array, or use execution_environment='auto'."
        )


def testnet(
    net: Network,
    *args: Any,
    mini_batch_size: int = 128,
    execution_environment: str = "auto",
    sequence_length: str | int = "longest",
    sequence_padding_value: float = 0.0,
    sequence_padding_direction: str = "right",
    sequence_bucketing: str | int = "power-of-two",
) -> Any:
    """Evaluate metrics of a network on test data (MATLAB ``testnet``).

    Two forms: ``testnet(net, X, T, metrics)`` and ``testnet(net, data, metrics)`` with an
    iterable of ``(inputs..., targets...)`` batches.

    Args:
      net: an initialized ``df.Network``.
      X: an array or a tuple of arrays (one per network input); for an input with ``B`` and
        ``T``, a list of sequences of different lengths (as ``trainnet`` takes them).
      T: the targets (integer labels or one-hot for classification); for sequences, one per
        sequence, or a list with one array per sequence and time step. Padded steps are not
        scored.
      metrics: one name or a list: metrics (``"accuracy"`` (in percent), ``"precision"``,
        ``"recall"``, ``"fscore"``, ``"auc"``, ``"rmse"``), losses (``"crossentropy"``,
        ``"mse"``, ...), callables ``fn(Y, T)`` or ``df.metrics.Metric`` objects.
      mini_batch_size: observations per prediction batch (128).
      execution_environment: as in [`minibatchpredict`][difffn.minibatchpredict]; in a multi-host
        run every process
        passes the same ``X`` and ``T``, or an iterable of its own share of every batch (the
        processes' shares, in process order, make each batch), and every process gets the
        metrics of all the data.
      sequence_length: for sequences, as ``minibatchpredict``'s.
      sequence_padding_value: as ``minibatchpredict``'s.
      sequence_padding_direction: as ``minibatchpredict``'s.
      sequence_bucketing: as ``minibatchpredict``'s.

    Returns:
      A float for one metric, or a dict from metric name to float for a list. Metrics use the
      first network output and the first target.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> net = df.Network([df.layers.FeatureInput(2, name="in"), df.layers.Softmax(name="sm")])
      >>> net = net.initialize(key=jax.random.key(0))
      >>> X = jnp.array([[2.0, 0.0], [0.0, 1.0], [1.0, 3.0]])
      >>> df.testnet(net, X, jnp.array([0, 1, 0]), "accuracy")
      66.66...
    """
    who = "testnet"
    size, sequence_options = _opening(
        who,
        net,
        mini_batch_size,
        sequence_length,
        sequence_padding_value,
        sequence_padding_direction,
        sequence_bucketing,
    )
    if len(args) == 3 and has_sequences(args[0], net):
        _single_process_sequences(who, execution_environment)
        X, T, metrics = args
        batches = [
            _sequence_predict.for_scoring(net, X, T, who=who, size=size, options=sequence_options)
        ]
    elif len(args) == 3:
        X, T, metrics = args
        xs = arrays_of(who, X, "X", len(net.input_names), net.input_names)
        ts = arrays_of(who, T, "T")
        outputs = minibatchpredict(
            net, *xs, mini_batch_size=size, execution_environment=execution_environment
        )
        ys = outputs if isinstance(outputs, tuple) else (outputs,)
        batches = [(_on_host(ys, execution_environment), ts, None)]
    elif len(args) == 2:
        data, metrics = args
        batches = []
        source = IterableSource(who, data, net, role="test")
        placement = _placement(who, execution_environment)
        if placement is not None:
            net = placement.put(net)
        for xs, ts in source.in_order():
            if placement is not None and placement.multi_host:
                formats = [lo.format if lo else None for lo in net.input_layouts]
                xs = tuple(gather_batch(x, f) for x, f in zip(xs, formats, strict=True))
                ts = tuple(gather_batch(t, None) for t in ts)
            if placement is not None:
                ys = minibatchpredict(
                    net, *xs, mini_batch_size=size, execution_environment=execution_environment
                )
            else:
                ys = net.predict(*xs)
            ys = ys if isinstance(ys, tuple) else (ys,)
            batches.append((_on_host(ys, execution_environment), ts, None))
        if not batches:
            raise OptionsError(f"{who}: the data iterable is empty.")
    else:
        raise OptionsError(
            f"{who} takes (net, X, T, metrics) or (net, data, metrics); got {len(args) + 1} "
            "positional arguments."
        )
    single = isinstance(metrics, str) or not isinstance(metrics, (list, tuple))
    specs = [metrics] if single else list(metrics)
    results = {}
    for spec in specs:
        metric = _metric_for(spec, who)
        if metric.class_labels or getattr(metric, "fn", None) in CLASS_LOSSES:
            for ys, ts, _ in batches:
                check_class_targets(who, ys[0], ts[0])
        state = None
        for ys, ts, mask in batches:
            if isinstance(metric, FunctionMetric):
                kwargs = {} if mask is None else {"mask": mask}
                update = metric.update(metric.init(ys[0]), ys, tuple(ts), **kwargs)
            else:
                update = metric_update(metric, ys[0], ts[0], mask)
            state = update if state is None else metric.merge(state, update)
        results[metric.name] = float(metric.compute(state))
    return next(iter(results.values())) if single else results


testnet.__dict__["__test__"] = False  # not a pytest test, despite its name


def _on_host(ys, environment: str) -> tuple:
    """Outputs of a multi-host prediction (whole in every process) as host arrays, so the
    metrics compute in each process on its own."""
    if environment != "multi-host":
        return ys
    return tuple(
        dlarray(np.asarray(y.data), y.format) if isinstance(y, FormattedArray) else np.asarray(y)
        for y in ys
    )


def scores2label(
    scores: Data, class_names: Any = None, *, mode: str = "single-label", threshold: float = 0.5
) -> Any:
    """Labels from classification scores (MATLAB ``scores2label``).

    Args:
      scores: probabilities with a class axis (the ``C`` label; last axis of a plain array).
      class_names: optional names, one per class; labels are then names instead of indices.
      mode: ``"single-label"`` (the highest score) or ``"multilabel"`` (every class whose score
        reaches ``threshold``: a boolean array like ``scores``).
      threshold: for ``"multilabel"`` (0.5).

    Returns:
      Integer class indices (numpy, the scores' shape without the class axis), or the names
      at those indices; for ``"multilabel"``, a boolean mask.

    Examples:
      >>> import numpy as np
      >>> import difffn as df
      >>> df.scores2label(np.array([[0.1, 0.9], [0.8, 0.2]]), ["cat", "dog"])
      array(['dog', 'cat'], dtype='<U3')
    """
    _, _, c = _prediction_layout(scores)
    data = np.asarray(stripdims(scores) if isinstance(scores, FormattedArray) else scores)
    if c is None:
        raise OptionsError(
            f"scores2label: scores of shape {data.shape} have no class axis. Fix: pass scores "
            "with one column per class."
        )
    if mode == "multilabel":
        return data >= threshold
    if mode != "single-label":
        raise OptionsError(
            f"scores2label: mode must be 'single-label' or 'multilabel'; got {mode!r}."
        )
    index = np.argmax(data, axis=c).astype(np.int32)
    if class_names is None:
        return index
    names = np.asarray(class_names)
    if names.ndim != 1 or names.shape[0] != data.shape[c]:
        raise OptionsError(
            f"scores2label: {names.size} class names for {data.shape[c]} classes. Fix: one name "
            "per class, in class order."
        )
    return names[index]
