"""Several processes, one training run: what ``execution_environment="multi-host"`` needs of
``jax.distributed`` (JAX's multi-controller runtime).

Every process runs the same script; ``jax.distributed.initialize`` (called by the user, first)
joins them into one job whose ``jax.devices()`` are every process's devices. Compiled steps
then run on all of them at once, and XLA moves the data between processes (gloo on CPU, NCCL on
GPU). What is not a compiled step must agree by construction (the same data order from the same
seed, the same decisions from the same replicated numbers) or be agreed explicitly: the helpers
here do that with ``jax.experimental.multihost_utils`` (a stop asked for by ``output_fcn`` on
process 0, statistics of data that differs per process).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

from .._core import OptionsError

START = (
    "jax.distributed.initialize(coordinator_address='HOST:PORT', num_processes=N, "
    "process_id=I) in every process before anything else uses JAX (on a cluster with SLURM or "
    "Open MPI, jax.distributed.initialize() finds them itself; see docs/scaling.md)"
)


def require_initialized(who: str) -> None:
    """Raise a clear error unless ``jax.distributed.initialize`` has been called."""
    if not jax.distributed.is_initialized():
        raise OptionsError(
            f"{who}: execution_environment='multi-host' runs one process per host, joined by "
            f"jax.distributed, but jax.distributed.initialize() was not called in this process. "
            f"Fix: call {START}; for one machine's devices use "
            "execution_environment='multi-device'."
        )


def is_primary() -> bool:
    """Whether this process prints, plots and calls ``output_fcn`` (process 0)."""
    return jax.process_index() == 0


def agree(flag: bool) -> bool:
    """Process 0's ``flag``, in every process (a collective: every process must call it)."""
    if jax.process_count() == 1:
        return flag
    return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag, dtype=np.bool_)))


def broadcast_int(value: int) -> int:
    """Process 0's ``value`` (a non-negative int below 2**62), in every process (a collective)."""
    if jax.process_count() == 1:
        return int(value)
    parts = np.asarray([value >> 31, value & 0x7FFFFFFF], dtype=np.int32)
    hi, lo = np.asarray(multihost_utils.broadcast_one_to_all(parts)).tolist()
    return (int(hi) << 31) | int(lo)


def all_agree(flag: bool) -> bool:
    """Whether ``flag`` is True in every process (a collective, so also a barrier)."""
    if jax.process_count() == 1:
        return flag
    flags = np.asarray(multihost_utils.process_allgather(np.asarray(flag, dtype=np.bool_)))
    return bool(np.all(flags))


def gather_rows(x, axis: int):
    """Every process's ``x`` (a host array), concatenated along ``axis`` in process order.

    Each process must pass an array of the same shape (a collective).
    """
    if jax.process_count() == 1:
        return np.asarray(x)
    gathered = np.asarray(multihost_utils.process_allgather(np.asarray(x)))
    return np.concatenate(list(gathered), axis=axis)
