"""Training and validation data behind one interface: in-memory arrays, or an iterable of batches.

:func:`source` makes an :class:`ArraySource` from ``(X, T)`` arrays or an
:class:`IterableSource` from an iterable of ``(inputs..., targets...)`` batches. Both answer what
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
epoch; its batch size is its own and a batch smaller than the first is dropped (spec
``"direct"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from . import _batches
from ._errors import OptionsError
from ._fingerprint import describe_array, describe_data
from ._format import FormattedArray
from ._network import Network
from ._sharding import Placement

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
        return ArraySource(who, *data, net, role=role)
    return IterableSource(who, data, net, role=role, max_epochs=max_epochs)


class ArraySource:
    """In-memory data: inputs and targets with their batch axes."""

    data_batch_size = None  # only an iterable's batch size is learned from the data

    def __init__(self, who, X, T, net: Network, *, role: str = "training"):
        inputs, targets = as_tuple(X), as_tuple(T)
        prefix = "" if role == "training" else "validation_data "
        for name, group in (("X", inputs), ("T", targets)):
            for x in group:
                if not is_array(x):
                    raise OptionsError(
                        f"{who}: {prefix}{name} must be an array (or a tuple of arrays, one per "
                        f"network input / target); got {type(x).__name__}."
                    )
        if len(inputs) != len(net.input_names):
            raise OptionsError(
                f"{who}: the network has {len(net.input_names)} input(s) {list(net.input_names)}"
                f" but {prefix}X has {len(inputs)} array(s). Fix: pass a tuple with one array per "
                "input."
            )
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

    def iterations(self, batch_size: int) -> int:
        return self.count // batch_size

    def place(self, placement: Placement) -> None:
        """Put the data on the device once (training gathers its mini-batches there)."""
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
        spec = ("gather", batch_size, self.input_axes, self.target_axes)
        order = placement.put(order)
        inputs, targets = self.device
        for b in range(start, self.iterations(batch_size)):
            yield spec, (inputs, targets, order, np.int32(b))

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
    """An iterable of batches ``(*inputs, *targets)``; re-iterated once per epoch."""

    count = None

    def __init__(self, who, data, net: Network, *, role: str = "training", max_epochs: int = 1):
        what = "data" if role == "training" else "validation_data"
        if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
            raise OptionsError(
                f"{who}: {what} must be an iterable of (inputs..., targets...) batches; got "
                f"{type(data).__name__}."
            )
        if iter(data) is data and max_epochs > 1:
            raise OptionsError(
                f"{who}: {what} is a one-shot iterator, which cannot be read again for "
                f"max_epochs={max_epochs}. Fix: pass a re-iterable (a list, or an object whose "
                "__iter__ starts over), or max_epochs=1."
            )
        self.who = who
        self.role = role
        self.data = data
        self.num_inputs = len(net.input_names)
        self.formats = tuple(lo.format if lo else None for lo in net.input_layouts)
        self.length = len(data) if hasattr(data, "__len__") else None
        self.data_batch_size = None  # learned from the first full batch

    def split(self, item) -> tuple[tuple, tuple]:
        item = as_tuple(item)
        if len(item) <= self.num_inputs:
            raise OptionsError(
                f"{self.who}: each batch must be a tuple (inputs..., targets...) with "
                f"{self.num_inputs} input(s) and at least one target; got {len(item)} value(s)."
            )
        return item[: self.num_inputs], item[self.num_inputs :]

    def axes(self, xs, ts) -> tuple[tuple[int, ...], tuple[int, ...]]:
        in_axes = tuple(
            _batches.batch_axis(x, fmt, what=f"{self.who}: batch input {k}")
            for k, (x, fmt) in enumerate(zip(xs, self.formats, strict=True))
        )
        t_axes = tuple(_batches.batch_axis(t, what=f"{self.who}: batch target") for t in ts)
        return in_axes, t_axes

    def fingerprint(self) -> dict[str, str]:
        return {"data": describe_data(self.data, self.role)}

    def first_inputs(self) -> tuple:
        for item in self.data:
            return self.split(item)[0]
        raise OptionsError(f"{self.who}: the {self.role} data iterable is empty.")

    def statistics_sample(self, k):
        parts = []
        for n, item in enumerate(self.data):
            if n >= _STATISTICS_BATCHES:
                break
            parts.append(self.split(item)[0][k])
        axis = _batches.batch_axis(parts[0], self.formats[k])
        return _batches.concatenate([_batches.as_device_array(p) for p in parts], axis)

    def iterations(self, batch_size=None) -> int | None:
        return self.length

    def epoch_order(self, epoch, shuffle, seed) -> None:
        return None  # the iterable's own order

    def epoch_feeds(self, order, start: int, placement: Placement, batch_size=None) -> Iterator:
        skip = start  # full batches of this epoch trained on before a resume
        for item in self.data:
            xs, ts = self.split(item)
            in_axes, t_axes = self.axes(xs, ts)
            size = _batches.count(xs[0], in_axes[0])
            if self.data_batch_size is None:
                self.data_batch_size = size
                placement.check_batch(size, what="the batch size of the data")
            if size < self.data_batch_size:
                continue
            if size != self.data_batch_size:
                raise OptionsError(
                    f"{self.who}: the data's batches have different sizes "
                    f"({self.data_batch_size} then {size}); only a smaller last batch is allowed "
                    "(it is dropped)."
                )
            if skip:
                skip -= 1
                continue
            xs = placement.put(tuple(_batches.as_device_array(x) for x in xs))
            ts = placement.put(tuple(_batches.as_device_array(t) for t in ts))
            yield ("direct", in_axes, t_axes), (xs, ts)

    def in_order(self, batch_size=None) -> Iterator[tuple[tuple, tuple]]:
        for item in self.data:
            yield self.split(item)
