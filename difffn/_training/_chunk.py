"""Several training steps in one compiled call (``TrainingOptions(steps_per_execution=...)``).

A compiled program allocates its temporary buffers each time it runs. On XLA:CPU those are
fresh pages from the kernel every step (hundreds of MiB for the benchmark transformer, about
90,000 page faults and their zero-filling per step; ``docs/performance.md``, "Fresh pages on
every step"). Running ``n`` steps in one call, a ``lax.fori_loop`` over the mini-batches inside
the program, allocates them once per call: the benchmark transformer's and ResNet's steps run
1.14-1.21x faster, with the same losses to float32 rounding (issue 29). Keras calls this
``steps_per_execution``; JAX users write the same loop by hand. In-memory data is gathered
inside the loop; an iterable's batches are read ahead, written into one device buffer
(``Stacker``, at most ``STACK_BYTES`` of them) and indexed inside it.

``steps(single, length)`` is the program (its compiled module is ``jit_train_steps``, which
``benchmarks/profile_kernels.py`` reads): it runs ``count <= length`` steps (``count`` is an
argument, so one program serves every chunk length, the first iteration's chunk of one too)
and returns the losses and metric values of each in arrays of ``length``. ``single`` is the jitted
one-step function; its trace is shared by the check below and the loop body (JAX caches a
``jax.jit`` function's trace on its argument types).

``loop_safe(jaxpr)`` says whether a step may run in a loop at all. XLA:CPU gives a convolution
its fast kernels only in the canonical layout, and rewrites others into it only at the top level
of a program, not in a loop's body, where they ran 6-50x slower (``ops/_conv_layouts.py``).
``df.ops.conv`` writes its gradients canonically; a step with any other convolution (a user's own
``lax.conv``, a grouped or transposed convolution) runs one step per call. XLA itself may still
move a canonical convolution out of that layout (``compiled_safe``), so a step with convolutions
has its loop program compiled and read before it is used.
"""

from __future__ import annotations

import collections
import functools
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

from .._core import OptionsError

AUTO = 16  # steps_per_execution="auto" on one CPU device (docs/performance.md)


def _canonical(spec: tuple[int, ...], rank: int, kernel: bool = False) -> bool:
    """``(batch or out, feature or in, spatial...)`` in XLA:CPU's kernel layout: data
    ``(N, spatial..., C)``, kernel ``(spatial..., I, O)``."""
    if kernel:
        return tuple(spec) == (rank - 1, rank - 2, *range(rank - 2))
    return tuple(spec) == (0, rank - 1, *range(1, rank - 1))


def _conv_fits(params: dict[str, Any], rank: int) -> bool:
    lhs, rhs, out = params["dimension_numbers"]
    return (
        params.get("feature_group_count", 1) == 1
        and params.get("batch_group_count", 1) == 1
        and _canonical(lhs, rank)
        and _canonical(rhs, rank, kernel=True)
        and _canonical(out, rank)
    )


def _convolution_equations(jaxpr: Any) -> Iterator[Any]:
    """The convolutions of ``jaxpr`` (a ``ClosedJaxpr`` or ``Jaxpr``) and of the jaxprs inside
    it."""
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        if eqn.primitive.name == "conv_general_dilated":
            yield eqn
        for sub in jex.jaxprs_in_params(eqn.params):
            yield from _convolution_equations(sub)


def convolutions(jaxpr: Any) -> int:
    """The number of convolutions in ``jaxpr`` and the jaxprs inside it."""
    return sum(1 for _ in _convolution_equations(jaxpr))


_LABELS = re.compile(r"convolution\(.*?dim_labels=(\w+)_(\w+)->(\w+)")


def compiled_safe(hlo: str, expected: int) -> bool:
    """Whether every convolution of the compiled program's text ``hlo`` is in XLA:CPU's kernel
    layout (``b01f_01io->b01f`` for 2-D). XLA may rewrite a canonical convolution into another
    layout: its algebraic simplifier swaps the operands of a filter gradient whose cotangent is
    larger than the data (small feature maps: a 3x3 gradient on 4x4 data), which at the top level
    ``ConvCanonicalization`` would undo. A program whose text shows none of the ``expected``
    convolutions (a format this does not read) counts as unsafe."""
    found = _LABELS.findall(hlo)
    if expected and not found:
        return False
    for lhs, rhs, out in found:
        digits = "".join(str(i) for i in range(len(lhs) - 2))
        if (lhs, rhs, out) != (f"b{digits}f", f"{digits}io", f"b{digits}f"):
            return False
    return True


def loop_safe(jaxpr: Any) -> bool:
    """Whether every convolution of ``jaxpr`` (and of the jaxprs inside it) is in the layout
    XLA:CPU's fast kernels take (see the module docstring)."""
    return all(
        _conv_fits(eqn.params, len(eqn.invars[0].aval.shape))
        for eqn in _convolution_equations(jaxpr)
    )


def steps(
    single: Callable[..., Any], length: int, feed: str = "gather", treedef: Any = None
) -> Callable[..., Any]:
    """``train_steps(carry, data, key, iteration, learn_rates, count) -> (carry, losses,
    values)``: ``count`` steps of ``single(carry, data_i, key, iteration, learn_rate)`` from
    ``iteration`` on, the i-th with ``learn_rates[i]``; ``losses`` and each of ``values`` hold
    ``length`` entries, the first ``count`` of them set. ``data_i``: for a ``"gather"`` feed,
    ``data = (X, T, order, b)`` with mini-batch ``b + i``; for a ``"direct"`` feed (batches an
    iterable yielded), ``data`` holds the leaves of ``length`` batches stacked (``Stacker``)
    and ``data_i`` is the i-th, in the batches' tree structure ``treedef``."""

    def pick(data, i):
        if feed == "gather":
            X, T, order, b = data
            return X, T, order, b + i
        return jax.tree.unflatten(
            treedef, [jax.lax.dynamic_index_in_dim(a, i, keepdims=False) for a in data]
        )

    def train_steps(carry, data, key, iteration, learn_rates, count):
        _, loss, values = jax.eval_shape(
            single, carry, pick(data, 0), key, iteration, learn_rates[0]
        )
        out = (
            jnp.zeros((length, *loss.shape), loss.dtype),
            tuple(jnp.zeros((length, *v.shape), v.dtype) for v in values),
        )

        def body(i, state):
            carry, (losses, metric_values) = state
            carry, loss, values = single(carry, pick(data, i), key, iteration + i, learn_rates[i])
            metric_values = tuple(
                m.at[i].set(v) for m, v in zip(metric_values, values, strict=True)
            )
            return carry, (losses.at[i].set(loss), metric_values)

        carry, (losses, values) = jax.lax.fori_loop(0, count, body, (carry, out))
        return carry, losses, values

    return train_steps


STACK_BYTES = 64 << 20  # the most of an iterable's batches one call holds at once


def batch_bytes(batch: Any) -> int:
    """The bytes of one feed's data (an iterable's batch: inputs and targets)."""
    return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(batch))


def stacked_length(limit: int, batch: Any) -> int:
    """How many batches like ``batch`` one call takes: at most ``limit``, and at most
    ``STACK_BYTES`` of them (1: one per call, when not even two fit)."""
    return max(1, min(limit, STACK_BYTES // max(batch_bytes(batch), 1)))


def signature(batch: Any) -> tuple:
    """What batches must share to be stacked: tree structure, shapes and dtypes."""
    leaves, treedef = jax.tree.flatten(batch)
    return treedef, tuple((a.shape, a.dtype) for a in leaves)


def read_ahead(feeds: Iterator[Any], feed: tuple, data: Any, n: int) -> tuple[list[Any], Any]:
    """Up to ``n`` batches of an iterable for one call, ``data`` (of spec ``feed``) first: the
    next ones of ``feeds`` while they share its spec, shapes and dtypes. Returns them and the
    feed read that could not join (None when none was), which the next call starts with."""
    group, same = [data], signature(data)
    while len(group) < n:
        got = next(feeds, None)
        if got is None:
            return group, None
        if got[0] != feed or signature(got[1]) != same:
            return group, got
        group.append(got[1])
    return group, None


@functools.partial(jax.jit, donate_argnums=(0,))
def _put(buffer: list[Any], batch: Any, i: Any) -> list[Any]:
    return [
        jax.lax.dynamic_update_index_in_dim(b, a, i, 0)
        for b, a in zip(buffer, jax.tree.leaves(batch), strict=True)
    ]


class Stacker:
    """The device buffers a call's batches are stacked in: each leaf of ``length`` batches on a
    new leading axis, on the batches' devices. Each call writes its batches into its buffer in
    place (the buffer is donated), so a call of one batch copies one batch, and no call
    allocates. Buffers are kept per signature and length, the most recently used first, while
    they take at most ``2 * STACK_BYTES`` (batches of a few alternating shapes, sequences padded
    per batch, each keep theirs)."""

    def __init__(self) -> None:
        self.buffers: collections.OrderedDict[tuple, list[Any]] = collections.OrderedDict()

    def fill(self, group: list[Any], length: int) -> list[Any]:
        """The buffer with ``group``'s batches (one signature) at its first entries; the rest
        hold earlier batches, which the loop does not read."""
        key = (signature(group[0]), length)
        buffer = self.buffers.pop(key, None)
        if buffer is None:
            leaves = jax.tree.leaves(group[0])
            size = length * batch_bytes(group[0])
            while (
                self.buffers
                and size + sum(batch_bytes(b) for b in self.buffers.values()) > 2 * STACK_BYTES
            ):
                self.buffers.popitem(last=False)  # the least recently used
            # from the host: jnp.zeros would compile (and keep) a program for every new shape
            buffer = [
                jax.device_put(np.zeros((length, *a.shape), a.dtype), a.sharding, may_alias=False)
                for a in leaves
            ]
        for i, batch in enumerate(group):
            buffer = _put(buffer, batch, np.int32(i))
        self.buffers[key] = buffer
        return buffer


def limit(who: str, wanted: Any, placement: Any, output_fcn: Any, *, accelerate: bool) -> int:
    """The most steps one call runs: ``steps_per_execution`` (``wanted``) where the run allows
    it; an explicit number where it does not is a named error. ``"auto"`` is ``AUTO`` on a CPU
    device (the platform the run is placed on), else 1."""
    if wanted == 1:
        return 1
    if not accelerate:  # a network that runs eagerly has no compiled step to loop
        if wanted != "auto":
            warnings.warn(
                f"{who}: TrainingOptions(steps_per_execution={wanted}) runs one iteration per "
                "call in this run: the network has layers that run eagerly (acceleratable = "
                "False). Fix: leave steps_per_execution='auto' to run as many per call as a run "
                "allows, without this warning.",
                RuntimeWarning,
                stacklevel=5,  # _Run.__init__, _train, trainnet: the user's call
            )
        return 1
    conflict = None
    if placement.mesh is not None or placement.multi_host:
        conflict = "this run splits its batches over a device mesh"
    elif output_fcn:
        conflict = "output_fcn sees the network after every iteration"
    if conflict is not None and wanted != "auto":
        raise OptionsError(
            f"{who}: TrainingOptions(steps_per_execution={wanted}) runs several iterations in "
            f"one compiled call on one device, but {conflict}, which needs one call per "
            "iteration. Fix: steps_per_execution='auto' (or 1)."
        )
    if conflict is not None:
        return 1
    if wanted == "auto":
        return AUTO if placement.devices[0].platform == "cpu" else 1
    return int(wanted)


def count(first: int, *, limit: int, left: int, final: int | None, every: tuple[int, ...]) -> int:
    """How many steps to run in one call from iteration ``first``: at most ``limit`` and the
    ``left`` mini-batches of the epoch, ending at the first iteration where the host acts on the
    state (logs, validates, checkpoints, looks for the stop file): the first iteration, a
    multiple of one of the frequencies ``every``, or the ``final`` one."""
    if first == 1:
        return 1
    n = min(limit, left)
    if final is not None:
        n = min(n, final - first + 1)
    for frequency in every:
        n = min(n, (-first) % frequency + 1)  # up to the next multiple of it
    return max(n, 1)
