"""``minibatchpredict`` and ``testnet`` on lists of sequences of different lengths.

Each mini-batch is made rectangular as in training (``_sequences``: padded to its longest
sequence, truncated to its shortest, or split into chunks, with length buckets) and run with its
padding masks through ``Network.run``, so every padded length is one compiled trace of the
network's cache. Split sequences run chunk after chunk, the recurrent state carried from one to
the next; each mini-batch starts from the network's own state. A last mini-batch smaller than
the others is filled up with copies of its last sequence (their outputs are dropped), so it has
the others' shape.

Outputs with the input's time steps come back per sequence, their padding removed: a list with
one array per sequence in the output's format without ``B`` (``uniform_output=False``), or
padded again to the longest sequence of the data and stacked along ``B`` (``True``, MATLAB's
``UniformOutput`` default), the padding holding ``sequence_padding_value``. Outputs without time
steps (an LSTM's ``"last"``) are stacked along ``B``; for split sequences they are those of the
last chunk.
"""

from __future__ import annotations

import numpy as np

from .._core import OptionsError, dlarray, stripdims
from .._network import Network
from ._sequence_source import SequenceData, carried_states, continue_from
from ._sequences import SequenceOptions, Window, place


def predict(
    net: Network, X, *, who: str, size: int, outputs, acceleration, options, uniform_output
) -> tuple:
    """The outputs for every sequence (one entry per network output)."""
    if not isinstance(uniform_output, bool):
        raise OptionsError(f"{who}: uniform_output must be True or False; got {uniform_output!r}.")
    data = SequenceData(who, X, None, net, options, role="prediction")
    return _assemble(_predict_data(net, data, size, outputs, acceleration), options, uniform_output)


def for_scoring(net: Network, X, T, *, who: str, size: int, options: SequenceOptions) -> tuple:
    """``(outputs, targets, mask)`` of sequence data, padded whole for ``testnet``'s metrics:
    the mask is None when the first output has no time steps."""
    data = SequenceData(who, X, T, net, options)
    results = _predict_data(net, data, size, None, "auto")
    kind, _ = results[0]
    target = data.targets[0]
    if (kind == "step") != (target[0] == "step"):
        has = "one per time step" if kind == "step" else "one per sequence"
        given = "per time step (a list)" if target[0] == "step" else "per sequence (an array)"
        raise OptionsError(
            f"{who}: the network's first output has {has}, but T is given {given}. Fix: give "
            "targets of the output's kind."
        )
    ys = _assemble(results, SequenceOptions("longest", 0.0, "right", "none"), True)
    if kind != "step":
        return ys, tuple(t[1] for t in data.targets), None
    pieces, fmt = results[0][1]
    t_axis = fmt.replace("B", "").index("T")
    lengths = np.array([p.shape[t_axis] for p in pieces])  # fewer when truncated ("shortest")
    kept = [
        t[:n] if options.direction == "right" else t[len(t) - n :]
        for t, n in zip(target[1], lengths, strict=True)
    ]
    longest = int(lengths.max())
    ts = place(kept, 0, Window(0, longest, longest, longest), "right", 0)[0]
    mask = np.arange(longest)[None, :] < lengths[:, None]
    return ys, (ts,), mask


def _predict_data(net, data: SequenceData, size: int, outputs, acceleration) -> list:
    """Per output ``("step", (pieces per sequence, format))`` or ``("batch", (arrays, fmt))``."""
    n = data.count
    results = None
    for start in range(0, n, size):
        index = np.arange(start, min(start + size, n))
        real = len(index)
        if real < size and n > size:  # one shape for every mini-batch
            index = np.concatenate([index, np.full(size - real, index[-1])])
        batch = _run_batch(net, data, index, outputs, acceleration)
        if results is None:
            results = [(kind, ([], fmt)) for kind, _, fmt in batch]
        for (kind, values, _), (_, (collected, _)) in zip(batch, results, strict=True):
            collected.extend(values[:real] if kind == "step" else [values[:real]])
    assert results is not None  # SequenceData holds at least one sequence
    return results


def _run_batch(net, data: SequenceData, index, outputs, acceleration) -> list:
    """One mini-batch, chunk after chunk: per output ``(kind, values, format)``, where values
    are the real steps of each sequence (``"step"``) or the batch's array (``"batch"``)."""
    current = net
    pieces = None
    last = None
    for window in data.windows(index):
        xs, _, masks = data.batch(index, window)
        values, states, out_masks = current.run(
            xs, None, training=False, outputs=outputs, acceleration=acceleration, masks=masks
        )
        current = continue_from(current, carried_states(current, states))
        if pieces is None:
            pieces = [[[] for _ in index] for _ in values]
        last = []
        for k, (y, m) in enumerate(zip(values, out_masks, strict=True)):
            fmt = y.format
            y = np.asarray(stripdims(y))
            if m is None:
                last.append(("batch", np.moveaxis(y, fmt.index("B"), 0), fmt))
                continue
            m = np.asarray(m)
            t = fmt.replace("B", "").index("T")
            for b in range(len(index)):
                observation = np.moveaxis(y, fmt.index("B"), 0)[b]
                pieces[k][b].append(np.compress(m[b], observation, axis=t))
            last.append(("step", None, fmt))
    assert pieces is not None and last is not None  # every mini-batch has a window
    out = []
    for k, (kind, array, fmt) in enumerate(last):
        if kind == "step":
            t = fmt.replace("B", "").index("T")
            out.append(("step", [np.concatenate(p, axis=t) for p in pieces[k]], fmt))
        else:
            out.append(("batch", array, fmt))
    return out


def _assemble(results, options: SequenceOptions, uniform_output: bool) -> tuple:
    merged = []
    for kind, (values, fmt) in results:
        b = fmt.index("B")
        if kind == "batch":
            merged.append(dlarray(np.moveaxis(np.concatenate(values, axis=0), 0, b), fmt))
            continue
        obs = fmt.replace("B", "")
        if not uniform_output:
            merged.append([dlarray(v, obs) for v in values])
            continue
        t = obs.index("T")
        longest = max(v.shape[t] for v in values)
        whole = Window(0, longest, longest, longest)
        padded, _ = place(values, t, whole, options.direction, options.padding_value)
        merged.append(dlarray(np.moveaxis(padded, 0, b), fmt))
    return tuple(merged)
