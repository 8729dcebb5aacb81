"""15: one training run over two processes joined by ``jax.distributed`` (multi-host).

This script is its own launcher. Run plainly, it starts two copies of itself on this machine
(``127.0.0.1``, a free port, 2 CPU devices each: one 4-device mesh) and waits for them; each
copy calls ``jax.distributed.initialize`` first, then trains the same network on the same
arrays with ``execution_environment="multi-host"``. Only process 0 prints the verbose table and
the result. On real hosts, start one copy per host with ``--process-id I --processes N
--coordinator HOST:PORT`` (see docs/scaling.md).

Run: ``python examples/15_multihost.py [--small]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from typing import Any


def launch(small: bool) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    env["JAX_PLATFORMS"] = "cpu"
    extra = ["--small"] if small else []
    command = [sys.executable, __file__, *extra, "--processes", "2", "--coordinator"]
    procs = [
        subprocess.Popen([*command, f"127.0.0.1:{port}", "--process-id", str(i)], env=env)
        for i in range(2)
    ]
    try:
        return max(p.wait(timeout=600) for p in procs)
    finally:
        for p in procs:  # never leave a process behind
            if p.poll() is None:
                p.kill()
                p.wait()


def train(args) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.processes,
        process_id=args.process_id,
    )
    import numpy as np
    from sklearn.datasets import load_digits

    import difffn as df

    digits: Any = load_digits()  # a Bunch (sklearn's stubs say Bunch or tuple)
    X = (digits.data / 16.0).astype(np.float32)
    T = digits.target.astype(np.int32)
    n = 400 if args.small else 1500
    L = df.layers
    net = df.Network(
        [L.FeatureInput(64), L.FullyConnected(32), L.ReLU(), L.FullyConnected(10), L.Softmax()]
    )
    options = df.TrainingOptions(
        "adam",
        max_epochs=2 if args.small else 10,
        mini_batch_size=64,  # the global batch, split over the 4 devices of both processes
        initial_learn_rate=0.01,
        execution_environment="multi-host",
        verbose=True,
        verbose_frequency=10,
    )
    net, info = df.trainnet(X[:n], T[:n], net, "crossentropy", options, key=jax.random.key(0))
    accuracy = df.testnet(net, X[1500:], T[1500:], "accuracy", execution_environment="multi-host")
    if jax.process_index() == 0:
        print(f"{jax.process_count()} processes, {len(jax.devices())} devices")
        print(f"stop: {info.stop_reason}; test accuracy {accuracy:.1f}%")


def main() -> int:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny settings (the test suite)")
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--coordinator")
    args = parser.parse_args()
    if args.process_id is None:
        return launch(args.small)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
