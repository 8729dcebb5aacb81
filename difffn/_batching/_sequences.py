"""Sequences of different lengths (MATLAB's cell arrays of sequences): padding, truncation,
splitting, masks and length buckets.

Data for a network input whose format has ``B`` and ``T`` (``SequenceInput``'s ``"BTC"``) may be
a Python list with one array per observation, each the input's format without ``B`` (``(T_i,
C)`` for ``"BTC"``), of any lengths ``T_i``. Targets are then an array with one row per sequence
(sequence-to-one: integer labels ``(N,)``, or ``(N, K)``), or a list with one array per sequence
and time step (sequence-to-sequence: ``(T_i,)`` labels or ``(T_i, K)``).

Each mini-batch is made rectangular as MATLAB's ``trainingOptions`` say, with the same names
(`SequenceOptions`):

* ``sequence_length="longest"`` (default): pad to the longest sequence of the mini-batch;
  ``"shortest"``: truncate to the shortest; an int ``L``: pad to the longest, then split into
  chunks of ``L`` steps, one iteration each, the network's recurrent state carried from chunk to
  chunk of the same mini-batch (MATLAB: "the software updates the network state between the
  split sequences"). MATLAB's last chunk is shorter when ``L`` does not divide the length; here
  it is padded to ``L`` (masked steps), so every chunk has one shape.
* ``sequence_padding_direction="right"`` (default) pads or truncates at the end, ``"left"`` at
  the start (the sequences then end at the same step).
* ``sequence_padding_value`` (0) fills the padding.

Every batch comes with its padding mask (``_mask``): True at the steps that hold data. Losses,
metrics, recurrent layers and ``SelfAttention`` read it, so padding changes nothing that depends
only on them (MATLAB leaves the padding in: it asks for left padding before an LSTM's "last"
output instead).

Bounded retracing (difffn's; MATLAB has no such option): ``sequence_bucketing`` rounds each
padded length up, ``"power-of-two"`` (default) to the next power of two, an int ``k`` to a
multiple of ``k``, ``"none"`` not at all; a compiled trace is made per padded length, so a data
set of 200 lengths compiles a handful. The extra steps are padding (masked), placed where the
padding direction puts padding.
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
from typing import Any

import numpy as np

from .._core import FormattedArray, OptionsError, dlarray, stripdims
from .._core import batches as _batches

LENGTHS = ("longest", "shortest")
DIRECTIONS = ("right", "left")
BUCKETINGS = ("power-of-two", "none")


# -- options ------------------------------------------------------------------------------------


def check_length(who: str, value):
    """``sequence_length``: ``"longest"``, ``"shortest"`` or a positive int."""
    if isinstance(value, str) and value in LENGTHS:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 1:
        return int(value)
    raise OptionsError(
        f"{who}: sequence_length must be 'longest', 'shortest' or a positive int (the chunk "
        f"length of split sequences); got {value!r}. Fix: e.g. sequence_length='longest'."
    )


def check_padding_value(who: str, value):
    """``sequence_padding_value``: a real number (NaN allowed, as MATLAB allows it)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise OptionsError(
        f"{who}: sequence_padding_value must be a real number; got {value!r}. Fix: e.g. "
        "sequence_padding_value=0."
    )


def check_direction(who: str, value):
    """``sequence_padding_direction``: ``"right"`` or ``"left"``."""
    if isinstance(value, str) and value in DIRECTIONS:
        return value
    raise OptionsError(
        f"{who}: sequence_padding_direction must be 'right' or 'left'; got {value!r}. Fix: "
        "sequence_padding_direction='right' (pad after the data) or 'left' (before it)."
    )


def check_bucketing(who: str, value):
    """``sequence_bucketing``: ``"power-of-two"``, ``"none"`` or a positive int."""
    if isinstance(value, str) and value in BUCKETINGS:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 1:
        return int(value)
    raise OptionsError(
        f"{who}: sequence_bucketing must be 'power-of-two', 'none' or a positive int k (pad "
        f"lengths to a multiple of k); got {value!r}. Fix: e.g. sequence_bucketing='power-of-two' "
        "(few compilations) or 'none' (pad to each batch's longest)."
    )


@dataclasses.dataclass(frozen=True)
class SequenceOptions:
    """How mini-batches of sequences are made rectangular (see the module notes)."""

    length: str | int = "longest"
    padding_value: float = 0.0
    direction: str = "right"
    bucketing: str | int = "power-of-two"

    @classmethod
    def checked(cls, who: str, length, padding_value, direction, bucketing) -> SequenceOptions:
        return cls(
            check_length(who, length),
            check_padding_value(who, padding_value),
            check_direction(who, direction),
            check_bucketing(who, bucketing),
        )

    @classmethod
    def of(cls, options) -> SequenceOptions:
        """The sequence options of a ``TrainingOptions``."""
        return cls(
            options.sequence_length,
            options.sequence_padding_value,
            options.sequence_padding_direction,
            options.sequence_bucketing,
        )


def bucket(n: int, bucketing) -> int:
    """``n`` steps rounded up by ``bucketing``."""
    if bucketing == "none":
        return n
    if bucketing == "power-of-two":
        return 1 << max(n - 1, 0).bit_length()
    return -(-n // bucketing) * bucketing


# -- detection and checks -----------------------------------------------------------------------


def is_sequence_list(value, fmt: str | None) -> bool:
    """Whether ``value`` is a list of observations (no batch axis) for an input in ``fmt``."""
    if not isinstance(value, list) or not value:
        return False
    if not all(isinstance(v, FormattedArray) or hasattr(v, "shape") for v in value):
        return False
    rank = len(fmt) if fmt else 3
    if fmt and ("B" not in fmt or "T" not in fmt):
        return False
    return any(np.ndim(stripdims(v)) != rank for v in value)


def observation_format(fmt: str | None) -> str:
    """The format of one observation of an input in ``fmt`` (``"BTC"`` -> ``"TC"``)."""
    return (fmt or "BTC").replace("B", "")


def check_sequences(who: str, seqs: list, fmt: str | None, what: str) -> list[np.ndarray]:
    """The sequences as numpy arrays, checked: one rank, equal non-time sizes, numbers."""
    obs = observation_format(fmt)
    t = obs.index("T")
    arrays = []
    for i, s in enumerate(seqs):
        if isinstance(s, FormattedArray):
            if s.format != obs:
                raise OptionsError(
                    f"{who}: {what}[{i}] has format {s.format!r}; a sequence of this input has "
                    f"format {obs!r} (the input's without 'B'). Fix: df.permute or relabel it."
                )
            s = s.data
        _batches.check_data(s, what=f"{who}: {what}[{i}]")
        arrays.append(np.asarray(s))
    ranks = sorted({a.ndim for a in arrays})
    if ranks != [len(obs)]:
        first_bad = next(i for i, a in enumerate(arrays) if a.ndim != len(obs))
        hint = ""
        if arrays[first_bad].ndim == len(obs) - 1 and obs == "TC":
            hint = " A sequence of one channel is (T_i, 1): x[:, None]."
        raise OptionsError(
            f"{who}: {what} is a list of sequences, each of format {obs!r} ({len(obs)} axes); "
            f"{what}[{first_bad}] has shape {arrays[first_bad].shape} (the list holds ranks "
            f"{ranks}). Fix: give every sequence the shape {_shape_text(obs)}.{hint}"
        )
    others = {a.shape[:t] + a.shape[t + 1 :] for a in arrays}
    if len(others) != 1:
        sizes = sorted(others)
        bad = next(i for i, a in enumerate(arrays) if a.shape[:t] + a.shape[t + 1 :] != sizes[0])
        raise OptionsError(
            f"{who}: the sequences of {what} differ in their non-time sizes ({obs!r}: "
            f"{what}[0] has shape {arrays[0].shape}, {what}[{bad}] has {arrays[bad].shape}); "
            "only the number of time steps may differ. Fix: give every sequence the same "
            "number of channels."
        )
    if any(a.shape[t] == 0 for a in arrays):
        empty = next(i for i, a in enumerate(arrays) if a.shape[t] == 0)
        raise OptionsError(
            f"{who}: {what}[{empty}] has no time steps (shape {arrays[empty].shape}). Fix: leave "
            "empty sequences out."
        )
    return arrays


def _shape_text(obs: str) -> str:
    return "(" + ", ".join("T_i" if a == "T" else a for a in obs) + ")"


def check_step_targets(who: str, targets: list, lengths: np.ndarray, what: str) -> list:
    """Per-step targets: one array per sequence, ``(T_i,)`` or ``(T_i, K)``, lengths matching."""
    if len(targets) != len(lengths):
        raise OptionsError(
            f"{who}: {what} has {len(targets)} per-step target sequences for {len(lengths)} "
            "input sequences. Fix: one target sequence per input sequence."
        )
    arrays = []
    for i, (t, n) in enumerate(zip(targets, lengths, strict=True)):
        if not hasattr(stripdims(t), "shape"):
            t = np.asarray(t)
        _batches.check_data(t, what=f"{who}: {what}[{i}]")
        t = np.asarray(stripdims(t))
        if t.ndim not in (1, 2) or t.shape[0] != n:
            raise OptionsError(
                f"{who}: {what}[{i}] has shape {t.shape} but sequence {i} has {n} time steps; a "
                f"per-step target is ({n},) labels or ({n}, K). Fix: one target per time step "
                "(or give one target per sequence as an array)."
            )
        arrays.append(t)
    if len({a.shape[1:] for a in arrays}) != 1 or len({a.dtype.kind for a in arrays}) != 1:
        raise OptionsError(
            f"{who}: the per-step targets in {what} differ in kind or size: "
            f"{sorted({(a.shape[1:], a.dtype.name) for a in arrays})}. Fix: all labels (T_i,) "
            "or all (T_i, K) arrays of one dtype."
        )
    return arrays


# -- making batches rectangular -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Window:
    """Steps ``start:stop`` of a mini-batch's sequences padded to ``total`` steps, placed in
    ``size`` steps (``size - (stop - start)`` more padding, on the padding side)."""

    start: int
    stop: int
    total: int
    size: int


def windows(lengths: np.ndarray, options: SequenceOptions) -> list[Window]:
    """The windows a mini-batch with these sequence lengths is cut into (one, or the chunks)."""
    longest, shortest = int(lengths.max()), int(lengths.min())
    if options.length == "shortest":
        return [Window(0, shortest, shortest, bucket(shortest, options.bucketing))]
    if options.length == "longest":
        return [Window(0, longest, longest, bucket(longest, options.bucketing))]
    size = int(options.length)  # a chunk length: neither string above
    return [
        Window(start, min(start + size, longest), longest, size)
        for start in range(0, longest, size)
    ]


def place(seqs, t_axis: int, window: Window, direction: str, value, dtype=None):
    """The window of each sequence in a ``(batch, ...)`` array, and its mask ``(batch, size)``.

    The sequences are first padded (or truncated, for ``"shortest"``) to ``window.total`` steps
    on the side ``direction`` names; the window's steps then go into ``window.size`` steps,
    with the bucket's extra padding on that same side.
    """
    first = seqs[0]
    dtype = np.result_type(*seqs) if dtype is None else dtype
    shape = list(first.shape)
    shape[t_axis] = window.size
    out = np.full((len(seqs), *shape), value, dtype=dtype)
    mask = np.zeros((len(seqs), window.size), bool)
    span = window.stop - window.start
    shift = window.size - span if direction == "left" else 0
    for b, s in enumerate(seqs):
        n = s.shape[t_axis]
        offset = window.total - n if direction == "left" else 0  # s's first step, padded
        a, z = max(window.start, offset), min(window.stop, offset + n)
        if a >= z:
            continue
        at = a - window.start + shift
        index = [slice(None)] * s.ndim
        index[t_axis] = slice(a - offset, z - offset)
        target = [b] + [slice(None)] * s.ndim
        target[1 + t_axis] = slice(at, at + z - a)
        out[tuple(target)] = s[tuple(index)]
        mask[b, at : at + z - a] = True
    return out, mask


def padsequences(
    sequences: Any,
    *,
    length: str | int = "longest",
    padding_value: float = 0.0,
    direction: str = "right",
    fmt: str = "BTC",
) -> Any:
    """Pad or truncate sequences to one length (MATLAB ``padsequences``), with their mask.

    Args:
      sequences: a list of arrays, one per observation, each in ``fmt`` without ``B``
        (``(T_i, C)`` for ``"BTC"``).
      length: ``"longest"`` (default), ``"shortest"`` or a number of steps (longer sequences
        are truncated, shorter ones padded).
      padding_value: the value of the padding (0).
      direction: ``"right"`` (default: pad or truncate at the end) or ``"left"`` (at the start,
        so that the sequences end at the same step).
      fmt: the format of the result (it must have ``B`` and ``T``).

    Returns:
      ``(padded, mask)``: a ``df.FormattedArray`` in ``fmt`` with the batch axis where ``fmt``
      has ``B``, and a boolean ``(batch, time)`` array, True at the steps that hold data (the
      ``mask=`` that ``net.predict``, ``df.ops.lstm`` and the losses take).

    Raises:
      OptionsError: sequences of mixed ranks or channel counts, or a bad option.

    Examples:
      >>> import numpy as np
      >>> import difffn as df
      >>> x, mask = df.padsequences([np.ones((3, 2)), np.ones((1, 2))], direction="left")
      >>> x.format, x.shape, mask.tolist()
      ('BTC', (2, 3, 2), [[True, True, True], [False, False, True]])
    """
    who = "padsequences"
    if not isinstance(fmt, str) or "B" not in fmt or "T" not in fmt:
        raise OptionsError(f"{who}: fmt must have 'B' and 'T' axes; got {fmt!r}.")
    if not isinstance(sequences, (list, tuple)) or not sequences:
        raise OptionsError(
            f"{who}: sequences must be a non-empty list of arrays; got {type(sequences).__name__}."
        )
    seqs = check_sequences(who, list(sequences), fmt, "sequences")
    direction = check_direction(who, direction)
    padding_value = check_padding_value(who, padding_value)
    obs = observation_format(fmt)
    t = obs.index("T")
    lengths = [s.shape[t] for s in seqs]
    length = check_length(who, length)
    if length == "longest":
        total = max(lengths)
    elif length == "shortest":
        total = min(lengths)
    else:
        total = int(length)
    out, mask = place(seqs, t, Window(0, total, total, total), direction, padding_value)
    b = fmt.index("B")
    return dlarray(np.moveaxis(out, 0, b), fmt), mask


def describe_sequences(seqs) -> str:
    """A stable description of a list of sequences (for the checkpoint fingerprint): their
    number, shapes and a hash of their values, equal in every process."""
    digest = hashlib.sha256()
    for s in seqs:
        digest.update(repr((s.shape, s.dtype.str)).encode())
        digest.update(np.ascontiguousarray(s).tobytes())
    return f"{len(seqs)} sequences, hash {digest.hexdigest()[:16]}"
