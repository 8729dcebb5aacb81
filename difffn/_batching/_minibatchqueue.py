"""``df.minibatchqueue``: MATLAB's ``minibatchqueue``, mini-batches of in-memory data.

The queue cuts its data into mini-batches in observation order (or a shuffled order drawn from
a key), passes each through ``mini_batch_fcn``, labels the outputs with ``mini_batch_format``
and puts them on the device. While the caller's step runs on one mini-batch, a background
thread already gathers and prepares the next one (``jax.device_put`` is asynchronous, so the
copy overlaps too). It is re-iterable: ``for X, T in mbq`` starts a new pass each time, so
``df.trainnet(mbq, net, loss, options)`` reads one pass per epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from .._core import FormattedArray, OptionsError, check_key, dlarray, stripdims

_SHUFFLE = ("never", "once", "every-epoch")
_WHO = "df.minibatchqueue"


class MiniBatchQueue:
    """Mini-batches of in-memory data (MATLAB's ``minibatchqueue``); made by
    [`minibatchqueue`][difffn.minibatchqueue].

    Methods: ``has_data()`` (MATLAB's ``hasdata``), ``next()`` (the next mini-batch, one value per
    output), ``reset()`` (back to the first mini-batch), ``shuffle(key)`` (a new order drawn
    from ``key``, then reset) and Python iteration (a new pass each time). ``len(mbq)`` is the
    number of mini-batches per pass.
    """

    def __init__(
        self,
        data: Any,
        *,
        mini_batch_size: int,
        mini_batch_fcn: Callable[..., Any] | None,
        mini_batch_format: str | Sequence[str | None] | None,
        partial_mini_batch: str,
        shuffle: bool | str,
        key: Any,
        output_environment: str,
    ) -> None:
        self._variables, self._single = _variables(data)
        self._count = _count(self._variables)
        self.mini_batch_size: int = _positive_int("mini_batch_size", mini_batch_size)
        if mini_batch_fcn is not None and not callable(mini_batch_fcn):
            raise OptionsError(
                f"{_WHO}: mini_batch_fcn must be a function of the mini-batch of each variable "
                f"(MATLAB's MiniBatchFcn); got {type(mini_batch_fcn).__name__}. Fix: pass e.g. "
                "mini_batch_fcn=lambda X, T: (X / 255, T), or leave it out."
            )
        self.mini_batch_fcn = mini_batch_fcn
        self.mini_batch_format = mini_batch_format
        if partial_mini_batch not in ("return", "discard"):
            raise OptionsError(
                f"{_WHO}: partial_mini_batch must be 'return' or 'discard' (MATLAB's "
                f"PartialMiniBatch); got {partial_mini_batch!r}."
            )
        self.partial_mini_batch = partial_mini_batch
        if output_environment not in ("auto", "cpu"):
            raise OptionsError(
                f"{_WHO}: output_environment must be 'auto' (the default JAX device) or 'cpu' "
                f"(numpy arrays on the host); got {output_environment!r}."
            )
        self.output_environment = output_environment
        spelled: dict[bool | str, str] = {True: "once", False: "never"}
        mode = spelled.get(shuffle, shuffle)
        if mode not in _SHUFFLE:
            raise OptionsError(
                f"{_WHO}: shuffle must be one of {list(_SHUFFLE)} (or True for 'once', False for "
                f"'never'); got {shuffle!r}."
            )
        self._shuffle_mode = mode
        if mode != "never":
            check_key(f"{_WHO}: shuffle={mode!r} needs key", key, OptionsError)
        self._key = key
        self._pass = 0  # passes started; "every-epoch" draws pass n's order from fold_in(key, n)
        self._order = np.arange(self._count)
        if mode != "never":
            self._order = _permutation(key, self._count)
        self._position = 0
        self._executor: ThreadPoolExecutor | None = None
        self._ahead: tuple[int, Future] | None = None  # (position it was made for, the batch)

    # -- MATLAB's methods -------------------------------------------------------------------------

    def has_data(self) -> bool:
        """Whether ``next()`` has another mini-batch in this pass (MATLAB's ``hasdata``)."""
        left = self._count - self._position
        return left >= self.mini_batch_size or (left > 0 and self.partial_mini_batch == "return")

    def next(self) -> Any:
        """The next mini-batch: one value per output (a tuple for several), on the device.

        Raises:
          OptionsError: the pass has no mini-batch left (check ``has_data()``, or ``reset()``).
        """
        if not self.has_data():
            raise OptionsError(
                f"{_WHO}: no mini-batch left in this pass ({self._count} observations, "
                f"mini_batch_size={self.mini_batch_size}, partial_mini_batch="
                f"{self.partial_mini_batch!r}). Fix: loop while mbq.has_data(), then call "
                "mbq.reset() (or mbq.shuffle(key)) to start a new pass."
            )
        position = self._position
        self._position = min(position + self.mini_batch_size, self._count)
        if self._ahead is not None and self._ahead[0] == position:
            batch = self._ahead[1].result()
        else:
            batch = self._prepare(position)
        self._ahead = None
        if self.has_data():  # prepare the next one while the caller's step runs
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="minibatchqueue")
            self._ahead = (self._position, self._executor.submit(self._prepare, self._position))
        return batch

    def reset(self) -> None:
        """Back to the first mini-batch; with ``shuffle='every-epoch'``, in a new order."""
        self._drop_ahead()
        self._position = 0
        self._pass += 1
        if self._shuffle_mode == "every-epoch":
            self._order = _permutation(jax.random.fold_in(self._key, self._pass), self._count)

    def shuffle(self, key: Any) -> None:
        """A new observation order drawn from ``key``, and back to the first mini-batch
        (MATLAB's ``shuffle(mbq)``)."""
        check_key(f"{_WHO}.shuffle", key, OptionsError)
        self._drop_ahead()
        self._position = 0
        self._order = _permutation(key, self._count)

    # -- Python -----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        # A new pass each time (trainnet reads one per epoch); a generator, not ``self``, so
        # that the queue reads as re-iterable rather than as a one-shot iterator.
        if self._position:
            self.reset()
        return self._one_pass()

    def _one_pass(self) -> Iterator:
        while self.has_data():
            yield self.next()

    def __next__(self) -> Any:
        if not self.has_data():
            raise StopIteration
        return self.next()

    def __len__(self) -> int:
        full, rest = divmod(self._count, self.mini_batch_size)
        return full + (1 if rest and self.partial_mini_batch == "return" else 0)

    def __repr__(self) -> str:
        return (
            f"MiniBatchQueue({self._count} observations, {len(self._variables)} output(s), "
            f"mini_batch_size={self.mini_batch_size}, partial_mini_batch="
            f"{self.partial_mini_batch!r}, shuffle={self._shuffle_mode!r})"
        )

    def __del__(self) -> None:
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    # -- one mini-batch ---------------------------------------------------------------------------

    def _drop_ahead(self) -> None:
        if self._ahead is not None:
            self._ahead[1].cancel()
            self._ahead = None

    def _prepare(self, position: int):
        index = self._order[position : position + self.mini_batch_size]
        parts = [_gather(v, index) for v in self._variables]
        if self.mini_batch_fcn is not None:
            try:
                out = self.mini_batch_fcn(*parts)
            except Exception as error:
                raise OptionsError(
                    f"{_WHO}: mini_batch_fcn raised {type(error).__name__}: {error} on a "
                    f"mini-batch of {len(index)} observations. Fix: it receives one argument "
                    "per variable of data (an array with the observations along axis 0, or a "
                    "list of them for a list variable) and returns the outputs."
                ) from error
            parts = list(out) if isinstance(out, tuple) else [out]
        formats = self._formats(len(parts))
        outputs = tuple(self._place(p, f) for p, f in zip(parts, formats, strict=True))
        return outputs[0] if len(outputs) == 1 else outputs

    def _formats(self, n: int) -> tuple:
        fmt = self.mini_batch_format
        if fmt is None:
            return (None,) * n
        if isinstance(fmt, str) and n == 1:
            return (fmt or None,)
        if not isinstance(fmt, str) and isinstance(fmt, Sequence) and len(fmt) == n:
            return tuple(f or None for f in fmt)
        raise OptionsError(
            f"{_WHO}: mini_batch_format {fmt!r} does not give one format per output; the "
            f"mini-batches have {n} output(s). Fix: a tuple with one format per output ('' or "
            "None for a plain one), e.g. mini_batch_format=('BSSC', '')."
        )

    def _place(self, value, fmt):
        if isinstance(value, FormattedArray):
            fmt, value = fmt or value.format, stripdims(value)
        value = np.asarray(value) if self.output_environment == "cpu" else jax.device_put(value)
        return dlarray(value, fmt) if fmt else value


def _variables(data) -> tuple[list, bool]:
    """The variables of ``data``: a tuple is several (e.g. ``(X, T)``), anything else one."""
    if isinstance(data, tuple):
        if not data:
            raise OptionsError(f"{_WHO}: data is an empty tuple. Fix: pass (X, T) or X.")
        return [_variable(v, f"data[{k}]") for k, v in enumerate(data)], False
    return [_variable(data, "data")], True


def _variable(value, what: str):
    if isinstance(value, list):  # observations of different sizes (e.g. sequences)
        return value
    if isinstance(value, FormattedArray):
        value = stripdims(value)
    array = np.asarray(value) if not isinstance(value, jax.Array) else value
    if array.ndim == 0:
        raise OptionsError(
            f"{_WHO}: {what} is a scalar; expected an array with the observations along axis 0 "
            "or a list of observations."
        )
    return array


def _count(variables) -> int:
    counts = {len(v) if isinstance(v, list) else int(v.shape[0]) for v in variables}
    if len(counts) != 1:
        raise OptionsError(
            f"{_WHO}: the variables of data have different numbers of observations "
            f"{sorted(counts)} (along axis 0). Fix: pass variables with one entry per "
            "observation each, e.g. (X, T) with len(X) == len(T)."
        )
    (count,) = counts
    if count == 0:
        raise OptionsError(f"{_WHO}: data has no observations.")
    return count


def _gather(variable, index):
    if isinstance(variable, list):
        return [variable[i] for i in index]
    if isinstance(variable, jax.Array):
        return variable[np.asarray(index)]
    return variable[index]


def _permutation(key, n: int) -> np.ndarray:
    return np.asarray(jax.random.permutation(key, n))


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise OptionsError(f"{_WHO}: {name} must be a positive int; got {value!r}.")
    return int(value)


def minibatchqueue(
    data: Any,
    *,
    mini_batch_size: int = 128,
    mini_batch_fcn: Callable[..., Any] | None = None,
    mini_batch_format: str | Sequence[str | None] | None = None,
    partial_mini_batch: str = "return",
    shuffle: bool | str = False,
    key: Any = None,
    output_environment: str = "auto",
) -> MiniBatchQueue:
    """A queue of mini-batches (MATLAB's ``minibatchqueue``) for custom loops and ``trainnet``.

    Args:
      data: one variable, or a tuple of variables (``(X, T)``: the mini-batch then has one
        value per variable). A variable is an array with the observations along axis 0, or a
        list of observations (e.g. sequences of different lengths, for a ``mini_batch_fcn``
        that pads them).
      mini_batch_size: observations per mini-batch (MATLAB's ``MiniBatchSize``, 128).
      mini_batch_fcn: ``fn(*variables) -> output or tuple of outputs`` applied to each
        mini-batch (MATLAB's ``MiniBatchFcn``); each argument holds the mini-batch's
        observations of one variable. Default: the variables as they are.
      mini_batch_format: the format of the outputs (MATLAB's ``MiniBatchFormat``): a string
        for a single output, a tuple of one per output (``None``/``""``: plain). Default: plain
        arrays.
      partial_mini_batch: ``"return"`` (default) gives the last, smaller mini-batch of a pass;
        ``"discard"`` leaves it out.
      shuffle: ``False``/``"never"`` (default, observation order), ``True``/``"once"`` (one
        order drawn from ``key``) or ``"every-epoch"`` (a new order each pass: pass ``n``
        from ``jax.random.fold_in(key, n)``). ``mbq.shuffle(key)`` reshuffles at any time.
      key: a ``jax.random`` key; needed when ``shuffle`` is not ``"never"``.
      output_environment: ``"auto"`` (default: the mini-batches are put on JAX's default
        device) or ``"cpu"`` (numpy arrays on the host).

    Returns:
      A ``MiniBatchQueue``: ``has_data()``, ``next()``, ``reset()``, ``shuffle(key)``, Python
      iteration (each ``for`` loop is a new pass) and ``len()``.

    Raises:
      OptionsError: a bad option, variables of different lengths, or ``next()`` past the end.

    Examples:
      >>> import numpy as np
      >>> import difffn as df
      >>> X, T = np.arange(10.0).reshape(5, 2), np.arange(5)
      >>> mbq = df.minibatchqueue((X, T), mini_batch_size=2, mini_batch_format=("BC", ""))
      >>> while mbq.has_data():
      ...     x, t = mbq.next()
      ...     print(x.format, x.shape, t.tolist())
      BC (2, 2) [0, 1]
      BC (2, 2) [2, 3]
      BC (1, 2) [4]
      >>> len(df.minibatchqueue((X, T), mini_batch_size=2, partial_mini_batch="discard"))
      2
    """
    return MiniBatchQueue(
        data,
        mini_batch_size=mini_batch_size,
        mini_batch_fcn=mini_batch_fcn,
        mini_batch_format=mini_batch_format,
        partial_mini_batch=partial_mini_batch,
        shuffle=shuffle,
        key=key,
        output_environment=output_environment,
    )
