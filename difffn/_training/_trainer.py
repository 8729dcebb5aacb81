"""``trainnet``: MATLAB's training loop, one compiled step per iteration (or several per call).

``trainnet`` checks its arguments and hands a `_Run` the data source (``_sources``), the
network, the loss and the options. The run sets up (input statistics, initialization, the resume
checks of ``_checkpoint``, the compiled steps of ``_step``, a fresh ``TrainingState`` of
``_state``) and then loops: epochs of mini-batches, each one step whose results stay on the
device, or up to ``steps_per_execution`` of them in one compiled call between the iterations
where the host acts (``_chunk``; an iterable's batches read ahead for it); the host waits for
the device only to log (verbose rows, validation, ``output_fcn``, checkpoints) and at the end.

Randomness comes only from the ``key`` argument: the shuffles, the per-iteration keys
(``fold_in(key, iteration)``, e.g. for dropout) and the initialization of an uninitialized
network.

Why one module of about 850 lines: trainnet's argument handling and one class, `_Run`, whose
setup phases and loop share the run's state (placement, steps, writer, watch) attribute by
attribute; split apart, each half would have to be read with the other open. The natural cut,
if it grows, is the setup phases into a module of their own.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, overload

import jax
import jax.numpy as jnp
import numpy as np

from .._batching import (
    ArraySource,
    IterableSource,
    SequenceOptions,
    global_batch,
    label_check,
    validation_batches,
)
from .._batching import sequence_source as _seq
from .._core import FormattedArray, Layout, OptionsError, check_key, run_once
from .._core import batches as _batches
from .._devices import Placement, agree, learnable_layout, watching
from .._layer import Layer, learnable_mask
from .._network import L2, LEARN_RATE, Network, compilation_cache, leaf_factors
from .._scoring import Metric, get_loss, loss_name
from . import (
    _checkpoint,
    _checkpoint_fields,
    _chunk,
    _fingerprint,
    _options,
    _progress,
)
from ._logits_guard import check_first_batch
from ._options import TrainingOptions
from ._precision import Policy, restore_scaling
from ._schedules import for_run
from ._solvers import injected_learn_rate, training_transform
from ._state import History, TrainingInfo, TrainingState, split
from ._step import cached_steps
from ._train_args import form_of, layer_arrays_as_networks
from ._watch import STOPPED_BY_USER, Watch

_SLOT = "_slot"  # a training-history row of a chunk: its index in the chunk's arrays

Data = jax.typing.ArrayLike | tuple[Any, ...] | list[Any]
"""Inputs or targets: an array, a tuple of them (one per network input or loss target), or a
list of sequences of different lengths."""

Loss = str | Callable[..., Any]
"""A loss: a name (``"crossentropy"``, ``"mse"``, ...), ``loss(Y1.., T1..)`` returning a scalar,
or a ``df.DifferentiableFunction``."""


@overload
def trainnet(
    X: Data,
    T: Data,
    net: Network | Sequence[Layer],
    loss: Loss,
    options: TrainingOptions,
    /,
    *,
    key: jax.Array | None = None,
    resume_from: str | os.PathLike[str] | None = None,
) -> tuple[Network, TrainingInfo]: ...
@overload
def trainnet(
    data: Iterable[Any],
    net: Network | Sequence[Layer],
    loss: Loss,
    options: TrainingOptions,
    /,
    *,
    key: jax.Array | None = None,
    resume_from: str | os.PathLike[str] | None = None,
) -> tuple[Network, TrainingInfo]: ...
def trainnet(
    *args: Any,
    key: jax.Array | None = None,
    resume_from: str | os.PathLike[str] | None = None,
) -> tuple[Network, TrainingInfo]:
    """Train a network (MATLAB ``trainnet``).

    Two forms: ``trainnet(X, T, net, loss, options)`` with in-memory data, and
    ``trainnet(data, net, loss, options)`` with an iterable of mini-batches
    ``(inputs..., targets...)`` (re-iterated every epoch; its batch size is its own and a batch
    smaller than the first is dropped).

    Args:
      X: inputs: an array (plain arrays take the format of the network's input layer; their
        batch axis is its ``B``) or a tuple of arrays, one per network input. For an input with
        ``B`` and ``T`` axes (``SequenceInput``), a list of sequences of different lengths, one
        array per observation without ``B`` (``(T_i, C)``): each mini-batch is padded,
        truncated or split by the ``sequence_*`` options, and the padding is masked out of the
        loss, the metrics, recurrent states and attention (``docs/training.md``).
      T: targets: an array or a tuple (one per loss target); integer labels or one-hot for
        classification. For sequences, one row per sequence, or a list with one array per
        sequence and time step (``(T_i,)`` labels or ``(T_i, K)``).
      net: a ``df.Network`` (or a list of layers, built into one, as MATLAB takes a layer
        array); it is initialized from the data if it is not, and input layers
        whose normalization needs statistics get them from the training data first.
      loss: a name (``"crossentropy"``, ``"index-crossentropy"``, ``"binary-crossentropy"``,
        ``"mse"``, ``"l1loss"``/``"mae"``, ``"l2loss"``, ``"huber"``), any callable
        ``loss(Y1.., T1..)`` returning a scalar, or a ``df.DifferentiableFunction``.
      options: a ``df.TrainingOptions``.
      key: a ``jax.random`` key for the shuffles, per-iteration randomness and initialization
        (default ``jax.random.key(0)``: training is reproducible). When resuming, the
        checkpoint's keys are used; a ``key`` other than the one the run started with is an
        error.
      resume_from: a checkpoint (a ``net_checkpoint__<iteration>__<date>`` folder), or a folder
        of checkpoints (the newest valid one is used; a damaged newest one, a file of it
        flipped, truncated or missing, is reported with a ``df.CheckpointWarning`` naming the
        file, and the previous one used). It resumes on any number of processes and devices
        and any ``parameter_sharding`` (``docs/scaling.md``, the resume matrix). Training
        continues exactly where the checkpoint stopped: the same epoch and
        mini-batch, data order, keys, optimizer state, learn-rate schedule position,
        validation and patience state and history, so the result equals an uninterrupted
        run's. Pass the network, loss, data and options of the run that wrote it (the
        options that change the numbers, the loss, the data and the factors are checked);
        ``verbose``, ``plots``, ``output_fcn``, ``execution_environment``, ``mesh_shape``,
        ``parameter_sharding``, ``process_timeout`` and the checkpoint options may differ. A
        run that was stopped by ``output_fcn`` continues; one that
        ended (max epochs, patience, NaN loss) returns its result.

    Returns:
      ``(net, info)``: the trained network (per ``output_network``) and a
      [`TrainingInfo`][difffn.TrainingInfo].

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
    args = layer_arrays_as_networks(args)
    form = form_of(who, args)
    if form == "arrays":
        X, T, net, loss, options = args
    else:
        data, net, loss, options = args
    if not isinstance(options, TrainingOptions):
        raise OptionsError(
            f"{who}: options must be df.TrainingOptions(...); got {type(options).__name__}. "
            "Fix: df.TrainingOptions('adam', max_epochs=10, ...)"
            + (" (the keywords of the dict)." if isinstance(options, dict) else ".")
        )
    check_key(who, key, OptionsError, optional=True)
    compilation_cache.use(options.compilation_cache, who)
    loss_fn = get_loss(loss, who=who)
    multi_host = options.execution_environment == "multi-host" and jax.process_count() > 1
    if not multi_host:
        return _train(who, form, args, loss, loss_fn, options, key, resume_from, None)
    holder: list = []  # the run, once made: the watchdog names its newest checkpoint
    with watching(options.process_timeout, lambda: _next_steps(options, holder, resume_from)):
        return _train(who, form, args, loss, loss_fn, options, key, resume_from, holder)


def _train(who, form, args, loss, loss_fn, options, key, resume_from, holder):
    if form == "arrays":
        X, T, net, _, _ = args
        data = None
    else:
        data, net, _, _ = args
        X = T = None
    checkpoint = None
    if resume_from is not None:
        checkpoint = _checkpoint.find(resume_from, collective=holder is not None)
        if key is None:
            key = checkpoint.run_key
    key = jax.random.key(0) if key is None else key
    if form == "arrays" and _seq.has_sequences(X, net):
        data_source = _seq.SequenceSource(who, X, T, net, SequenceOptions.of(options))
    elif form == "arrays":
        data_source = ArraySource(who, X, T, net)
    else:
        data_source = IterableSource(
            who, data, net, max_epochs=options.max_epochs, steps_per_epoch=options.steps_per_epoch
        )
    run = _Run(who, net, loss_fn, loss, options, key, data_source, checkpoint)
    if holder is not None:
        holder.append(run)
    return run.train()


def _next_steps(options, holder, resume_from) -> str:
    """What a process that stops because another was lost says: the checkpoint to resume."""
    folder = options.checkpoint_path
    writer = holder[0].writer if holder else None
    newest = writer.written if writer is not None else None
    if newest is None and folder is not None:
        found = _checkpoint.checkpoints(folder) if os.path.isdir(folder) else []
        newest = found[0] if found else None
    if newest is None and resume_from is not None:
        newest = resume_from
    if newest is None:
        return (
            "No checkpoint was written (checkpoint_path is not set, or none was due yet): a new "
            "job starts the training again. Fix: set TrainingOptions(checkpoint_path=...) on a "
            "folder every process sees."
        )
    target = folder if folder is not None else newest
    return (
        f"The last complete checkpoint: {str(newest)}\n"
        f"To continue, start the job again (every process) with "
        f"trainnet(..., resume_from={str(target)!r}); the newest complete, undamaged checkpoint "
        "there is used, on any number of processes and devices."
    )


class _Run:
    """One call of trainnet: setup, the loop, validation, logging, and the result."""

    def __init__(self, who, net, loss_fn, loss, options, key, data, checkpoint):
        self.who = who
        self.options = options
        self.metrics: tuple[Metric, ...] = options.metrics
        self.placement = Placement(
            options.execution_environment, mesh_shape=options.mesh_shape, who=who
        )
        self.policy = Policy(options.precision)
        self.reporter: _progress.Reporter | None = None  # made by train()
        # one small program, compiled for one run (jax.random.split and unpacking its result
        # eagerly compile two programs with all of XLA's optimizations)
        init_key, shuffle_key, step_key = run_once(lambda k: tuple(jax.random.split(k, 3)), key)
        net = self._setup_data(data, net, init_key, loss_fn, loss)
        net, fingerprint = self._resume_network(net, loss, key, checkpoint)
        self._setup_writer(fingerprint, key, checkpoint)
        self._compile_steps(net, loss_fn, loss)
        self.chunk_length = _chunk.limit(
            who, options.steps_per_execution, self.placement, options.output_fcn,
            accelerate=self.steps.accelerate,
        )  # fmt: skip
        self.stacker = _chunk.Stacker()  # an iterable's batches, for calls of several
        self._initial_state(net, shuffle_key, step_key, checkpoint)
        self._setup_validation(net)

    # -- setup, in the order __init__ runs it ------------------------------------------------------

    def _setup_data(self, data, net: Network, init_key, loss_fn, loss) -> Network:
        """The data source set up for this run (placed, its batch size), and the network
        initialized from it (input statistics, layouts) with the targets' check installed."""
        self.source = data
        self.batch_size = data.setup(self.who, self.options, self.placement)
        self.iterations_per_epoch = data.iterations(self.batch_size)
        self.messages: list[str] = []
        uneven = self.placement.plan_uneven(
            net, *global_batch(data, self.placement, self.batch_size)
        )
        if uneven:
            self.messages.append(uneven)
        net = self._prepare_network(net, init_key)
        check_first_batch(self.who, net, loss, loss_fn, data)
        self.check_targets = label_check(self.who, net, loss_fn, self.metrics)
        if self.check_targets is not None:
            data.use_target_check(self.check_targets)
        return net

    def _resume_network(self, net: Network, loss, key, checkpoint):
        """The run's fingerprint (when it checkpoints or resumes), and the network restored
        from ``checkpoint`` after checking that the fingerprints agree."""
        options = self.options
        fingerprint = None
        if checkpoint is not None or options.checkpoint_path is not None:
            fingerprint = _fingerprint.run_fingerprint(
                _options.fingerprint(options), loss=loss, data=self.source.fingerprint(), net=net
            )
        if checkpoint is not None:
            self.messages = [
                f"Resuming from {checkpoint.source} (iteration {checkpoint.iteration}, epoch "
                f"{checkpoint.epoch})."
            ]
            assert fingerprint is not None  # computed above for a resumed run
            net = _checkpoint.resume(
                checkpoint,
                net=net,
                key=key,
                fingerprint=fingerprint,
                defaults=_options.fingerprint_defaults(options.solver),
            )
        return net, fingerprint

    def _setup_writer(self, fingerprint, key, checkpoint) -> None:
        # one format for every run: orbax folders, written by every process together
        self.writer = (
            _checkpoint.Writer(
                self.options,
                fingerprint=fingerprint,
                run_key=key,
                resumed=checkpoint,
                prune=_checkpoint.prune,
            )
            if self.options.checkpoint_path is not None
            else None
        )

    def _compile_steps(self, net: Network, loss_fn, loss) -> None:
        """The jitted training and evaluation steps (cached across runs of the same setup)."""
        options = self.options
        learnable_index = tuple(i for i, m in enumerate(jax.tree.leaves(learnable_mask(net))) if m)
        lr_factors = tuple(leaf_factors(net, LEARN_RATE))
        l2_factors = tuple(leaf_factors(net, L2))
        self.learnable_index = learnable_index
        self.steps = cached_steps(
            net=net,
            learnable_index=learnable_index,
            loss=loss_fn,
            loss_label=loss_name(loss),
            metrics=self.metrics,
            options=options,
            make_tx=lambda: training_transform(
                options,
                tuple(lr_factors[i] for i in learnable_index),
                tuple(l2_factors[i] for i in learnable_index),
            ),
            factors=(lr_factors, l2_factors),
            placement=self.placement,
            layout=learnable_layout(net, self.placement, options.parameter_sharding),
        )

    def _initial_state(self, net: Network, shuffle_key, step_key, checkpoint) -> None:
        """The training state on the devices: fresh, or restored from ``checkpoint``."""
        learnable_index = self.learnable_index
        learnables, others = split(net, learnable_index)
        # Copies: the step donates these buffers, and the caller's network must stay usable.
        put = self.placement.put
        learnables = put(learnables, self.steps.learnable_shardings, copy=True)
        others = put(others, copy=True)
        seed = np.asarray(jax.random.key_data(shuffle_key)).astype(np.uint64).ravel()
        self.state = TrainingState(
            treedef=jax.tree.structure(net),
            learnable_index=learnable_index,
            learnables=learnables,
            others=others,
            opt_state=self.steps.init_state(learnables),
            key=step_key,
            shuffle_seed=tuple(int(s) for s in seed),
        )
        # from the fresh optimizer state (a restored one holds a later learn rate)
        self.schedule = for_run(
            self.who,
            self.options,
            self.iterations_per_epoch,
            injected_learn_rate(self.state.opt_state),
        )
        if checkpoint is not None:
            lost = self.state.restore(checkpoint, placement=self.placement)
            if lost:
                warnings.warn(
                    f"trainnet(resume_from={checkpoint.source!r}): {lost}; the history returned "
                    "lacks the rest. The training state is whole, so training goes on exactly. "
                    "Fix: keep the history log next to the checkpoints.",
                    _checkpoint.CheckpointWarning,
                    stacklevel=4,
                )
            self.source.resume_at(checkpoint)
        state = self.state
        state.opt_state = put(state.opt_state, self.steps.opt_shardings)
        state.key = put(state.key)
        state.nan_at = put(np.zeros((), np.int32))  # from the host: no program to compile
        saved = checkpoint.payload.get("scaling") if checkpoint is not None else None
        state.scaling = put(restore_scaling(self.policy, saved))

    def _setup_validation(self, net: Network) -> None:
        options = self.options
        self.validation = None
        if options.validation_data is None:
            return
        sequences = isinstance(options.validation_data, (tuple, list)) and _seq.has_sequences(
            options.validation_data[0], net
        )
        if sequences:
            self.validation = _seq.validation_batches(
                self.who, options, net, self.placement, self.check_targets
            )
        else:
            self.validation, note = validation_batches(
                self.who, options, net, self.placement, self.check_targets
            )
            if note:
                self.messages.append(note)

    def _prepare_network(self, net: Network, init_key) -> Network:
        needs = [
            (k, layer)
            for k, layer in enumerate(net.input_layers)
            if layer is not None and layer.needs_statistics()
        ]
        if needs:
            self.messages.append("Initializing input data normalization.")
            for k, layer in needs:
                layout = net.input_layouts[k]
                assert layout is not None  # the input has an input layer
                sample = self.source.statistics_of(k, layout.format, self.placement)
                net = net.replace_layer(layer.name, layer.with_statistics(sample))
        if not net.initialized:
            layouts = []
            examples = self.source.first_inputs()
            for k, (x, lo) in enumerate(zip(examples, net.input_layouts, strict=True)):
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

    def _save_checkpoint(self, unit):
        """A checkpoint when one is due after an iteration or an epoch; unit "final": the end."""
        if self.writer is None:
            return
        state = self.state
        count = state.iteration if unit == "iteration" else state.epoch
        if unit != "final" and not _checkpoint.due(self.options, unit, count):
            return
        if unit == "iteration" and getattr(self.source, "mid_batch", False):
            return  # between chunks of split sequences: the next chunk needs their state
        self._flush()
        save = self.writer.save_final if unit == "final" else self.writer.save
        save(
            state,
            elapsed=time.perf_counter() - self.start,
            data_batch_size=self.source.data_batch_size,
            data_position=self.source.position,
        )

    # -- the loop --------------------------------------------------------------------------------

    def train(self) -> tuple[Network, TrainingInfo]:
        options, state = self.options, self.state
        total = (
            options.max_epochs * self.iterations_per_epoch if self.iterations_per_epoch else None
        )
        self.final_iteration = total
        self.reporter = _progress.Reporter(
            verbose=options.verbose and self.placement.is_primary,
            metric_titles=[m.title for m in self.metrics],
            validation=self.validation is not None,
            total_iterations=total,
            max_epochs=options.max_epochs,
        )
        self.watch = Watch(
            options,
            self.metrics,
            iterations_per_epoch=self.iterations_per_epoch,
            resumed_at=state.iteration,
            primary=self.placement.is_primary,
        )
        if self.watch.plot is not None:
            print(
                f"Training progress plot: {self.watch.plot.path} (redrawn while training runs; "
                f"to stop training, create the file {self.watch.plot.stop_file})"
            )
        for message in self.messages:
            self.reporter.message(message)
        if total is None and state.iteration == 0:
            self.reporter.unknown_length()
        self.start = time.perf_counter() - state.elapsed
        self.reporter.header()
        self.last_logged = -1
        self._flushed = len(state.training_rows)  # rows from a checkpoint are host numbers
        if state.iteration == 0 and self.validation is not None:
            self._validate()
            self._log(state.iteration, training=None)
        if self._call_output_fcn("start", None):
            state.stop_reason = "Stopped by output_fcn"
        # batch > 0: inside an epoch (e.g. resumed from a checkpoint in it), which runs to its end
        while state.stop_reason is None and (state.epoch < options.max_epochs or state.batch > 0):
            if state.batch == 0:
                state.epoch += 1
                state.order = self.source.epoch_order(
                    state.epoch, options.shuffle, state.shuffle_seed
                )
            self._run_epoch()
            if self.source.exhausted and state.stop_reason is None:
                state.stop_reason = "Training data exhausted"
            if state.stop_reason is None:
                state.batch = 0
                self._save_checkpoint("epoch")
        if state.stop_reason is None:
            state.stop_reason = "Max epochs completed"
        return self._finish()

    def _run_epoch(self):
        state = self.state
        fresh = state.batch == 0
        spec = step = None
        feeds = iter(
            self.source.epoch_feeds(state.order, state.batch, self.placement, self.batch_size)
        )
        pending = None  # a feed read ahead for a call that it could not join
        while True:
            if pending is not None:
                (feed, data), pending = pending, None
            else:
                got = next(feeds, None)
                if got is None:
                    break
                feed, data = got
            if feed != spec:
                spec, step = feed, self.steps.step(feed)
            first = state.iteration + 1
            lr = self.schedule(first, state.epoch)
            carry = (state.learnables, state.others, state.opt_state, state.nan_at, state.scaling)
            assert step is not None  # made for the first feed
            args = (carry, data, state.key, np.int32(first), np.float32(lr))
            chunk, n, length = self._chunk(feed, first, args)
            if chunk is not None:  # n steps in one call
                if feed[0] == "gather":  # their mini-batches gathered inside
                    for j in range(1, n):  # the source's next feeds: the same spec, b + j
                        skipped, (*_, b) = next(feeds)
                        assert skipped == feed and b == data[3] + j, (skipped, b, data[3], j)
                    batches = data
                else:  # an iterable's next batches, stacked
                    group, pending = _chunk.read_ahead(feeds, feed, data, n)
                    n, batches = len(group), self.stacker.fill(group, length)
                    del group  # in the buffer now: not held while the next call reads ahead
                rates = [lr] + [self.schedule(first + j, state.epoch) for j in range(1, n)]
                padded = np.zeros(length, np.float32)
                padded[:n] = rates
                carry, loss, values = chunk(carry, batches, *args[2:4], padded, np.int32(n))
                done = [(first + j, rates[j], loss, values, j) for j in range(n)]
            else:
                carry, loss, values, *carried = step(*args)
                if carried:  # split sequences: the next chunk starts from this recurrent state
                    self.source.carried = carried[0]
                done = [(first, lr, loss, values, None)]
            state.learnables, state.others, state.opt_state, state.nan_at, state.scaling = carry
            elapsed = time.perf_counter() - self.start  # the call's: its rows share it
            for i, record in enumerate(done):
                if self._after_step(*record, elapsed, last=i == len(done) - 1):
                    if pending is not None:  # read ahead for the next call, never trained on
                        self.source.unread()
                    return
        if fresh and state.batch == 0 and not self.source.exhausted:
            raise OptionsError(
                f"{self.who}: the training data yielded no batch in epoch {state.epoch}. Fix: "
                "pass an iterable with at least one batch."
            )

    def _chunk(self, feed, first, args):
        """The program that runs the next steps in one call, how many, and the length it was
        compiled for; ``(None, 1, 1)`` when they run one per call."""
        if self.chunk_length == 1:
            return None, 1, 1
        if feed[0] not in ("gather", "direct"):
            self._one_per_call("its sequences run as padded mini-batches with their masks")
            return None, 1, 1
        length = self.chunk_length
        if feed[0] == "direct":
            length = _chunk.stacked_length(length, args[1])
            if length == 1:
                self._one_per_call(
                    f"one batch of its data takes {_chunk.batch_bytes(args[1]) / 2**20:.3g} MiB, "
                    "and a call holds its batches at once, at most "
                    f"{_chunk.STACK_BYTES / 2**20:.3g} MiB of them"
                )
                return None, 1, 1
        options = self.options
        every = [options.verbose_frequency]
        if self.validation is not None:
            every.append(options.validation_frequency)
        if options.checkpoint_path is not None and options.checkpoint_frequency_unit == "iteration":
            every.append(options.checkpoint_frequency)
        per_epoch = self.iterations_per_epoch
        n = _chunk.count(
            first,
            limit=length,
            left=length if per_epoch is None else per_epoch - self.state.batch,
            final=self.final_iteration,
            every=tuple(every),
        )
        # one program for every call, the first iteration's call of one step too
        program = self.steps.chunk(feed, length, args)
        if program is None:
            self._one_per_call("its step has a convolution XLA:CPU runs slowly inside a loop")
            return None, 1, 1
        return program, n, length

    def _one_per_call(self, why: str) -> None:
        """Say once why an explicit ``steps_per_execution`` runs one iteration per call."""
        wanted = self.options.steps_per_execution
        if wanted == "auto" or getattr(self, "_said_one_per_call", False):
            return
        self._said_one_per_call = True
        warnings.warn(
            f"{self.who}: TrainingOptions(steps_per_execution={wanted}) runs one iteration per "
            f"call in this run: {why}. Fix: leave steps_per_execution='auto' to run as many per "
            "call as a run allows, without this warning.",
            RuntimeWarning,
            stacklevel=7,  # _chunk, _run_epoch, train, _train, trainnet: the user's call
        )

    def _after_step(self, iteration, lr, loss, values, slot, elapsed, *, last) -> bool:
        """Record one iteration (``slot``: its index in a chunk's arrays; ``elapsed``: the time
        its call was dispatched; ``last``: the call's last) and act on it; returns whether
        training stops here. Only the last iteration of a call may stop training: the state
        holds all of the call's steps."""
        options, state = self.options, self.state
        state.iteration = iteration
        state.batch += 1
        row = {
            "iteration": iteration,
            "epoch": state.epoch,
            "time_elapsed": elapsed,
            "learn_rate": lr,
            "loss": loss,
        }
        row.update({m.name: v for m, v in zip(self.metrics, values, strict=True)})
        if slot is not None:
            row[_SLOT] = slot
        state.training_rows.append(row)
        assert self.reporter is not None  # made by train()
        self.reporter.tick(iteration, state.epoch, lr)
        final = iteration == self.final_iteration
        validate = self.validation is not None and (
            iteration % options.validation_frequency == 0 or final
        )
        log = validate or iteration == 1 or iteration % options.verbose_frequency == 0 or final
        if log:
            self._flush()  # the host waits here anyway: a NaN loss is found here too
            if validate and state.stop_reason is None:
                self._validate()
            self._log(state.iteration, training=state.training_rows[-1])
            self.watch.update(state, self._flushed, elapsed=time.perf_counter() - self.start)
        if not last:  # within a call: _chunk.count ended calls where the host acts
            assert not (log or _checkpoint.due(options, "iteration", iteration))
            return False
        if state.stop_reason is None and self._call_output_fcn("iteration", row):
            state.stop_reason = "Stopped by output_fcn"
        elif state.stop_reason is None and self._stop_file():
            state.stop_reason = STOPPED_BY_USER
        elif state.stop_reason is None and (state.bad_validations >= options.validation_patience):
            state.stop_reason = "Stopped by validation patience"
        self._save_checkpoint("iteration")
        return state.stop_reason is not None

    # -- validation, logging ---------------------------------------------------------------------

    def _validate(self):
        state = self.state
        evaluate = self.steps.evaluate()
        total, count, states = jnp.zeros((), jnp.float32), 0, None
        check = not getattr(self, "_validation_checked", False)  # NaN/Inf said once per run
        padding = _checkpoint_fields.finite(self.options.sequence_padding_value)
        bad = jnp.zeros((), jnp.int32)
        assert self.validation is not None  # called only with validation data
        for xs, ts, *sequences in self.validation:
            if check and (padding or not sequences):  # NaN padding is the user's, masked out
                bad = bad + _checkpoint_fields.nonfinite((xs, ts))
            # padded sequences: their masks, and the batch's weight (its real steps or sequences)
            masks, n = sequences or (None, _batches.count(ts[0], _batches.batch_axis(ts[0])))
            value, batch_states = evaluate(state.learnables, state.others, xs, ts, masks)
            if states is None:
                total, states = value * n, batch_states
            else:
                total, states = self.steps.accumulate(total, value, n, states, batch_states)
            count += n
        if check:
            self._validation_checked = True
            _checkpoint_fields.warn_nonfinite(int(bad), "validation data", stacklevel=4)
        values = {
            m.name: float(m.compute(s)) for m, s in zip(self.metrics, states or (), strict=True)
        }
        row = {
            "iteration": state.iteration,
            "epoch": state.epoch,
            "time_elapsed": time.perf_counter() - self.start,
            "loss": float(total) / count,
            **values,
        }
        name = self.options.objective_metric_name
        state.record_validation(
            row,
            objective=name,
            maximize=name != "loss" and next(m for m in self.metrics if m.name == name).maximize,
            keep=self.options.resolved_output_network == "best-validation",
        )

    def _flush(self) -> bool:
        """Bring pending device scalars of the training history to the host, with the iteration
        of the first NaN loss: training stops there (the steps after it changed nothing).

        Returns whether this flush found the NaN loss.
        """
        state = self.state
        pending = state.training_rows[self._flushed :]
        if not pending:
            return False
        self._flushed = len(state.training_rows)
        keys = ["loss"] + [m.name for m in self.metrics]
        values, nan_at = jax.device_get(([[r[k] for k in keys] for r in pending], state.nan_at))
        for row, vals in zip(pending, values, strict=True):
            slot = row.pop(_SLOT, None)  # a row of a chunk: its entry of the chunk's arrays
            for k, v in zip(keys, vals, strict=True):
                row[k] = float(v if slot is None else v[slot])
        nan_at = int(nan_at)
        if nan_at and state.stop_reason is None:
            rows = [r for r in state.training_rows if r["iteration"] <= nan_at]
            state.batch = max(0, state.batch - (state.iteration - nan_at))
            state.training_rows, state.iteration = rows, nan_at
            state.epoch = rows[-1]["epoch"]
            self._flushed = len(rows)
            state.stop_reason = "Training loss is NaN"
            return True
        return False

    def _log(self, iteration, training):
        if iteration == self.last_logged:
            return
        state = self.state
        if not self.options.verbose:
            return
        self._flush()
        validation = None
        if state.validation_rows and state.validation_rows[-1]["iteration"] == iteration:
            validation = _progress.by_title(state.validation_rows[-1], self.metrics)
        assert self.reporter is not None  # made by train()
        self.reporter.row(
            iteration=iteration,
            epoch=state.epoch,
            elapsed=time.perf_counter() - self.start,
            learn_rate=(
                training["learn_rate"]
                if training
                else self.schedule(max(iteration, 1), max(state.epoch, 1))
            ),
            training=_progress.by_title(training, self.metrics) if training else None,
            validation=validation,
        )
        self.last_logged = iteration

    def _stop_file(self) -> bool:
        """Whether the user created the plot's stop file (process 0 looks; all agree, every
        ``verbose_frequency`` iterations, so that agreeing costs no collective per iteration)."""
        if self.options.plots != "training-progress":
            return False
        if not self.placement.multi_host:
            return self.watch.stop_requested()
        if self.state.iteration % self.options.verbose_frequency:
            return False
        return agree(self.watch.stop_requested())

    def _call_output_fcn(self, stage, row) -> bool:
        """Call ``output_fcn`` (in process 0 only; its wish to stop is then every process's)."""
        if not self.options.output_fcn:
            return False
        if row is not None and self._flush():  # a NaN loss before this row: training stopped
            return False
        stop = False
        if self.placement.is_primary:
            info = _progress.output_fcn_info(
                stage, self.state, row, self.metrics, time.perf_counter() - self.start
            )
            for fn in self.options.output_fcn:
                stop = bool(fn(info)) or stop
        return agree(stop) if self.placement.multi_host else stop

    # -- the end ---------------------------------------------------------------------------------

    def _finish(self) -> tuple[Network, TrainingInfo]:
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
        self._save_checkpoint("final")
        self._flush()
        elapsed = time.perf_counter() - self.start
        assert self.reporter is not None and state.stop_reason is not None  # train() set them
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
        self.watch.update(state, len(state.training_rows), elapsed=elapsed, final=True)
        self.watch.close()
        plot_path = self.watch.plot.path if self.watch.plot is not None else None
        if options.resolved_output_network == "best-validation" and state.best_network is not None:
            net = state.best()
            iteration = state.best_iteration
            assert net is not None and iteration is not None  # a best network has its iteration
        else:
            net = state.network
            iteration = state.iteration
        skipped = int(jax.device_get(state.scaling.skipped))
        info = TrainingInfo(
            training, validation, state.stop_reason, iteration, plot_path, elapsed, skipped
        )
        return net, info
