"""Training and validation data behind one interface: in-memory arrays, or an iterable of batches.

`source` makes an `ArraySource` from ``(X, T)`` arrays or an
`IterableSource` from an iterable of ``(inputs..., targets...)`` batches. Both answer what
training asks of data, for the training data and the validation data alike:

* ``fingerprint()``: what the data is, for the checkpoint fingerprint;
* ``first_inputs()``: inputs of one batch (to initialize a network from them);
* ``statistics_sample(k)``: observations of input ``k`` (for input normalization statistics);
* ``iterations(batch_size)``: mini-batches per epoch (None when unknown);
* ``epoch_order(epoch, shuffle, seed)``: the epoch's data order (None: the iterable's own);
* ``epoch_feeds(order, start, placement)``: the epoch's mini-batches from ``start`` on, as
  ``(spec, data)`` pairs for the compiled step (``_step.Steps.step(spec)(..., data, ...)``);
* ``in_order(batch_size)``: every observation once, in order, as ``(inputs, targets)`` batches
  (validation; a smaller last batch included).

Array data goes to the device once; each training step gathers its mini-batch from the epoch's
order inside the compiled function (spec ``"gather"``). An iterable is re-iterated once per
epoch, or read as one stream with ``steps_per_epoch``; its batch size is its own and a batch
smaller than the first is dropped (spec ``"direct"``). Every array is checked on the host as it
is given (numbers, not strings or complex; observations present; class labels in range through
``check_targets``), so nothing fails later inside a compiled step.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sized

import jax.numpy as jnp
import numpy as np

from .._core import FormattedArray, OptionsError, SerializationError, dlarray, stripdims
from .._core import batches as _batches
from .._devices import HostArray, Placement, gather_rows
from .._network import Network
from .._scoring import CLASS_LOSSES, check_labels
from ._data_description import describe_array, describe_data

_STATISTICS_BATCHES = 8  # batches of an iterable used to compute input normalization statistics


def as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def is_array(x) -> bool:
    return isinstance(x, FormattedArray) or hasattr(x, "shape")


def looks_like_arrays(data) -> bool:
    """Whether ``data`` is ``(X, T)`` with arrays (or tuples of arrays), not batches."""
    return (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and all(is_array(v) or isinstance(v, (tuple, list)) for v in data)
        and all(is_array(x) for v in data for x in as_tuple(v))
    )


def arrays_of(who: str, X, what: str, expected: int | None = None, names=()) -> tuple:
    """``X`` (an array, or a tuple or list of them) as a tuple of checked arrays.

    A list longer than ``expected`` whose items are arrays of one shape is named for what it
    probably is: one array per observation, which must be stacked.
    """
    group = as_tuple(X)
    if isinstance(X, list) and X and not any(is_array(x) for x in X):
        raise OptionsError(
            f"{who}: {what} is a list of {type(X[0]).__name__}, not an array. Fix: "
            f"np.asarray({what.split()[-1]}, dtype=np.float32) (a ragged list, whose rows "
            "differ in length, cannot be one array: pad its rows to one length first)."
        )
    if expected is not None and len(group) != expected:
        shapes = {np.shape(stripdims(x)) for x in group if is_array(x)}
        per_observation = isinstance(X, list) and len(group) > expected and len(shapes) == 1
        if per_observation and all(is_array(x) for x in group):
            raise OptionsError(
                f"{who}: {what} is a {type(X).__name__} of {len(group)} arrays of shape "
                f"{shapes.pop()}, read as {len(group)} network inputs; the network has "
                f"{expected} input(s) {list(names)}. If each array is one observation, stack "
                f"them: {what.split()[-1]} = np.stack({what.split()[-1]})."
            )
        raise OptionsError(
            f"{who}: the network has {expected} input(s) {list(names)} but {what} has "
            f"{len(group)} array(s). Fix: pass a tuple with one array per input."
        )
    for k, x in enumerate(group):
        where = f"{who}: {what}" if len(group) == 1 else f"{who}: {what}[{k}]"
        if not is_array(x):
            raise OptionsError(
                f"{where} must be an array (or a tuple of arrays, one per network input / "
                f"target); got {type(x).__name__}. Fix: np.asarray(...) of numbers (a ragged "
                "list cannot be one array)."
            )
        _batches.check_data(x, what=where)
    return group


def source(who: str, data, net: Network, *, role: str, max_epochs: int = 1):
    """The source of ``data``: ``(X, T)`` arrays or an iterable of batches.

    Args:
      who: the caller, for messages.
      data: ``(X, T)`` or an iterable of ``(inputs..., targets...)`` batches.
      net: the network the data feeds (its inputs and their formats).
      role: ``"training"`` or ``"validation"`` (named in messages).
      max_epochs: how often an iterable is read (a one-shot iterator allows one).
    """
    if looks_like_arrays(data):
        X, T = data
        return ArraySource(who, X, T, net, role=role)
    return IterableSource(who, data, net, role=role, max_epochs=max_epochs)


class ArraySource:
    """In-memory data: inputs and targets with their batch axes."""

    data_batch_size = None  # only an iterable's batch size is learned from the data
    position = None  # only a stream has a position
    exhausted = False

    def __init__(self, who, X, T, net: Network, *, role: str = "training"):
        prefix = "" if role == "training" else "validation_data "
        inputs = arrays_of(who, X, f"{prefix}X", len(net.input_names), net.input_names)
        targets = arrays_of(who, T, f"{prefix}T")
        formats = [lo.format if lo else None for lo in net.input_layouts]
        self.input_axes = tuple(
            _batches.batch_axis(x, fmt, what=f"{who}: {prefix}X[{k}]")
            for k, (x, fmt) in enumerate(zip(inputs, formats, strict=True))
        )
        self.target_axes = tuple(
            _batches.batch_axis(t, what=f"{who}: {prefix}T[{k}]") for k, t in enumerate(targets)
        )
        counts = {_batches.count(x, a) for x, a in zip(inputs, self.input_axes, strict=True)}
        counts |= {_batches.count(t, a) for t, a in zip(targets, self.target_axes, strict=True)}
        if len(counts) != 1:
            raise OptionsError(
                f"{who}: the {role} inputs and targets have different numbers of observations "
                f"{sorted(counts)} along their batch axes. Fix: pass matching X and T."
            )
        self.count = counts.pop()
        if self.count == 0:
            raise OptionsError(
                f"{who}: the {role} data has no observations ({prefix}X[0] has shape "
                f"{np.shape(stripdims(inputs[0]))}, 0 along its batch axis "
                f"{self.input_axes[0]}). Fix: pass the data with its observations."
            )
        self.inputs, self.targets = inputs, targets
        self.device = None  # (inputs, targets) on the device, once placed

    def fingerprint(self) -> dict[str, str]:
        out = {}
        for name, group in (("X", self.inputs), ("T", self.targets)):
            for k, x in enumerate(group):
                out[f"data {name}[{k}]"] = describe_array(x)
        return out

    def first_inputs(self) -> tuple:
        return tuple(
            _batches.slice_host(x, 0, 1, a)
            for x, a in zip(self.inputs, self.input_axes, strict=True)
        )

    def statistics_sample(self, k):
        return self.inputs[k]

    def iterations(self, batch_size: int) -> int | None:
        """Full mini-batches per epoch (None where a subclass cannot tell before the epoch)."""
        return self.count // batch_size

    def setup(self, who: str, options, placement: Placement) -> int:
        """Check the options that apply to arrays and put the data on the device; returns the
        mini-batch size (arrays are batched by trainnet's ``mini_batch_size``)."""
        if options.steps_per_epoch is not None:
            raise OptionsError(
                f"{who}: steps_per_epoch={options.steps_per_epoch} applies to an iterable of "
                "batches; with arrays an epoch is one pass over the observations "
                f"({self.count} // mini_batch_size iterations). Fix: leave steps_per_epoch "
                "out, or set max_epochs."
            )
        batch_size = options.mini_batch_size
        if self.iterations(batch_size) == 0:
            raise OptionsError(
                f"{who}: mini_batch_size={batch_size} is larger than the "
                f"{self.count} training observations, so an epoch has no full mini-batch "
                f"(the last partial one is dropped). Fix: mini_batch_size <= {self.count}."
            )
        self.place(placement)
        return batch_size

    def use_target_check(self, check) -> None:
        """Check the targets (class labels in range, ...) now: they are all in memory."""
        check(self.targets, "T")

    def resume_at(self, checkpoint) -> None:
        """Arrays resume from the checkpoint's epoch order and iteration: nothing to skip here.
        The order must be one of these observations: a permutation of another length (a
        crafted checkpoint) would gather clamped indices silently.

        Raises:
          SerializationError: the order is not of ``count`` observations.
        """
        order = checkpoint.payload.get("order")
        if order is not None and np.size(order) != self.count:
            raise SerializationError(
                f"{checkpoint.source!r} is malformed: its epoch order is not a permutation of "
                f"the {self.count} training observations (it orders {np.size(order)}). Fix: use "
                "another copy of the checkpoint, or start the run again."
            )

    def statistics_of(self, k: int, fmt: str, placement: Placement):
        """The data of input ``k`` that its normalization statistics are computed from."""
        del fmt, placement
        return self.statistics_sample(k)

    def place(self, placement: Placement) -> None:
        """Put the data on the device once (training gathers its mini-batches there); in a
        multi-host run, keep it on the host (each process sends only its share of a batch)."""
        if placement.multi_host:
            self.host = (
                tuple(HostArray.of(x) for x in self.inputs),
                tuple(HostArray.of(t) for t in self.targets),
            )
            return
        self.device = (
            placement.put(tuple(_batches.as_device_array(x) for x in self.inputs)),
            placement.put(tuple(_batches.as_device_array(t) for t in self.targets)),
        )

    def epoch_order(self, epoch: int, shuffle: str, seed: tuple[int, ...]) -> np.ndarray:
        if shuffle == "never":
            return np.arange(self.count, dtype=np.int32)
        which = 1 if shuffle == "once" else epoch
        rng = np.random.default_rng([*seed, which])
        return rng.permutation(self.count).astype(np.int32)

    def epoch_feeds(self, order, start: int, placement: Placement, batch_size: int) -> Iterator:
        if placement.multi_host:
            yield from self._host_feeds(order, start, placement, batch_size)
            return
        spec = (
            "gather",
            batch_size,
            self.input_axes,
            self.target_axes,
            placement.padded(batch_size),
        )
        order = placement.put(order)
        assert self.device is not None, "place() puts the data on the device first"
        inputs, targets = self.device
        for b in range(start, self.count // batch_size):  # full mini-batches
            yield spec, (inputs, targets, order, np.int32(b))

    def _host_feeds(self, order, start, placement, batch_size):
        """Each mini-batch as global arrays, every process copying its own rows from the host."""
        padded = placement.padded(batch_size)
        keep = _batches.keep_first(batch_size, padded)
        spec = ("direct", self.input_axes, self.target_axes, keep)
        inputs, targets = self.host
        split_x, split_t = placement.divides(padded), placement.divides(batch_size)
        for b in range(start, self.count // batch_size):  # full mini-batches
            rows = np.asarray(order[b * batch_size : (b + 1) * batch_size])
            # padding: copies of the first observation, cut from the outputs in the step
            padded_rows = np.concatenate([rows, np.repeat(rows[:1], padded - batch_size)])
            xs = tuple(
                placement.host_batch(x, a, padded_rows, split=split_x)
                for x, a in zip(inputs, self.input_axes, strict=True)
            )
            ts = tuple(
                placement.host_batch(t, a, rows, split=split_t)
                for t, a in zip(targets, self.target_axes, strict=True)
            )
            yield spec, (xs, ts)

    def in_order(self, batch_size: int) -> Iterator[tuple[tuple, tuple]]:
        for start in range(0, self.count, batch_size):
            stop = min(start + batch_size, self.count)
            yield (
                tuple(
                    _batches.slice_host(x, start, stop, a)
                    for x, a in zip(self.inputs, self.input_axes, strict=True)
                ),
                tuple(
                    _batches.slice_host(t, start, stop, a)
                    for t, a in zip(self.targets, self.target_axes, strict=True)
                ),
            )


class IterableSource:
    """An iterable of batches ``(*inputs, *targets)``.

    By default it is re-iterated once per epoch. With ``steps_per_epoch`` it is read as one
    stream across epochs (each epoch takes the next batches; a re-iterable starts a new pass
    when it ends, a one-shot iterator that ends sets ``exhausted``); ``position`` counts the
    items read from the current pass, so a resume can skip them.
    """

    count = None

    def __init__(
        self,
        who,
        data,
        net: Network,
        *,
        role: str = "training",
        max_epochs: int = 1,
        steps_per_epoch: int | None = None,
    ):
        what = "validation_data" if role == "validation" else "data"
        if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
            raise OptionsError(
                f"{who}: {what} must be an iterable of (inputs..., targets...) batches; got "
                f"{type(data).__name__}."
            )
        self.one_shot = iter(data) is data
        if self.one_shot and max_epochs > 1 and steps_per_epoch is None:
            raise OptionsError(
                f"{who}: {what} is a one-shot iterator, which cannot be read again for "
                f"max_epochs={max_epochs}. Fix: pass a re-iterable (a list, or an object whose "
                "__iter__ starts over), max_epochs=1, or steps_per_epoch=N to read it as one "
                "stream of N batches per epoch."
            )
        self.who = who
        self.role = role
        self.data = data
        self.num_inputs = len(net.input_names)
        self.formats = tuple(lo.format if lo else None for lo in net.input_layouts)
        self.length = len(data) if isinstance(data, Sized) else None
        self.steps = steps_per_epoch
        self.data_batch_size = None  # learned from the first full batch
        self.check_targets = None  # check_targets(ts, what): e.g. class labels in range
        self.position = 0  # items read from the current pass of the stream
        self.exhausted = False  # a one-shot stream ended
        self._stream = None
        self._peeked: list = []  # items of a one-shot iterator read before training

    def split(self, item) -> tuple[tuple, tuple]:
        """A batch as (inputs, targets), checked (host-side, before anything runs)."""
        what = "validation_data" if self.role == "validation" else "data"
        if is_array(item):
            raise OptionsError(
                f"{self.who}: each batch of the {what} iterable must be a tuple (inputs..., "
                f"targets...); got one array of shape {np.shape(stripdims(item))}: inputs "
                "without targets? Fix: yield (X, T) batches (or pass validation_data=(X, T))."
            )
        item = as_tuple(item)
        if len(item) <= self.num_inputs:
            raise OptionsError(
                f"{self.who}: each batch must be a tuple (inputs..., targets...) with "
                f"{self.num_inputs} input(s) and at least one target; got {len(item)} value(s)."
            )
        for k, x in enumerate(item):
            kind = "input" if k < self.num_inputs else "target"
            where = f"{self.who}: a batch {kind} of the {what} iterable"
            if not is_array(x):
                raise OptionsError(
                    f"{where} must be an array; got {type(x).__name__}. Fix: np.asarray(...) of "
                    "numbers (a ragged list cannot be one array)."
                )
            _batches.check_data(x, what=where)
        xs, ts = item[: self.num_inputs], item[self.num_inputs :]
        if self.check_targets is not None:
            self.check_targets(ts, f"the targets of a {what} batch")
        return xs, ts

    def axes(self, xs, ts) -> tuple[tuple[int, ...], tuple[int, ...]]:
        in_axes = tuple(
            _batches.batch_axis(x, fmt, what=f"{self.who}: batch input {k}")
            for k, (x, fmt) in enumerate(zip(xs, self.formats, strict=True))
        )
        t_axes = tuple(_batches.batch_axis(t, what=f"{self.who}: batch target") for t in ts)
        return in_axes, t_axes

    def fingerprint(self) -> dict[str, str]:
        return {"data": describe_data(self.data, self.role)}

    def _peek(self, n: int) -> list:
        """The first ``n`` items; a one-shot iterator keeps them to give them again."""
        if not self.one_shot:
            return list(itertools.islice(iter(self.data), n))
        self._peeked.extend(itertools.islice(self.data, max(0, n - len(self._peeked))))
        return self._peeked[:n]

    def _pass(self) -> Iterator:
        """A new pass over the data (a one-shot iterator: what was peeked, then the rest)."""
        if not self.one_shot:
            return iter(self.data)
        peeked, self._peeked = self._peeked, []
        return itertools.chain(peeked, self.data)

    def first_inputs(self) -> tuple:
        for item in self._peek(1):
            return self.split(item)[0]
        raise OptionsError(f"{self.who}: the {self.role} data iterable is empty.")

    def statistics_sample(self, k):
        parts = [self.split(item)[0][k] for item in self._peek(_STATISTICS_BATCHES)]
        axis = _batches.batch_axis(parts[0], self.formats[k])
        return _batches.concatenate([_batches.as_device_array(p) for p in parts], axis)

    def setup(self, who: str, options, placement: Placement) -> None:
        """An iterable brings its own batches: there is no mini-batch size to apply."""
        del who, options, placement

    def use_target_check(self, check) -> None:
        """Check each batch's targets as it is read."""
        self.check_targets = check

    def unread(self) -> None:
        """Forget the last full batch read: trainnet read it ahead for a call and stopped
        before training on it, so a checkpoint's position must name it as the next one (a
        stream's position; other iterables are re-read from the count of trained batches)."""
        if self.steps is not None and self.position:
            self.position -= 1

    def resume_at(self, checkpoint) -> None:
        """Continue the stream where the checkpoint left it, with the batch size it had."""
        self.data_batch_size = checkpoint.data_batch_size
        self.position = checkpoint.data_position or 0

    def statistics_of(self, k: int, fmt: str, placement: Placement):
        """As for arrays; in a multi-host run each process holds its own batches, so the
        statistics are of all processes' samples."""
        sample = self.statistics_sample(k)
        return gather_batch(sample, fmt) if placement.multi_host else sample

    def iterations(self, batch_size=None) -> int | None:
        return self.steps if self.steps is not None else self.length

    def epoch_order(self, epoch, shuffle, seed) -> None:
        return None  # the iterable's own order

    def epoch_feeds(self, order, start: int, placement: Placement, batch_size=None) -> Iterator:
        if self.steps is None:
            skip = start  # full batches of this epoch trained on before a resume
            for feed in self._full_batches(self._pass(), placement):
                if skip:
                    skip -= 1
                    continue
                yield feed
            return
        if self._stream is None:  # the first epoch of this call: skip what a resume has read
            self._stream = self._pass()
            for _ in itertools.islice(self._stream, self.position):
                pass
        remaining, restarted = self.steps - start, False
        while remaining > 0:
            got = False
            for feed in self._full_batches(self._stream, placement, count=True):
                got = True
                yield feed
                remaining -= 1
                if remaining == 0:
                    return
            if self.one_shot:
                self.exhausted = True
                return
            if restarted and not got:
                raise OptionsError(f"{self.who}: the training data iterable is empty.")
            self._stream, self.position, restarted = self._pass(), 0, True

    def _full_batches(self, items, placement: Placement, *, count: bool = False) -> Iterator:
        for item in items:
            if count:
                self.position += 1
            xs, ts = self.split(item)
            in_axes, t_axes = self.axes(xs, ts)
            size = _batches.count(xs[0], in_axes[0])
            if size == 0:
                raise OptionsError(
                    f"{self.who}: a batch of the data has no observations (input shape "
                    f"{np.shape(stripdims(xs[0]))}). Fix: leave empty batches out."
                )
            if self.data_batch_size is None:  # (global_batch checked it across processes)
                self.data_batch_size = size
            if size < self.data_batch_size:
                continue
            if size != self.data_batch_size:
                raise OptionsError(
                    f"{self.who}: the data's batches have different sizes "
                    f"({self.data_batch_size} then {size}); only a smaller last batch is allowed "
                    "(it is dropped)."
                )
            if placement.multi_host:  # each process yields its own share of the global batch
                keep, xs, ts = self._shares(xs, ts, size, placement)
            else:
                padded = placement.padded(size)
                keep = _batches.keep_first(size, padded)
                if padded > size:  # copies of the first observation, cut from the outputs
                    xs = [
                        _batches.pad_with_first(x, padded, a)
                        for x, a in zip(xs, in_axes, strict=True)
                    ]
                xs = placement.put(tuple(_batches.as_device_array(x) for x in xs))
                ts = placement.put(tuple(_batches.as_device_array(t) for t in ts))
            yield ("direct", in_axes, t_axes, keep), (xs, ts)

    def _shares(self, xs, ts, size: int, placement: Placement):
        """This process's share of a global batch, joined with the other processes' shares:
        ``(keep, xs, ts)``. A global batch that does not split over the mesh has every share
        padded to the same size (inputs and targets; ``keep`` says which rows the step keeps),
        or, when it runs replicated, every share gathered into every process."""
        processes = placement.processes
        total = size * processes
        if placement.divides(total):
            return (None, *placement.local_batch(xs, ts, self.formats))
        padded = placement.padded(total, processes)
        if padded > total:
            rows = padded // processes
            keep = _batches.Keep(processes, size, rows, targets=True)
            return (keep, *placement.local_batch(xs, ts, self.formats, rows))
        xs = tuple(gather_batch(x, fmt) for x, fmt in zip(xs, self.formats, strict=True))
        ts = tuple(gather_batch(t, None) for t in ts)
        return (None, *placement.put_batch(xs, ts, self.formats))

    def in_order(self, batch_size=None) -> Iterator[tuple[tuple, tuple]]:
        for item in self._pass():
            yield self.split(item)


def global_batch(data, placement: Placement, batch_size: int | None) -> tuple[int, int]:
    """The global mini-batch size, and how many equal shares it is fed in.

    Arrays: ``(batch_size, 1)``. An iterable: its first batch's size; in a multi-host run each
    process yields its own share, so the size times the processes, in as many shares. Every
    process must yield shares of one size (they are joined, and padded alike, into one global
    batch): the first batches' sizes are compared across the processes (one small
    collective), and shares of different sizes raise a named error in every process.

    Raises:
      OptionsError: the processes' first batches have different sizes.
    """
    if isinstance(data, ArraySource) or placement.mesh is None:
        return batch_size or 1, 1
    x = data.first_inputs()[0]
    size = _batches.count(x, _batches.batch_axis(x, data.formats[0]))
    if not placement.multi_host:
        return size, 1
    sizes = [int(n) for n in gather_rows(np.asarray([size]), 0)]
    if len(set(sizes)) > 1:
        each = ", ".join(f"process {p}: {n}" for p, n in enumerate(sizes))
        raise OptionsError(
            f"{data.who}: execution_environment='multi-host' joins every process's own batch "
            "into one global batch per step, so every process must yield batches of one size; "
            f"their first batches have different sizes ({each}). Fix: yield batches of the "
            f"same size in every process (e.g. {min(sizes)} rows each)."
        )
    return size * placement.processes, placement.processes


def label_check(who, net, loss_fn, metrics):
    """``check(targets, what)``: integer class labels within the network's classes, on the host.

    None when neither the loss nor a metric reads class labels, or the output's classes are not
    known. Checked once per data set (arrays) or batch (iterables), never inside the step.
    """
    if loss_fn not in CLASS_LOSSES and not any(m.class_labels for m in metrics):
        return None
    if net.recorded_layouts is None:
        return None
    i, j = net.output_ports()[0]
    layout = net.recorded_layouts[i][1][j]
    ndim = len(layout.shape)
    c = layout.format.index("C") if "C" in layout.format else (ndim - 1 if ndim >= 2 else None)
    if c is None or layout.shape[c] is None:
        return None
    classes = max(layout.shape[c], 2)  # one channel: binary, labels 0 and 1

    def check(targets, what):
        t = targets[0]
        dtype = getattr(stripdims(t), "dtype", None)
        labels = dtype is not None and jnp.issubdtype(dtype, jnp.integer)
        if labels and len(np.shape(stripdims(t))) == ndim - 1:
            check_labels(who, t, classes, what=what)

    return check


UNSIZED_VALIDATION_BYTES = 1 << 30  # validation data read from an iterable without len()


def validation_batches(who, options, net: Network, placement: Placement, check_targets):
    """The validation data as device batches, read and placed once (for every validation).

    At most ``validation_steps`` batches; without it, an iterable without ``len()`` may yield
    up to ``UNSIZED_VALIDATION_BYTES`` (it could be endless). In a multi-host run, arrays are
    the whole validation set in every process and an iterable yields each process's own share
    of every batch (the processes' shares in process order make the batch).

    Returns:
      ``(batches, note)``: ``note`` says which batches run replicated because they do not
      split over the mesh (None when all do).
    """
    data = source(who, options.validation_data, net, role="validation")
    if isinstance(data, IterableSource):
        data.check_targets = check_targets
    elif check_targets is not None:
        check_targets(data.targets, "validation_data T")
    formats = [lo.format if lo else None for lo in net.input_layouts]
    unsized = isinstance(data, IterableSource) and data.length is None
    local = placement.multi_host and isinstance(data, IterableSource)
    batches, read, observations, whole = [], 0, 0, []
    for xs, ts in itertools.islice(
        data.in_order(options.mini_batch_size), options.validation_steps
    ):
        read += sum(stripdims(x).nbytes for x in (*xs, *ts))
        if unsized and options.validation_steps is None and read > UNSIZED_VALIDATION_BYTES:
            raise OptionsError(
                f"{who}: validation_data is an iterable without len() that has yielded "
                f"{len(batches) + 1} batches ({read / 2**30:.1f} GiB) and goes on; validation "
                "data is read once and kept. Fix: validation_steps=N (at most N batches; an "
                "endless generator needs it), or a finite list of batches."
            )
        n = _batches.count(ts[0], _batches.batch_axis(ts[0])) * (
            placement.processes if local else 1
        )
        if local and placement.divides(n):
            batches.append(placement.local_batch(xs, ts, formats))
        else:
            if local:  # the processes' shares, gathered into the whole batch in every process
                xs = tuple(gather_batch(x, fmt) for x, fmt in zip(xs, formats, strict=True))
                ts = tuple(gather_batch(t, None) for t in ts)
            batches.append(placement.put_batch(xs, ts, formats))
        if not placement.divides(n):
            whole.append(n)
        observations += n
    if observations == 0:
        raise OptionsError(
            f"{who}: validation_data has no observations. Fix: pass validation data, or leave "
            "validation_data out."
        )
    note = None
    if whole:
        note = (
            f"Validation: {len(whole)} batch(es) of {sorted(set(whole))} observations do not "
            f"split over the {placement.data_size} parts of the mesh's 'data' axis; they run "
            "replicated (each device computes them whole; the results are the same)."
        )
    return batches, note


def gather_batch(x, fmt):
    """Every process's share of a batch, joined along the batch axis (a collective)."""
    axis = _batches.batch_axis(x, fmt)
    joined = gather_rows(np.asarray(stripdims(x)), axis)
    return dlarray(joined, x.format) if isinstance(x, FormattedArray) else joined
