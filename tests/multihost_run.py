"""Training in several processes joined by ``jax.distributed``, for tests/test_multihost.py.

``python tests/multihost_run.py MODE OUT [PROCESS_ID NUM_PROCESSES PORT]``. With a process id the
script joins a job on ``127.0.0.1:PORT`` (gloo collectives on CPU) and trains with
``execution_environment="multi-host"``; without, it is one process. Process 0 (or the one
process) writes what the test compares into the folder OUT:

* ``single``: one process (4 devices): the run with ``"multi-device"`` and with one device
  (``"auto"``), and the iterable-of-shards runs as one process sees them (``single.npz``,
  ``single.json``);
* ``multihost``: the run, checkpoints in ``OUT/ckpt``; a run with mini-batches of 30, padded to
  split over the 4 devices (``single`` trains it on one device); an iterable run in which each
  process yields its own share of every batch; the ``iterable_uneven`` group, in which each
  process yields shares of 3 (global batches of 6 over 4 devices: padded share by share, or
  replicated with batch norm) and then shares of 3 and 4 (a named error); ``minibatchpredict``
  and ``testnet`` on the mesh (``multihost.npz``, ``multihost.json``);
* ``killed``: the run with checkpoints in ``OUT/ckpt-killed`` and ``process_timeout=10``; process 1
  SIGKILLs itself once the checkpoint of iteration ``KILL_AT`` is committed (writing the time to
  ``OUT/killed_at.txt``), while process 0 sleeps 0.5 s per later iteration in ``output_fcn``
  (so the run cannot end first); process 0 is then stopped by difffn's watchdog;
* ``hung``: the same, in ``OUT/ckpt-hung``, but process 1 stops (SIGSTOP: it hangs, alive)
  (``OUT/hung_at.txt``);
* ``resumed``: ``resume_from=OUT/ckpt-damaged``, a copy of ``OUT/ckpt-killed`` whose newest
  checkpoint the test damaged (``resumed.npz``, ``resumed.json``, and each process's
  ``CheckpointWarning`` messages in ``resumed_warnings_<process>.json``);
* ``resumed_from_one``: a 2 x 2 job with ``parameter_sharding="fsdp"`` resumes ``OUT/ckpt-one``,
  the checkpoints of a one-process, one-device run paused at iteration ``PAUSE_AT`` (written by
  ``single``);
* ``resume_one`` (one process, 4 devices): ``OUT/ckpt-killed`` resumed on one device (``"auto"``)
  and on 1 x 4 devices with ``parameter_sharding="fsdp"`` (``resume_one.npz``).

The run is ``checkpoint_run``'s (input statistics, batch norm, dropout keys, a shuffle every
epoch, a learn-rate schedule, validation with the best-validation network), with a validation
set whose last batch (14) does not split over 4 devices.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import jax

if len(sys.argv) > 3:  # before anything else uses JAX
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{sys.argv[5]}",
        num_processes=int(sys.argv[4]),
        process_id=int(sys.argv[3]),
    )

import checkpoint_run as run  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import difffn as df  # noqa: E402

KILL_AT = 12
PAUSE_AT = 10
X, T, X_VAL, T_VAL = run.data()
X_VAL, T_VAL = X_VAL[:46], T_VAL[:46]


def train(environment, folder=None, *, resume_from=None, output_fcn=None, **changes):
    options = run.options(
        folder,
        execution_environment=environment,
        validation_data=(X_VAL, T_VAL),
        checkpoint_frequency=4,
        output_fcn=output_fcn,
        **changes,
    )
    key = None if resume_from is not None else jax.random.key(run.KEY)
    return df.trainnet(
        X, T, run.network(), "crossentropy", options, key=key, resume_from=resume_from
    )


def plain_network():
    """No batch norm, whose statistics would see the padding; no dropout, whose mask is drawn
    for the padded batch."""
    L = df.layers
    return df.Network(
        [L.FeatureInput(4), L.FullyConnected(8), L.ReLU(), L.FullyConnected(3), L.Softmax()]
    )


def batch_norm_network():
    """The smallest network whose state (batch norm's statistics) learns from the whole batch."""
    L = df.layers
    return df.Network([L.FeatureInput(4), L.FullyConnected(3), L.BatchNorm(), L.Softmax()])


def uneven(environment):
    """Mini-batches of 30 over 4 devices, padded to 32."""
    options = df.TrainingOptions(
        max_epochs=1, mini_batch_size=30, verbose=False, execution_environment=environment
    )
    net = plain_network()
    return df.trainnet(X, T, net, "crossentropy", options, key=jax.random.key(run.KEY))[0]


def shards(process: int | None, processes: int, size: int = 16, count: int = 6):
    """Process ``process``'s share of each of ``count`` batches of ``size``: rows
    ``process::processes`` of the batch (in a single process: the whole batch, the processes'
    shares in order)."""
    batches = []
    for b in range(count):
        rows = np.arange(b * size, (b + 1) * size)
        parts = [rows[p::processes] for p in range(processes)]
        mine = np.concatenate(parts) if process is None else parts[process]
        batches.append((X[mine], T[mine]))
    return batches


def iterable_uneven(environment, process: int | None, processes: int = 2) -> tuple[dict, dict]:
    """The ``iterable_uneven`` group: 4 global batches of 6, fed as shares of 3 per process
    (in a single process: the global batches), to a network without batch norm (padded share
    by share in a multi-host run) and to one with batch norm (gathered and replicated). In a
    multi-host run, also shares of 3 in process 0 and 4 in process 1 (an ``OptionsError`` in
    every process). Returns ``(arrays, facts)``."""
    data = shards(process, processes, size=6, count=4)
    options = df.TrainingOptions(
        max_epochs=1, initial_learn_rate=0.1, verbose=True, execution_environment=environment
    )
    arrays, facts = {}, {}
    for name, network in (("padded", plain_network), ("replicated", batch_norm_network)):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):  # the verbose table: what was done, and why
            net, info = df.trainnet(data, network(), "crossentropy", options)
        lines = printed.getvalue().splitlines()
        facts[f"{name}_printed"] = [line for line in lines if "Mini-batches of" in line]
        facts[f"{name}_loss"] = info.training_history["loss"].tolist()
        arrays |= {f"{name}/{k}": v for k, v in learnables(net).items()}
        arrays |= {f"{name}_state/{k}": np.asarray(v) for k, v in net.state.items()}
    if process is not None:
        unequal = [(X[: 3 + process], T[: 3 + process])] * 2
        try:
            df.trainnet(unequal, plain_network(), "crossentropy", options)
        except df.OptionsError as error:
            facts["unequal"] = str(error)
            print(f"process {process}: unequal shares refused", flush=True)
    return arrays, facts


def learnables(net) -> dict:
    """Host copies; an fsdp learnable of a multi-host run is gathered (every process calls)."""

    def host(value):
        if value.is_fully_replicated or value.is_fully_addressable:
            return np.asarray(value)
        return np.asarray(multihost_utils.process_allgather(value, tiled=True))

    return {path: host(value) for path, value in net.learnables.items()}


def save(out: Path, name: str, arrays: dict, facts: dict) -> None:
    np.savez(out / f"{name}.npz", **arrays)
    (out / f"{name}.json").write_text(json.dumps(facts))


def stop_after_checkpoint(folder: Path, stamp: Path, how: signal.Signals) -> None:
    """Once the checkpoint of iteration KILL_AT is committed, write the time to ``stamp`` and
    send this process ``how`` (SIGKILL: it dies; SIGSTOP: it hangs, every thread stopped)."""
    while not list(folder.glob(f"net_checkpoint__{KILL_AT}__*")):
        time.sleep(0.01)
    stamp.write_text(repr(time.time()))
    os.kill(os.getpid(), how)


def main():
    mode, out = sys.argv[1], Path(sys.argv[2])
    multi = len(sys.argv) > 3
    process = jax.process_index()
    if mode == "single":
        many, info = train("multi-device")
        one, _ = train("auto")
        options = df.TrainingOptions(max_epochs=1, verbose=False, execution_environment="auto")
        net, _ = df.trainnet(shards(None, 2), run.network(), "crossentropy", options)
        arrays = {f"many/{k}": v for k, v in learnables(many).items()}
        arrays |= {f"one/{k}": v for k, v in learnables(one).items()}
        arrays |= {f"iterable/{k}": v for k, v in learnables(net).items()}
        arrays |= {f"uneven/{k}": v for k, v in learnables(uneven("auto")).items()}
        group, group_facts = iterable_uneven("auto", None)
        arrays |= {f"iterable_uneven/{k}": v for k, v in group.items()}
        scores = df.minibatchpredict(many, X_VAL, mini_batch_size=16)
        arrays["scores"] = np.asarray(scores.data)
        facts = {
            "loss": info.training_history["loss"].tolist(),
            "validation": info.validation_history["loss"].tolist(),
            "stop_reason": info.stop_reason,
            "accuracy": df.testnet(many, X_VAL, T_VAL, "accuracy", mini_batch_size=16),
            "iterable_uneven": group_facts,
        }
        save(out, "single", arrays, facts)
        (out / "ckpt-one").mkdir(exist_ok=True)  # 1 x 1, paused: the 2 x 2 job resumes it
        train("auto", out / "ckpt-one", output_fcn=lambda info: info["iteration"] >= PAUSE_AT)
        return
    if mode == "resume_one":
        arrays = {}
        for name, environment, sharding in (
            ("one", "auto", "replicated"),
            ("fsdp", "multi-device", "fsdp"),
        ):
            net, info = train(
                environment, resume_from=str(out / "ckpt-killed"), parameter_sharding=sharding
            )
            arrays |= {f"{name}/{k}": v for k, v in learnables(net).items()}
            arrays[f"{name}_loss"] = info.training_history["loss"]
        save(out, "resume_one", arrays, {})
        return
    if mode in ("multihost", "killed", "hung"):
        folder = out / {"multihost": "ckpt", "killed": "ckpt-killed", "hung": "ckpt-hung"}[mode]
        folder.mkdir(exist_ok=True)
        calls = out / f"output_fcn_{process}.txt"

        def output_fcn(info):
            with open(calls, "a") as f:
                f.write(f"{info['state']} {info['iteration']}\n")
            if mode in ("killed", "hung") and info["iteration"] > KILL_AT:
                time.sleep(0.5)  # process 1 dies meanwhile
            return False

        if mode in ("killed", "hung") and process == 1:
            how = signal.SIGKILL if mode == "killed" else signal.SIGSTOP
            threading.Thread(
                target=stop_after_checkpoint,
                args=(folder, out / f"{mode}_at.txt", how),
                daemon=True,
            ).start()
        plots = out / f"plot_{process}.png"
        net, info = train(
            "multi-host",
            folder,
            output_fcn=output_fcn,
            verbose=True,
            plots="training-progress",
            plots_path=str(plots),
            process_timeout=60 if mode == "multihost" else 10,
        )
        if mode in ("killed", "hung"):
            print("process", process, "was not stopped", flush=True)
            return
        if not multi:
            return
        options = df.TrainingOptions(
            max_epochs=1, verbose=False, execution_environment="multi-host"
        )
        iterable, _ = df.trainnet(
            shards(process, jax.process_count()), run.network(), "crossentropy", options
        )
        padded = uneven("multi-host")
        group, group_facts = iterable_uneven("multi-host", process, jax.process_count())
        scores = df.minibatchpredict(
            net, X_VAL, mini_batch_size=16, execution_environment="multi-host"
        )
        accuracy = df.testnet(
            net, X_VAL, T_VAL, "accuracy", mini_batch_size=16, execution_environment="multi-host"
        )
        shard_accuracy = df.testnet(
            net,
            [(X_VAL[p::2], T_VAL[p::2]) for p in [process]],
            "accuracy",
            execution_environment="multi-host",
        )
        if process == 0:
            arrays = {f"run/{k}": v for k, v in learnables(net).items()}
            arrays |= {f"iterable/{k}": v for k, v in learnables(iterable).items()}
            arrays |= {f"uneven/{k}": v for k, v in learnables(padded).items()}
            arrays |= {f"iterable_uneven/{k}": v for k, v in group.items()}
            arrays["scores"] = np.asarray(scores.data)
            facts = {
                "loss": info.training_history["loss"].tolist(),
                "validation": info.validation_history["loss"].tolist(),
                "stop_reason": info.stop_reason,
                "accuracy": accuracy,
                "shard_accuracy": shard_accuracy,
                "steps": sorted(p.name for p in folder.iterdir()),
                "iterable_uneven": group_facts,
            }
            save(out, "multihost", arrays, facts)
        print("done", process, flush=True)
        return
    if mode in ("resumed", "resumed_from_one"):
        source, sharding = {
            "resumed": ("ckpt-damaged", "replicated"),
            "resumed_from_one": ("ckpt-one", "fsdp"),
        }[mode]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", df.CheckpointWarning)
            net, info = train(
                "multi-host", resume_from=str(out / source), parameter_sharding=sharding
            )
        said = [str(w.message) for w in caught if w.category is df.CheckpointWarning]
        (out / f"{mode}_warnings_{process}.json").write_text(json.dumps(said))
        arrays = {f"run/{k}": v for k, v in learnables(net).items()}
        if process == 0:
            facts = {
                "loss": info.training_history["loss"].tolist(),
                "stop_reason": info.stop_reason,
                "iterations": info.training_history["iteration"].tolist(),
            }
            save(out, mode, arrays, facts)
        return
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
