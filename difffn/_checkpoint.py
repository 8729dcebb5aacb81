"""Checkpoints during ``trainnet`` (``checkpoint_path``, ``checkpoint_frequency[_unit]``).

``trainnet`` calls :func:`maybe_save` after every iteration (``unit="iteration"``) and after
every completed epoch (``unit="epoch"``); a checkpoint is written when the unit matches
``checkpoint_frequency_unit`` and the count is a multiple of ``checkpoint_frequency``.

What is written here is the network: MATLAB's ``net_checkpoint__<iteration>__<date>`` file, as
a NumPy ``.npz`` archive (no pickle) with one array per learnable and state parameter, keyed
``"learnables/<layer>/<parameter>"`` and ``"state/<layer>/<parameter>"``, plus ``iteration`` and
``epoch``. It is written atomically (temporary file, fsync, rename). Load the values back with
``net.replace(learnables=..., state=...)``. Resuming a whole run exactly (optimizer state, data
order, PRNG key, history: all in the ``TrainingState``) belongs to the persistence layer
(``df.save``/``df.load`` and ``trainnet(..., resume_from=)``), which builds on these hooks.
"""

from __future__ import annotations

import os
import tempfile
import time

import jax
import numpy as np


def due(options, unit: str, count: int) -> bool:
    """Whether a checkpoint is due after ``count`` completed units (iterations or epochs)."""
    return (
        options.checkpoint_path is not None
        and options.checkpoint_frequency_unit == unit
        and count % options.checkpoint_frequency == 0
    )


def maybe_save(state, options, *, unit: str) -> str | None:
    """Write a checkpoint of ``state`` if one is due; return its path (or None)."""
    count = state.iteration if unit == "iteration" else state.epoch
    if not due(options, unit, count):
        return None
    return save(state, options.checkpoint_path)


def save(state, folder: str) -> str:
    """Write the network of ``state`` to ``folder`` atomically; return the file's path."""
    net = state.network
    arrays = {}
    for kind, table in (("learnables", net.learnables), ("state", net.state)):
        for path, value in table.items():
            if value is not None:
                arrays[f"{kind}/{path}"] = np.asarray(jax.device_get(value))
    arrays["iteration"] = np.asarray(state.iteration)
    arrays["epoch"] = np.asarray(state.epoch)
    stamp = time.strftime("%Y_%m_%d__%H_%M_%S")
    path = os.path.join(folder, f"net_checkpoint__{state.iteration}__{stamp}.npz")
    fd, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            np.savez(file, **arrays)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return path
