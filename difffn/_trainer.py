"""``trainnet``: MATLAB's training loop, as one jitted step per iteration.

The step (forward, loss, backward, clipping, solver update, state update) is one ``jax.jit``
function with the parameters, the rest of the network and the optimizer state donated, so each
iteration updates buffers in place. Array data is put on the device once; each step gathers its
mini-batch from the epoch's order inside the compiled function. The host only dispatches steps;
it waits for the device only to log (verbose rows, validation, ``output_fcn``, checkpoints) and
at the end. Networks with layers that must run eagerly (``acceleratable = False``) train
un-jitted at the top level (the network compiles its own segments) with a jitted update.

All progress lives in a :class:`TrainingState` (network leaves, optimizer state, iteration,
epoch, position in the epoch, PRNG key, the epoch's data order, best-validation bookkeeping,
history), so a run can be checkpointed and resumed exactly. Randomness comes only from the
``key`` argument: the shuffles, the per-iteration keys (``fold_in(key, iteration)``, e.g. for
dropout) and the initialization of an uninitialized network.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import _batches, _checkpoint, _progress
from ._errors import OptionsError, SerializationError
from ._factors import L2, LEARN_RATE, leaf_factors
from ._format import FormattedArray, Layout, stripdims
from ._losses import get_loss, loss_name
from ._metrics import Metric
from ._network import Network
from ._options import TrainingOptions
from ._parameters import learnable_mask
from ._schedules import LearnRateSchedule
from ._serialization import restore_network
from ._sharding import Placement
from ._solvers import training_transform

_STATISTICS_BATCHES = 8  # batches of an iterable used to compute input normalization statistics

# -- history and info ----------------------------------------------------------------------------


class History:
    """Rows of a training or validation history, with columns by name.

    ``history["loss"]`` is a numpy array of one column; ``history.rows()`` gives dicts;
    ``len(history)`` counts rows; ``history.columns`` names the columns.
    """

    def __init__(self, columns, rows=()):
        self.columns = tuple(columns)
        self._rows = [dict(r) for r in rows]

    def __len__(self):
        return len(self._rows)

    def __getitem__(self, column: str) -> np.ndarray:
        if column not in self.columns:
            raise KeyError(f"{column!r} is not a column; the columns are {list(self.columns)}.")
        values = [r.get(column) for r in self._rows]
        if column in ("iteration", "epoch"):
            return np.asarray(values, dtype=np.int64)
        return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)

    def rows(self) -> list[dict]:
        return [dict(r) for r in self._rows]

    def __repr__(self):
        return f"History({len(self)} rows, columns={list(self.columns)})"


@dataclasses.dataclass(frozen=True)
class TrainingInfo:
    """What ``trainnet`` returns besides the network (MATLAB's ``TrainingInfo``).

    Attributes:
      training_history: one row per iteration: iteration, epoch, time_elapsed, learn_rate,
        loss and the training metrics.
      validation_history: one row per validation: iteration, epoch, time_elapsed, loss and the
        validation metrics (empty without validation data).
      stop_reason: why training stopped (``"Max epochs completed"``, ``"Stopped by validation
        patience"``, ``"Stopped by output_fcn"``, ``"Training loss is NaN"``).
      output_network_iteration: the iteration of the returned network.
      plot_path: the training-progress PNG, when ``plots="training-progress"``.
      elapsed: training time in seconds.
    """

    training_history: History
    validation_history: History
    stop_reason: str
    output_network_iteration: int
    plot_path: str | None
    elapsed: float


# -- the training state -------------------------------------------------------------------------


@dataclasses.dataclass
class TrainingState:
    """Everything a run needs to continue exactly where it is (checkpoint and resume).

    Attributes:
      treedef: the network's pytree structure.
      learnable_index: positions of the learnable leaves among the network's leaves.
      learnables: the learnable leaves (what the solver updates).
      others: the other leaves (state and constants), in leaf order.
      opt_state: the optax state of the solver chain.
      key: the base PRNG key of the steps (iteration ``i`` uses ``fold_in(key, i)``).
      shuffle_seed: integers that seed each epoch's data order.
      iteration: completed iterations.
      epoch: the current epoch (from 1; 0 before training).
      batch: mini-batches completed in the current epoch.
      order: the data order of the current epoch (array data), or None.
      best_objective, best_iteration, best_network: the best validation so far and copies of
        the (learnables, others) leaves at that iteration.
      bad_validations: validations in a row without improvement (for patience).
      training_rows, validation_rows: history rows (device scalars until logged).
      elapsed: seconds of training before this segment of the run.
      stop_reason: set when training stops.
    """

    treedef: Any
    learnable_index: tuple[int, ...]
    learnables: list
    others: list
    opt_state: Any
    key: Any
    shuffle_seed: tuple[int, ...]
    iteration: int = 0
    epoch: int = 0
    batch: int = 0
    order: np.ndarray | None = None
    best_objective: float | None = None
    best_iteration: int | None = None
    best_network: tuple | None = None
    bad_validations: int = 0
    training_rows: list = dataclasses.field(default_factory=list)
    validation_rows: list = dataclasses.field(default_factory=list)
    elapsed: float = 0.0
    stop_reason: str | None = None

    @property
    def network(self) -> Network:
        return _combine(self.treedef, self.learnable_index, self.learnables, self.others)

    def best(self) -> Network | None:
        if self.best_network is None:
            return None
        return _combine(self.treedef, self.learnable_index, *self.best_network)


def _combine(treedef, learnable_index, learnables, others):
    leaves = list(others)
    for i, value in zip(learnable_index, learnables, strict=True):
        leaves.insert(i, value)
    return jax.tree.unflatten(treedef, leaves)


def _split(net, learnable_index):
    leaves = jax.tree.leaves(net)
    chosen = set(learnable_index)
    return [leaves[i] for i in learnable_index], [
        x for i, x in enumerate(leaves) if i not in chosen
    ]


# -- data ---------------------------------------------------------------------------------------


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _is_array(x) -> bool:
    return isinstance(x, FormattedArray) or hasattr(x, "shape")


class _ArrayData:
    """In-memory data: inputs and targets with their batch axes, on the device once."""

    def __init__(self, who, X, T, net: Network, placement: Placement):
        inputs, targets = _as_tuple(X), _as_tuple(T)
        for name, group in (("X", inputs), ("T", targets)):
            for x in group:
                if not _is_array(x):
                    raise OptionsError(
                        f"{who}: {name} must be an array (or a tuple of arrays, one per network "
                        f"input / target); got {type(x).__name__}."
                    )
        if len(inputs) != len(net.input_names):
            raise OptionsError(
                f"{who}: the network has {len(net.input_names)} input(s) {list(net.input_names)}"
                f" but X has {len(inputs)} array(s). Fix: pass a tuple with one array per input."
            )
        known = net.input_layouts
        self.input_axes = tuple(
            _batches.batch_axis(x, lo.format if lo else None, what=f"{who}: X[{k}]")
            for k, (x, lo) in enumerate(zip(inputs, known, strict=True))
        )
        self.target_axes = tuple(
            _batches.batch_axis(t, what=f"{who}: T[{k}]") for k, t in enumerate(targets)
        )
        counts = {_batches.count(x, a) for x, a in zip(inputs, self.input_axes, strict=True)}
        counts |= {_batches.count(t, a) for t, a in zip(targets, self.target_axes, strict=True)}
        if len(counts) != 1:
            raise OptionsError(
                f"{who}: the inputs and targets have different numbers of observations "
                f"{sorted(counts)} along their batch axes. Fix: pass matching X and T."
            )
        self.n = counts.pop()
        self.host_inputs = inputs
        self.inputs = placement.put(tuple(_batches.as_device_array(x) for x in inputs))
        self.targets = placement.put(tuple(_batches.as_device_array(t) for t in targets))

    def signature(self):
        return (self.input_axes, self.target_axes)

    def first_batch(self, size):
        return tuple(
            _batches.slice_host(x, 0, size, a)
            for x, a in zip(self.host_inputs, self.input_axes, strict=True)
        )

    def statistics_sample(self, k):
        return self.host_inputs[k]


class _IterableData:
    """An iterable of batches ``(*inputs, *targets)``; re-iterated once per epoch."""

    def __init__(self, who, data, net: Network, max_epochs: int):
        if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
            raise OptionsError(
                f"{who}: data must be an iterable of (inputs..., targets...) batches; got "
                f"{type(data).__name__}."
            )
        if iter(data) is data and max_epochs > 1:
            raise OptionsError(
                f"{who}: data is a one-shot iterator, which cannot be read again for "
                f"max_epochs={max_epochs}. Fix: pass a re-iterable (a list, or an object whose "
                "__iter__ starts over), or max_epochs=1."
            )
        self.data = data
        self.num_inputs = len(net.input_names)
        self.n_per_epoch = len(data) if hasattr(data, "__len__") else None
        self.known = net.input_layouts
        self.batch_size = None

    def split(self, who, item):
        item = _as_tuple(item)
        if len(item) <= self.num_inputs:
            raise OptionsError(
                f"{who}: each batch must be a tuple (inputs..., targets...) with "
                f"{self.num_inputs} input(s) and at least one target; got {len(item)} value(s)."
            )
        return item[: self.num_inputs], item[self.num_inputs :]

    def axes(self, xs, ts, who):
        in_axes = tuple(
            _batches.batch_axis(x, lo.format if lo else None, what=f"{who}: batch input {k}")
            for k, (x, lo) in enumerate(zip(xs, self.known, strict=True))
        )
        t_axes = tuple(_batches.batch_axis(t, what=f"{who}: batch target") for t in ts)
        return in_axes, t_axes


def _validation_batches(who, validation, net, mini_batch_size):
    """A list of (inputs, targets) device batches for validation."""
    if (
        isinstance(validation, (tuple, list))
        and len(validation) == 2
        and all(_is_array(v) or isinstance(v, (tuple, list)) for v in validation)
        and all(_is_array(x) for v in validation for x in _as_tuple(v))
    ):
        X, T = validation
        inputs, targets = _as_tuple(X), _as_tuple(T)
        known = net.input_layouts
        if len(inputs) != len(net.input_names):
            raise OptionsError(
                f"{who}: validation_data has {len(inputs)} input array(s); the network has "
                f"{len(net.input_names)} input(s)."
            )
        in_axes = tuple(
            _batches.batch_axis(x, lo.format if lo else None, what=f"{who}: validation X")
            for x, lo in zip(inputs, known, strict=True)
        )
        t_axes = tuple(_batches.batch_axis(t, what=f"{who}: validation T") for t in targets)
        counts = {_batches.count(x, a) for x, a in zip(inputs, in_axes, strict=True)}
        counts |= {_batches.count(t, a) for t, a in zip(targets, t_axes, strict=True)}
        if len(counts) != 1:
            raise OptionsError(
                f"{who}: validation inputs and targets have different numbers of observations "
                f"{sorted(counts)}."
            )
        n = counts.pop()
        batches = []
        for start in range(0, n, mini_batch_size):
            stop = min(start + mini_batch_size, n)
            xs = tuple(
                _batches.slice_host(x, start, stop, a) for x, a in zip(inputs, in_axes, strict=True)
            )
            ts = tuple(
                _batches.slice_host(t, start, stop, a) for t, a in zip(targets, t_axes, strict=True)
            )
            batches.append((xs, ts))
        return batches
    source = _IterableData(who, validation, net, 1)
    return [source.split(who, item) for item in validation]


# -- the compiled step --------------------------------------------------------------------------

_STEP_CACHE: OrderedDict = OrderedDict()
_STEP_CACHE_SIZE = 32


def _cached(key, build):
    fn = _STEP_CACHE.get(key)
    if fn is None:
        fn = build()
        _STEP_CACHE[key] = fn
        while len(_STEP_CACHE) > _STEP_CACHE_SIZE:
            _STEP_CACHE.popitem(last=False)
    else:
        _STEP_CACHE.move_to_end(key)
    return fn


def _scalar_loss(value, name):
    value = stripdims(value)
    if jnp.ndim(value) != 0:
        raise OptionsError(
            f"trainnet: the loss {name!r} returned an array of shape {jnp.shape(value)}; a loss "
            "must return a scalar (sum or average over the observations)."
        )
    return value


class _Steps:
    """The jitted (or eager) training and evaluation functions of one run."""

    def __init__(self, *, net, learnable_index, loss, loss_label, metrics, tx, placement):
        self.treedef = jax.tree.structure(net)
        self.learnable_index = learnable_index
        self.loss = loss
        self.loss_label = loss_label
        self.metrics = metrics
        self.tx = tx
        self.placement = placement
        self.wanted = net.output_ports()
        self.accelerate = net.acceleratable
        self._jitted: dict = {}

    def _core(self, learnables, others, opt_state, xs, ts, key, iteration, learn_rate):
        step_key = jax.random.fold_in(key, iteration)

        def objective(learnables):
            # Each mini-batch holds independent observations: recurrent state (layers that
            # define reset_state, e.g. LSTM) starts afresh, as in MATLAB. Layers that accumulate
            # statistics (BatchNorm) do not define reset_state and keep theirs.
            net = _combine(self.treedef, self.learnable_index, learnables, others).reset_state()
            outputs, states = net.run(xs, step_key, training=True, outputs=self.wanted)
            value = _scalar_loss(self.loss(*outputs, *ts), self.loss_label)
            return value, (outputs, states)

        (value, (outputs, states)), grads = jax.value_and_grad(objective, has_aux=True)(learnables)
        learnables, opt_state = self._update(learnables, grads, opt_state, learn_rate)
        net = _combine(self.treedef, self.learnable_index, learnables, others)
        # Stored reset, so the state's shape (and the donated buffers) stay the same each step.
        _, others = _split(net.with_layer_states(states).reset_state(), self.learnable_index)
        values = tuple(m(outputs[0], ts[0]) for m in self.metrics)
        return learnables, others, opt_state, value, values

    def _update_impl(self, learnables, grads, opt_state, learn_rate):
        updates, opt_state = self.tx.update(grads, opt_state, learnables, learn_rate=learn_rate)
        return optax.apply_updates(learnables, updates), opt_state

    def _update(self, learnables, grads, opt_state, learn_rate):
        if self.accelerate:
            return self._update_impl(learnables, grads, opt_state, learn_rate)
        return self._jit("update", self._update_impl, donate=(0, 2))(
            learnables, grads, opt_state, learn_rate
        )

    def _jit(self, name, fn, donate=(), statics=()):
        key = (name, statics)
        if key not in self._jitted:
            shardings = {}
            if self.placement.mesh is not None and name != "evaluate":
                shardings["out_shardings"] = self.placement.replicated
            self._jitted[key] = jax.jit(fn, donate_argnums=donate, **shardings)
        return self._jitted[key]

    def gather_step(self, batch_size, in_axes, t_axes):
        """step(learnables, others, opt_state, X, T, order, batch, key, iteration, learn_rate)."""
        placement = self.placement

        def step(learnables, others, opt_state, X, T, order, batch, key, iteration, learn_rate):
            index = jax.lax.dynamic_slice_in_dim(order, batch * batch_size, batch_size)
            xs = tuple(
                placement.constrain(_batches.take(x, index, a), a)
                for x, a in zip(X, in_axes, strict=True)
            )
            ts = tuple(
                placement.constrain(_batches.take(t, index, a), a)
                for t, a in zip(T, t_axes, strict=True)
            )
            return self._core(learnables, others, opt_state, xs, ts, key, iteration, learn_rate)

        if not self.accelerate:
            return step
        return self._jit("gather", step, donate=(0, 1, 2), statics=(batch_size, in_axes, t_axes))

    def direct_step(self, in_axes, t_axes):
        """step(learnables, others, opt_state, xs, ts, key, iteration, learn_rate)."""
        placement = self.placement

        def step(learnables, others, opt_state, xs, ts, key, iteration, learn_rate):
            xs = tuple(placement.constrain(x, a) for x, a in zip(xs, in_axes, strict=True))
            ts = tuple(placement.constrain(t, a) for t, a in zip(ts, t_axes, strict=True))
            return self._core(learnables, others, opt_state, xs, ts, key, iteration, learn_rate)

        if not self.accelerate:
            return step
        return self._jit("direct", step, donate=(0, 1, 2), statics=(in_axes, t_axes))

    def accumulate(self, total, value, n, states, new_states):
        """Validation totals: loss times batch size summed, metric states merged (jitted)."""

        def accumulate(total, value, n, states, new_states):
            merged = tuple(
                m.merge(a, b) for m, a, b in zip(self.metrics, states, new_states, strict=True)
            )
            return total + value * n, merged

        return self._jit("accumulate", accumulate)(total, value, n, states, new_states)

    def evaluate(self):
        """evaluate(learnables, others, xs, ts) -> (loss, metric states of this batch)."""

        def evaluate(learnables, others, xs, ts):
            net = _combine(self.treedef, self.learnable_index, learnables, others)
            outputs, _ = net.run(xs, None, training=False, outputs=self.wanted)
            value = _scalar_loss(self.loss(*outputs, *ts), self.loss_label)
            states = tuple(m.update(m.init(outputs[0]), outputs[0], ts[0]) for m in self.metrics)
            return value, states

        if not self.accelerate:
            return evaluate
        return self._jit("evaluate", evaluate)


# -- trainnet -----------------------------------------------------------------------------------


def trainnet(*args, key=None, resume_from=None):
    """Train a network (MATLAB ``trainnet``).

    Two forms: ``trainnet(X, T, net, loss, options)`` with in-memory data, and
    ``trainnet(data, net, loss, options)`` with an iterable of mini-batches
    ``(inputs..., targets...)`` (re-iterated every epoch; its batch size is its own and a batch
    smaller than the first is dropped).

    Args:
      X: inputs: an array (plain arrays take the format of the network's input layer; their
        batch axis is its ``B``) or a tuple of arrays, one per network input.
      T: targets: an array or a tuple (one per loss target); integer labels or one-hot for
        classification.
      net: a ``df.Network``; it is initialized from the data if it is not, and input layers
        whose normalization needs statistics get them from the training data first.
      loss: a name (``"crossentropy"``, ``"index-crossentropy"``, ``"binary-crossentropy"``,
        ``"mse"``, ``"l1loss"``/``"mae"``, ``"l2loss"``, ``"huber"``), any callable
        ``loss(Y1.., T1..)`` returning a scalar, or a ``df.DifferentiableFunction``.
      options: a ``df.TrainingOptions``.
      key: a ``jax.random`` key for the shuffles, per-iteration randomness and initialization
        (default ``jax.random.key(0)``: training is reproducible). When resuming, the
        checkpoint's keys are used; a ``key`` other than the one the run started with is an
        error.
      resume_from: a checkpoint file, or a folder of checkpoints (the newest valid one is used;
        a damaged newest one is reported with a ``df.CheckpointWarning`` and the previous one
        used). Training continues exactly where the checkpoint stopped: the same epoch and
        mini-batch, data order, keys, optimizer state, learn-rate schedule position,
        validation and patience state and history, so the result equals an uninterrupted
        run's. Pass the network, loss, data and options of the run that wrote it (the
        options that change the numbers, the loss, the data and the factors are checked);
        ``verbose``, ``plots``, ``output_fcn``, ``execution_environment`` and the checkpoint
        options may differ. A run that was stopped by ``output_fcn`` continues; one that
        ended (max epochs, patience, NaN loss) returns its result.

    Returns:
      ``(net, info)``: the trained network (per ``output_network``) and a
      :class:`TrainingInfo`.

    Raises:
      OptionsError: bad arguments (the message says which and how to fix it).
      SerializationError: ``resume_from`` has no valid checkpoint, or its checkpoint was
        written by a run with another network, loss, data or options (the first difference
        is named).

    Examples:
      >>> import jax, jax.numpy as jnp, numpy as np
      >>> import difffn as df
      >>> net = df.Network([
      ...     df.layers.FeatureInput(2, name="in"),
      ...     df.layers.FullyConnected(1, name="fc"),
      ... ])
      >>> X = np.random.default_rng(0).normal(size=(256, 2)).astype(np.float32)
      >>> T = X @ np.array([[2.0], [-1.0]], np.float32)
      >>> options = df.TrainingOptions("adam", initial_learn_rate=0.05, max_epochs=60,
      ...                              mini_batch_size=64, verbose=False)
      >>> net, info = df.trainnet(X, T, net, "mse", options)
      >>> info.stop_reason, bool(info.training_history["loss"][-1] < 1e-3)
      ('Max epochs completed', True)
    """
    who = "trainnet"
    if len(args) == 5:
        X, T, net, loss, options = args
        data = None
    elif len(args) == 4:
        data, net, loss, options = args
        X = T = None
    else:
        raise OptionsError(
            f"{who} takes (X, T, net, loss, options) or (data, net, loss, options); got "
            f"{len(args)} positional argument(s)."
        )
    if not isinstance(net, Network):
        raise OptionsError(f"{who}: net must be a df.Network; got {type(net).__name__}.")
    if not isinstance(options, TrainingOptions):
        raise OptionsError(
            f"{who}: options must be df.TrainingOptions(...); got {type(options).__name__}."
        )
    loss_fn = get_loss(loss, who=who)
    resume = None
    if resume_from is not None:
        resume = _checkpoint.find(resume_from)
        if key is None:
            key = _checkpoint.restore_key(resume[1]["run_key"])
    key = jax.random.key(0) if key is None else key
    run = _Run(who, net, loss_fn, loss, options, key, X=X, T=T, data=data, resume=resume)
    return run.train()


class _Run:
    """One call of trainnet: setup, the loop, logging, and the result."""

    def __init__(self, who, net, loss_fn, loss, options, key, *, X, T, data, resume):
        loss_label = loss_name(loss)
        self.who = who
        self.options = options
        self.metrics: tuple[Metric, ...] = options.metrics
        self.placement = Placement(options.execution_environment)
        self.reporter = None
        init_key, shuffle_key, step_key = jax.random.split(key, 3)
        if data is None:
            self.source = _ArrayData(who, X, T, net, self.placement)
            self.iterable = None
            self.batch_size = options.mini_batch_size
            self.placement.check_batch(self.batch_size)
            self.iterations_per_epoch = self.source.n // self.batch_size
            if self.iterations_per_epoch == 0:
                raise OptionsError(
                    f"{who}: mini_batch_size={self.batch_size} is larger than the "
                    f"{self.source.n} training observations, so an epoch has no full mini-batch "
                    f"(the last partial one is dropped). Fix: mini_batch_size <= {self.source.n}."
                )
        else:
            self.source = None
            self.iterable = _IterableData(who, data, net, options.max_epochs)
            self.batch_size = None
            self.iterations_per_epoch = self.iterable.n_per_epoch
        self.messages: list[str] = []
        net = self._prepare_network(net, init_key)
        fingerprint = None
        if resume is not None or options.checkpoint_path is not None:
            fingerprint = _checkpoint.fingerprint(
                options,
                loss=loss,
                data=self._data_fingerprint(X, T, data),
                factors=_factor_fingerprint(net),
            )
        saved = None
        if resume is not None:
            source, saved = resume
            source = str(source)
            self.messages = [
                f"Resuming from {source} (iteration {saved['iteration']}, epoch {saved['epoch']})."
            ]
            if not _checkpoint.same_key(saved["run_key"], _checkpoint.key_payload(key)):
                raise SerializationError(
                    f"trainnet(resume_from={source!r}): the key differs from the key the run "
                    "that wrote the checkpoint started with. Fix: pass that run's key, or "
                    "leave key out to use the checkpoint's."
                )
            try:
                restored = restore_network(saved["network"], net, source=source)
            except SerializationError as error:
                raise SerializationError(
                    f"trainnet(resume_from={source!r}): {error} Fix: pass the network the run "
                    "started from (the same layers, names and sizes)."
                ) from None
            _checkpoint.check_fingerprint(saved["fingerprint"], fingerprint, source)
            net = restored
        self.checkpoints = (
            _checkpoint.Writer(options, fingerprint=fingerprint, run_key=key)
            if options.checkpoint_path is not None
            else None
        )
        learnable_index = tuple(i for i, m in enumerate(jax.tree.leaves(learnable_mask(net))) if m)
        lr_factors = leaf_factors(net, LEARN_RATE)
        l2_factors = leaf_factors(net, L2)
        tx = training_transform(
            options,
            tuple(lr_factors[i] for i in learnable_index),
            tuple(l2_factors[i] for i in learnable_index),
        )
        self.steps = _cached(
            (
                jax.tree.structure(net),
                learnable_index,
                loss_fn,
                self.metrics,
                _transform_key(options, lr_factors, l2_factors),
                self.placement.key(),
            ),
            lambda: _Steps(
                net=net,
                learnable_index=learnable_index,
                loss=loss_fn,
                loss_label=loss_label,
                metrics=self.metrics,
                tx=tx,
                placement=self.placement,
            ),
        )
        learnables, others = _split(net, learnable_index)
        # Copies: the step donates these buffers, and the caller's network must stay usable.
        learnables = jax.device_put(learnables, self.placement.replicated, may_alias=False)
        others = jax.device_put(others, self.placement.replicated, may_alias=False)
        opt_state = self.steps.tx.init(learnables)
        seed = np.asarray(jax.random.key_data(shuffle_key)).astype(np.uint64).ravel()
        self.state = TrainingState(
            treedef=jax.tree.structure(net),
            learnable_index=learnable_index,
            learnables=learnables,
            others=others,
            opt_state=opt_state,
            key=step_key,
            shuffle_seed=tuple(int(s) for s in seed),
        )
        if saved is not None:
            self._restore(saved, source)
        self.state.opt_state = self.placement.put(self.state.opt_state)
        self.state.key = self.placement.put(self.state.key)
        self.schedule = LearnRateSchedule(options, self.iterations_per_epoch)
        self.validation = (
            _validation_batches(who, options.validation_data, net, options.mini_batch_size)
            if options.validation_data is not None
            else None
        )
        if self.validation is not None:
            self.validation = [self._place_validation(xs, ts, net) for xs, ts in self.validation]

    # -- setup -----------------------------------------------------------------------------------

    def _data_fingerprint(self, X, T, data) -> dict[str, str]:
        if data is not None:
            return {"data": _checkpoint.describe_data(data, "training")}
        out = {}
        for name, group in (("X", _as_tuple(X)), ("T", _as_tuple(T))):
            for k, x in enumerate(group):
                out[f"data {name}[{k}]"] = _checkpoint.describe_array(x)
        return out

    def _restore(self, saved, source):
        """Put a checkpoint's progress into the fresh state (after the checks in __init__)."""
        state = self.state
        fix = "Fix: resume with the options and network of the run that wrote the checkpoint."
        state.opt_state = _checkpoint.restore_tree(
            saved["optimizer"], state.opt_state, what="the optimizer state", source=source, fix=fix
        )
        state.key = _checkpoint.restore_key(saved["key"])
        state.shuffle_seed = tuple(int(s) for s in saved["shuffle_seed"])
        state.iteration = int(saved["iteration"])
        state.epoch = int(saved["epoch"])
        state.batch = int(saved["batch"])
        order = saved["order"]
        state.order = None if order is None else np.asarray(order, dtype=np.int32)
        best = saved["best"]
        if best is not None:
            state.best_objective = float(best["objective"])
            state.best_iteration = int(best["iteration"])
            if best["network"] is not None:
                learnables = _checkpoint.restore_tree(
                    best["network"]["learnables"],
                    state.learnables,
                    what="the best-validation network",
                    source=source,
                    fix=fix,
                )
                others = _checkpoint.restore_tree(
                    best["network"]["others"],
                    state.others,
                    what="the best-validation network",
                    source=source,
                    fix=fix,
                )
                state.best_network = self.placement.put((learnables, others))
        state.bad_validations = int(saved["bad_validations"])
        state.training_rows = [dict(r) for r in saved["training_rows"]]
        state.validation_rows = [dict(r) for r in saved["validation_rows"]]
        state.elapsed = float(saved["elapsed"])
        # A stop asked for by output_fcn is a pause: resuming continues. Other stops are final.
        reason = saved["stop_reason"]
        state.stop_reason = None if reason == "Stopped by output_fcn" else reason
        if self.iterable is not None and saved["data_batch_size"] is not None:
            self.iterable.batch_size = int(saved["data_batch_size"])

    def _save_checkpoint(self, unit):
        if self.checkpoints is None:
            return
        state = self.state
        count = state.iteration if unit == "iteration" else state.epoch
        if not _checkpoint.due(self.options, unit, count):
            return
        self._flush()
        self.checkpoints.maybe_save(
            state,
            unit,
            elapsed=time.perf_counter() - self.start,
            data_batch_size=None if self.iterable is None else self.iterable.batch_size,
        )

    def _prepare_network(self, net: Network, init_key) -> Network:
        needs = [
            (k, layer)
            for k, layer in enumerate(net.input_layers)
            if layer is not None and layer.needs_statistics()
        ]
        if needs:
            self.messages.append("Initializing input data normalization.")
            for k, layer in needs:
                sample = self._statistics_sample(k)
                net = net.replace_layer(layer.name, layer.with_statistics(sample))
        if not net.initialized:
            layouts = []
            known = net.input_layouts
            examples = self._first_inputs()
            for k, (x, lo) in enumerate(zip(examples, known, strict=True)):
                if lo is not None:
                    layouts.append(lo)
                elif isinstance(x, FormattedArray):
                    shape = tuple(
                        None if c == "B" else s for c, s in zip(x.format, x.shape, strict=True)
                    )
                    layouts.append(Layout(shape, x.format))
                else:
                    raise OptionsError(
                        f"{self.who}: network input {net.input_names[k]!r} has no input layer, so"
                        " initializing the network needs formatted data. Fix: pass "
                        "df.dlarray(X, fmt), or initialize the network first."
                    )
            net = net.initialize(*layouts, key=init_key)
        return net

    def _statistics_sample(self, k):
        if self.source is not None:
            return self.source.statistics_sample(k)
        parts = []
        for n, item in enumerate(self.iterable.data):
            if n >= _STATISTICS_BATCHES:
                break
            xs, _ = self.iterable.split(self.who, item)
            parts.append(xs[k])
        axis = _batches.batch_axis(parts[0], (self.iterable.known[k] or Layout((), "")).format)
        return _batches.concatenate([_batches.as_device_array(p) for p in parts], axis)

    def _first_inputs(self):
        if self.source is not None:
            return self.source.first_batch(1)
        for item in self.iterable.data:
            return self.iterable.split(self.who, item)[0]
        raise OptionsError(f"{self.who}: the training data iterable is empty.")

    # -- the loop --------------------------------------------------------------------------------

    def train(self):
        options, state = self.options, self.state
        total = (
            options.max_epochs * self.iterations_per_epoch if self.iterations_per_epoch else None
        )
        self.final_iteration = total
        self.reporter = _progress.Reporter(
            verbose=options.verbose,
            metric_titles=[m.title for m in self.metrics],
            validation=self.validation is not None,
            total_iterations=total,
        )
        for message in self.messages:
            self.reporter.message(message)
        self.start = time.perf_counter() - state.elapsed
        self.reporter.header()
        self.last_logged = -1
        self._flushed = len(state.training_rows)  # rows from a checkpoint are host numbers
        if state.iteration == 0 and self.validation is not None:
            self._validate()
            self._log(state.iteration, training=None)
        if self._call_output_fcn("start", None):
            state.stop_reason = "Stopped by output_fcn"
        while state.stop_reason is None and state.epoch < options.max_epochs:
            if state.batch == 0:
                state.epoch += 1
                state.order = self._epoch_order(state.epoch)
            self._run_epoch()
            if state.stop_reason is None:
                state.batch = 0
                self._save_checkpoint("epoch")
        if state.stop_reason is None:
            state.stop_reason = "Max epochs completed"
        return self._finish()

    def _epoch_order(self, epoch):
        if self.source is None:
            return None
        n = self.source.n
        if self.options.shuffle == "never":
            return np.arange(n, dtype=np.int32)
        which = 1 if self.options.shuffle == "once" else epoch
        rng = np.random.default_rng([*self.state.shuffle_seed, which])
        return rng.permutation(n).astype(np.int32)

    def _batches_of_epoch(self):
        state = self.state
        if self.source is not None:
            step = self.steps.gather_step(
                self.batch_size, self.source.input_axes, self.source.target_axes
            )
            order = self.placement.put(state.order)
            for b in range(state.batch, self.iterations_per_epoch):
                yield lambda lr, it, b=b: step(
                    state.learnables,
                    state.others,
                    state.opt_state,
                    self.source.inputs,
                    self.source.targets,
                    order,
                    np.int32(b),
                    state.key,
                    np.int32(it),
                    np.float32(lr),
                )
            return
        source = self.iterable
        skip = state.batch  # full batches of this epoch trained on before a resume
        for item in source.data:
            xs, ts = source.split(self.who, item)
            in_axes, t_axes = source.axes(xs, ts, self.who)
            size = _batches.count(xs[0], in_axes[0])
            if source.batch_size is None:
                source.batch_size = size
                self.placement.check_batch(size, what="the batch size of the data")
            if size < source.batch_size:
                continue
            if size != source.batch_size:
                raise OptionsError(
                    f"{self.who}: the data's batches have different sizes ({source.batch_size} "
                    f"then {size}); only a smaller last batch is allowed (it is dropped)."
                )
            if skip:
                skip -= 1
                continue
            step = self.steps.direct_step(in_axes, t_axes)
            xs = self.placement.put(tuple(_batches.as_device_array(x) for x in xs))
            ts = self.placement.put(tuple(_batches.as_device_array(t) for t in ts))
            yield lambda lr, it, xs=xs, ts=ts, step=step: step(
                state.learnables,
                state.others,
                state.opt_state,
                xs,
                ts,
                state.key,
                np.int32(it),
                np.float32(lr),
            )

    def _run_epoch(self):
        options, state = self.options, self.state
        for run_step in self._batches_of_epoch():
            iteration = state.iteration + 1
            lr = self.schedule(iteration, state.epoch)
            learnables, others, opt_state, loss, values = run_step(lr, iteration)
            state.learnables, state.others, state.opt_state = learnables, others, opt_state
            state.iteration = iteration
            state.batch += 1
            row = {
                "iteration": iteration,
                "epoch": state.epoch,
                "time_elapsed": time.perf_counter() - self.start,
                "learn_rate": lr,
                "loss": loss,
            }
            row.update({m.name: v for m, v in zip(self.metrics, values, strict=True)})
            state.training_rows.append(row)
            self.reporter.tick(iteration, state.epoch)
            validated = False
            final = iteration == self.final_iteration
            if self.validation is not None and (
                iteration % options.validation_frequency == 0 or final
            ):
                self._validate()
                validated = True
            if iteration == 1 or iteration % options.verbose_frequency == 0 or validated or final:
                self._flush()  # also when not verbose: a NaN loss stops training
                self._log(iteration, training=row)
            if self._nan_loss(row):
                state.stop_reason = "Training loss is NaN"
            elif self._call_output_fcn("iteration", row):
                state.stop_reason = "Stopped by output_fcn"
            elif state.bad_validations >= options.validation_patience:
                state.stop_reason = "Stopped by validation patience"
            self._save_checkpoint("iteration")
            if state.stop_reason is not None:
                return

    # -- validation, logging ---------------------------------------------------------------------

    def _validate(self):
        state = self.state
        evaluate = self.steps.evaluate()
        total, count, states = jnp.zeros((), jnp.float32), 0, None
        for xs, ts in self.validation:
            n = _batches.count(ts[0], _batches.batch_axis(ts[0]))
            value, batch_states = evaluate(state.learnables, state.others, xs, ts)
            if states is None:
                total, states = value * n, batch_states
            else:
                total, states = self.steps.accumulate(total, value, n, states, batch_states)
            count += n
        loss = float(total) / count
        values = {
            m.name: float(m.compute(s)) for m, s in zip(self.metrics, states or (), strict=True)
        }
        row = {
            "iteration": state.iteration,
            "epoch": state.epoch,
            "time_elapsed": time.perf_counter() - self.start,
            "loss": loss,
            **values,
        }
        state.validation_rows.append(row)
        self._track_best(row)

    def _place_validation(self, xs, ts, net):
        """Device batches: split over the devices when the batch divides evenly."""
        xs = tuple(_batches.as_device_array(x) for x in xs)
        ts = tuple(_batches.as_device_array(t) for t in ts)
        n = _batches.count(ts[0], _batches.batch_axis(ts[0]))
        placement = self.placement
        if placement.mesh is None or n % placement.count:
            return placement.put(xs), placement.put(ts)
        known = net.input_layouts
        xs = tuple(
            jax.device_put(x, placement.batch_sharding(x, lo.format if lo else None))
            for x, lo in zip(xs, known, strict=True)
        )
        ts = tuple(jax.device_put(t, placement.batch_sharding(t, None)) for t in ts)
        return xs, ts

    def _track_best(self, row):
        state, options = self.state, self.options
        name = options.objective_metric_name
        value = row[name]
        maximize = name != "loss" and next(m for m in self.metrics if m.name == name).maximize
        better = state.best_objective is None or (
            value > state.best_objective if maximize else value < state.best_objective
        )
        if better and not math.isnan(value):
            state.best_objective = value
            state.best_iteration = state.iteration
            if options.resolved_output_network == "best-validation":
                state.best_network = jax.tree.map(jnp.copy, (state.learnables, state.others))
            if state.iteration > 0:
                state.bad_validations = 0
        elif state.iteration > 0:
            state.bad_validations += 1

    def _flush(self):
        """Bring pending device scalars of the training history to the host."""
        pending = self.state.training_rows[self._flushed :]
        if not pending:
            return
        self._flushed = len(self.state.training_rows)
        keys = ["loss"] + [m.name for m in self.metrics]
        values = jax.device_get([[r[k] for k in keys] for r in pending])
        for row, vals in zip(pending, values, strict=True):
            for k, v in zip(keys, vals, strict=True):
                row[k] = float(v)

    def _nan_loss(self, row) -> bool:
        return isinstance(row["loss"], float) and math.isnan(row["loss"])

    def _log(self, iteration, training):
        if iteration == self.last_logged:
            return
        state = self.state
        if not self.options.verbose:
            return
        self._flush()
        validation = None
        if state.validation_rows and state.validation_rows[-1]["iteration"] == iteration:
            validation = self._by_title(state.validation_rows[-1])
        self.reporter.row(
            iteration=iteration,
            epoch=state.epoch,
            elapsed=time.perf_counter() - self.start,
            learn_rate=(
                training["learn_rate"]
                if training
                else self.schedule(max(iteration, 1), max(state.epoch, 1))
            ),
            training=self._by_title(training) if training else None,
            validation=validation,
        )
        self.last_logged = iteration

    def _by_title(self, row):
        out = {"loss": row.get("loss")}
        for m in self.metrics:
            out[m.title] = row.get(m.name)
        return out

    def _call_output_fcn(self, stage, row) -> bool:
        if not self.options.output_fcn:
            return False
        state = self.state
        if row is not None:
            self._flush()
        info = {
            "state": stage,
            "iteration": state.iteration,
            "epoch": state.epoch,
            "time_elapsed": time.perf_counter() - self.start,
            "learn_rate": row["learn_rate"] if row else None,
            "training_loss": row["loss"] if row else None,
            "validation_loss": None,
        }
        for m in self.metrics:
            info[f"training_{m.name}"] = row.get(m.name) if row else None
            info[f"validation_{m.name}"] = None
        last = state.validation_rows[-1] if state.validation_rows else None
        if last is not None and last["iteration"] == state.iteration:
            info["validation_loss"] = last["loss"]
            for m in self.metrics:
                info[f"validation_{m.name}"] = last[m.name]
        stop = False
        for fn in self.options.output_fcn:
            stop = bool(fn(info)) or stop
        return stop

    # -- the end ---------------------------------------------------------------------------------

    def _finish(self):
        state, options = self.state, self.options
        last = state.training_rows[-1] if state.training_rows else None
        if (
            self.validation is not None
            and state.iteration > 0
            and (
                not state.validation_rows
                or state.validation_rows[-1]["iteration"] != state.iteration
            )
        ):
            self._validate()
            if last is not None:
                self.last_logged = -1  # print the row again, now with the validation values
                self._log(state.iteration, training=last)
        if last is not None and self.last_logged != state.iteration:
            self._log(state.iteration, training=last)
        self._flush()
        elapsed = time.perf_counter() - self.start
        self.reporter.finish(state.stop_reason)
        self._call_output_fcn("done", last)
        metric_names = [m.name for m in self.metrics]
        training = History(
            ["iteration", "epoch", "time_elapsed", "learn_rate", "loss", *metric_names],
            state.training_rows,
        )
        validation = History(
            ["iteration", "epoch", "time_elapsed", "loss", *metric_names], state.validation_rows
        )
        plot_path = None
        if options.plots == "training-progress":
            path = options.plots_path or os.path.join(os.getcwd(), "training_progress.png")
            plot_path = _progress.plot_progress(
                path,
                training,
                validation if self.validation is not None else None,
                metric_names,
                [m.title for m in self.metrics],
                state.stop_reason,
            )
            print(f"Training progress plot: {plot_path}")
        if options.resolved_output_network == "best-validation" and state.best_network is not None:
            net = state.best()
            iteration = state.best_iteration
        else:
            net = state.network
            iteration = state.iteration
        info = TrainingInfo(training, validation, state.stop_reason, iteration, plot_path, elapsed)
        return net, info


def _factor_fingerprint(net: Network) -> dict[str, str]:
    """The learn-rate and L2 factor of every learnable leaf, by its path (for resuming)."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(net)[0]]
    mask = jax.tree.leaves(learnable_mask(net))
    lr, l2 = leaf_factors(net, LEARN_RATE), leaf_factors(net, L2)
    return {
        f"factors of {path}": f"learn rate {a!r}, L2 {b!r}"
        for path, m, a, b in zip(paths, mask, lr, l2, strict=True)
        if m
    }


def _transform_key(options: TrainingOptions, lr_factors, l2_factors):
    return (
        options.solver,
        options.momentum,
        options.gradient_decay_factor,
        options.squared_gradient_decay_factor,
        options.epsilon,
        options.l2_regularization,
        options.gradient_threshold_method,
        options.gradient_threshold,
        tuple(lr_factors),
        tuple(l2_factors),
    )
