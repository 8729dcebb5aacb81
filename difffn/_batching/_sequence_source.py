"""Sequence data in training: ``trainnet``'s data source for lists of sequences, and the masks
in its compiled step.

`SequenceData` reads inputs (lists of sequences, or arrays for inputs that are not
sequences) and targets (one per sequence, or one per time step), checks them on the host, and
makes each mini-batch rectangular (``_sequences``). `SequenceSource` is the training
source ``trainnet`` uses when an input is a list of sequences: it feeds the compiled step the
padded batches with their masks (spec ``"sequences"``), and, when sequences are split
(``sequence_length=L``), the recurrent state from one chunk to the next. The functions at the end
are what the step does with the masks: which outputs they mask, the masked loss and metrics, and
the recurrent state carried between chunks.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax.numpy as jnp
import numpy as np

from .._core import FormattedArray, OptionsError, dlarray, has_method, stripdims
from .._core import batches as _batches
from .._core import mask as _mask
from .._network import Network
from .._scoring import LOSSES, takes_mask
from ._data_description import describe_array
from ._sequences import (
    SequenceOptions,
    Window,
    check_sequences,
    check_step_targets,
    describe_sequences,
    is_sequence_list,
    observation_format,
    place,
    windows,
)
from ._sources import ArraySource, arrays_of


def has_sequences(X, net: Network) -> bool:
    """Whether ``X`` (an input, or a tuple of one per input) holds a list of sequences."""
    formats = [lo.format if lo else None for lo in net.input_layouts]
    group = X if isinstance(X, tuple) else (X,)
    return any(is_sequence_list(x, f) for x, f in zip(group, formats, strict=False))


class SequenceData:
    """Inputs and targets of one data set with lists of sequences, made rectangular per batch.

    Each input is ``("sequences", arrays, time axis of an observation, format)`` or
    ``("array", array, batch axis, format)``; each target ``("step", arrays)`` (one per time
    step, aligned with the first sequence input) or ``("sequence", array, batch axis)``.
    """

    def __init__(self, who, X, T, net: Network, options: SequenceOptions, *, role="training"):
        self.who, self.options = who, options
        prefix = "" if role == "training" else "validation_data "
        formats = [lo.format if lo else None for lo in net.input_layouts]
        group = X if isinstance(X, tuple) else (X,)
        if len(group) != len(formats):
            raise OptionsError(
                f"{who}: the network has {len(formats)} input(s) {list(net.input_names)} but "
                f"{prefix}X has {len(group)}. Fix: a tuple with one list of sequences (or "
                "array) per input."
            )
        self.inputs = []
        for k, (x, fmt) in enumerate(zip(group, formats, strict=True)):
            what = f"{prefix}X" if len(group) == 1 else f"{prefix}X[{k}]"
            if is_sequence_list(x, fmt):
                fmt = fmt or "BTC"
                seqs = check_sequences(who, x, fmt, what)
                self.inputs.append(("sequences", seqs, observation_format(fmt).index("T"), fmt))
            else:
                (array,) = arrays_of(who, x, what)
                axis = _batches.batch_axis(array, fmt, what=what)
                self.inputs.append(("array", array, axis, fmt))
        first = next(part for part in self.inputs if part[0] == "sequences")
        self.lengths = np.array([s.shape[first[2]] for s in first[1]])
        self.count = len(self.lengths)
        for k, part in enumerate(self.inputs):
            n = len(part[1]) if part[0] == "sequences" else _batches.count(part[1], part[2])
            if n != self.count:
                raise OptionsError(
                    f"{who}: {prefix}X[{k}] has {n} observations but {prefix}X[0] has "
                    f"{self.count}. Fix: the same observations for every input."
                )
        self._check_min_length(net)
        self.targets = [] if T is None else self._read_targets(T, prefix)

    def _check_min_length(self, net: Network) -> None:
        for layer, part in zip(net.input_layers, self.inputs, strict=True):
            least = getattr(layer, "min_length", None)
            if part[0] == "sequences" and least is not None and layer is not None:
                lengths = [s.shape[part[2]] for s in part[1]]
                if min(lengths) < least:
                    i = int(np.argmin(lengths))
                    raise OptionsError(
                        f"{self.who}: sequence {i} has {lengths[i]} time steps but the input "
                        f"layer {layer.name!r} has min_length={least} (MATLAB's MinLength). "
                        "Fix: leave shorter sequences out, or lower min_length."
                    )

    def _read_targets(self, T, prefix: str) -> list:
        group = T if isinstance(T, tuple) else (T,)
        targets = []
        for k, t in enumerate(group):
            what = f"{prefix}T" if len(group) == 1 else f"{prefix}T[{k}]"
            if isinstance(t, list) and t and all(np.ndim(stripdims(v)) >= 1 for v in t):
                targets.append(("step", check_step_targets(self.who, t, self.lengths, what)))
                continue
            (array,) = arrays_of(self.who, np.asarray(t) if isinstance(t, list) else t, what)
            axis = _batches.batch_axis(array, what=f"{self.who}: {what}")
            if _batches.count(array, axis) != self.count:
                raise OptionsError(
                    f"{self.who}: {what} has {_batches.count(array, axis)} targets for "
                    f"{self.count} sequences. Fix: one target per sequence (an array), or one "
                    "per time step (a list with one array per sequence)."
                )
            targets.append(("sequence", array, axis))
        return targets

    @property
    def per_step(self) -> bool:
        """Whether a target has one value per time step."""
        return any(t[0] == "step" for t in self.targets)

    def fingerprint(self) -> dict[str, str]:
        out = {}
        for k, part in enumerate(self.inputs):
            seq = part[0] == "sequences"
            out[f"data X[{k}]"] = describe_sequences(part[1]) if seq else describe_array(part[1])
        for k, part in enumerate(self.targets):
            step = part[0] == "step"
            out[f"data T[{k}]"] = describe_sequences(part[1]) if step else describe_array(part[1])
        return out

    def windows(self, index, options: SequenceOptions | None = None) -> list[Window]:
        return windows(self.lengths[index], options or self.options)

    def batch(self, index, window: Window):
        """``(xs, ts, masks)`` of observations ``index`` in ``window`` (host arrays; a mask per
        input, None for inputs that are not sequences)."""
        direction, value = self.options.direction, self.options.padding_value
        xs, masks = [], []
        for kind, data, axis, fmt in self.inputs:
            if kind == "array":
                xs.append(_batches.take(data, index, axis) if isinstance(data, FormattedArray)
                          else np.take(np.asarray(data), index, axis=axis))  # fmt: skip
                masks.append(None)
                continue
            out, mask = place([data[i] for i in index], axis, window, direction, value)
            xs.append(dlarray(np.moveaxis(out, 0, fmt.index("B")), fmt))
            masks.append(mask)
        ts = []
        for target in self.targets:
            if target[0] == "step":
                ts.append(place([target[1][i] for i in index], 0, window, direction, 0)[0])
            else:
                ts.append(np.take(np.asarray(stripdims(target[1])), index, axis=target[2]))
        return tuple(xs), tuple(ts), tuple(masks)

    def label_arrays(self) -> tuple:
        """The targets as arrays for the host's class-label check (per-step ones padded)."""
        longest = int(self.lengths.max())
        whole = Window(0, longest, longest, longest)
        return tuple(
            place(t[1], 0, whole, "right", 0)[0] if t[0] == "step" else t[1] for t in self.targets
        )


_WHOLE = SequenceOptions("longest", 0.0, "right", "none")  # whole sequences, no buckets


class SequenceSource(ArraySource):
    """``trainnet``'s training data when an input is a list of sequences (in memory, as an
    `ArraySource`, with mini-batches padded on the host and fed with their masks)."""

    def __init__(self, who, X, T, net: Network, options: SequenceOptions):
        self.data = SequenceData(who, X, T, net, options)
        self.count = self.data.count
        self.inputs = tuple(part[1] for part in self.data.inputs)
        self.chunked = not isinstance(options.length, str)
        self.carried = None  # the recurrent state after the last chunk (split sequences)
        self.mid_batch = False  # between two chunks of one mini-batch
        self.placement = None

    @property
    def targets(self) -> tuple:
        return self.data.label_arrays()

    def fingerprint(self) -> dict[str, str]:
        return self.data.fingerprint()

    def first_inputs(self) -> tuple:
        index = np.array([0])
        return self.data.batch(index, self.data.windows(index, _WHOLE)[0])[0]

    def statistics_sample(self, k):
        kind, data, axis, fmt = self.data.inputs[k]
        if kind == "array":
            return data
        whole = np.concatenate(data, axis=axis)[None]  # the real steps only
        return dlarray(np.moveaxis(whole, 0, fmt.index("B")), fmt)

    def iterations(self, batch_size: int) -> int | None:
        full = self.count // batch_size
        # Split sequences make a number of chunks per mini-batch that depends on its lengths.
        return None if self.chunked and full else full

    def setup(self, who: str, options, placement) -> int:
        if placement.mesh is not None:
            raise OptionsError(
                f"{who}: lists of sequences of different lengths train on one device; got "
                f"execution_environment={options.execution_environment!r}. Fix: pad them to one "
                "length (df.padsequences) and pass the padded array, or use 'auto'."
            )
        return super().setup(who, options, placement)

    def place(self, placement) -> None:
        self.placement = placement

    def epoch_feeds(self, order, start: int, placement, batch_size: int) -> Iterator:
        in_axes = tuple(
            fmt.index("B") if kind == "sequences" else axis
            for kind, _, axis, fmt in self.data.inputs
        )
        t_axes = tuple(0 if t[0] == "step" else t[2] for t in self.data.targets)
        iteration = 0
        for b in range(self.count // batch_size):
            index = order[b * batch_size : (b + 1) * batch_size]
            chunks = self.data.windows(index)
            for c, window in enumerate(chunks):
                iteration += 1
                if iteration <= start:
                    continue
                continued = c > 0 and self.carried is not None
                self.mid_batch = c + 1 < len(chunks)
                xs, ts, masks = self.data.batch(index, window)
                xs = placement.put(tuple(_batches.as_device_array(x) for x in xs))
                ts = placement.put(tuple(jnp.asarray(t) for t in ts))
                masks = placement.put(tuple(None if m is None else jnp.asarray(m) for m in masks))
                spec = ("sequences", in_axes, t_axes, self.chunked, continued)
                yield spec, (xs, ts, masks, self.carried if continued else None)
        self.mid_batch = False

    def in_order(self, batch_size: int) -> Iterator:
        """Whole sequences (bucketed) in order, for validation: ``(xs, ts, masks, weight)``,
        ``weight`` the batch's share of the loss average (real steps for per-step targets)."""
        whole = SequenceOptions("longest", 0.0, "right", self.data.options.bucketing)
        for start in range(0, self.count, batch_size):
            index = np.arange(start, min(start + batch_size, self.count))
            window = self.data.windows(index, whole)[0]
            xs, ts, masks = self.data.batch(index, window)
            steps = int(self.data.lengths[index].sum())
            yield xs, ts, masks, steps if self.data.per_step else len(index)


def validation_batches(who, options, net: Network, placement, check_targets) -> list:
    """The validation data of lists of sequences as device batches ``(xs, ts, masks, weight)``
    (whole sequences, padded as the training data, bucketed), read and placed once."""
    X, T = options.validation_data
    source = SequenceSource(who, X, T, net, SequenceOptions.of(options))
    if check_targets is not None:
        check_targets(source.targets, "validation_data T")
    batches = []
    for xs, ts, masks, weight in source.in_order(options.mini_batch_size):
        xs = placement.put(tuple(_batches.as_device_array(x) for x in xs))
        ts = placement.put(tuple(jnp.asarray(t) for t in ts))
        masks = placement.put(tuple(None if m is None else jnp.asarray(m) for m in masks))
        batches.append((xs, ts, masks, weight))
    return batches


# -- the masks in the compiled step -------------------------------------------------------------


def output_masks(outputs, out_masks, masks, chunked: bool) -> tuple:
    """The mask of each network output for the loss and metrics: its padding mask when it has
    the input's time steps; for an output without them (an LSTM's ``"last"``), only for split
    sequences, which observations have data in this chunk."""
    first = next((m for m in masks if m is not None), None)
    result = []
    for y, m in zip(outputs, out_masks, strict=True):
        if m is None and chunked and first is not None and _mask.value_axes(y)[0] is not None:
            observed = jnp.any(first, axis=1)
            m = observed if _mask.fits(observed, y) else None
        result.append(m)
    return tuple(result)


def loss_mask(loss, label: str, masks) -> dict:
    """The keyword arguments that pass a step's masks to the loss: ``{}`` without masks, else
    ``{"mask": ...}`` (one mask per output; ``df.losses`` take ``mask=``) and the loss then
    counts only the real steps."""
    if all(m is None for m in masks):
        return {}
    if loss not in LOSSES.values() and not takes_mask(loss):
        raise OptionsError(
            f"trainnet: the loss {label!r} is computed on padded sequences but takes no mask, so "
            "padded steps would count. Fix: give it a parameter mask=None (a boolean (batch, "
            "time) array, True at real steps; pass it on to df.losses functions), or use a "
            "built-in loss."
        )
    return {"mask": masks[0] if len(masks) == 1 else masks}


def metric_value(metric, y, t, mask):
    """A metric of one batch, over the real steps when there is a mask."""
    if mask is None:
        return metric(y, t)
    _require_mask(metric)
    return metric(y, t, mask=mask)


def metric_update(metric, y, t, mask):
    """A metric's state of one batch (validation), over the real steps with a mask."""
    if mask is None:
        return metric.update(metric.init(y), y, t)
    _require_mask(metric)
    return metric.update(metric.init(y), y, t, mask=mask)


def _require_mask(metric) -> None:
    if not takes_mask(metric.update):
        raise OptionsError(
            f"the metric {metric.name!r} is scored on padded sequences but its update "
            "takes no mask, so padded steps would count. Fix: give update a parameter mask=None "
            "(see df.metrics.Metric)."
        )


def carried_states(net: Network, states) -> tuple:
    """The new state of each layer that resets between mini-batches (recurrent layers; None for
    the others): what the next chunk of split sequences starts from."""
    return tuple(
        s if layer.state_names and has_method(layer, "reset_state") else None
        for layer, s in zip(net.layers, states, strict=True)
    )


def continue_from(net: Network, carried) -> Network:
    """``net`` with the recurrent states of the previous chunk."""
    return net.with_layer_states(
        [
            layer._state_values() if s is None else s
            for layer, s in zip(net.layers, carried, strict=True)
        ]
    )
