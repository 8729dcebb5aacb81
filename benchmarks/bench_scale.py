"""Replicated vs fsdp learnables on 4 host devices: per-device bytes and steps/s.

Runs in a subprocess with ``--xla_force_host_platform_device_count=4`` (the device count is
fixed when JAX starts). Per-device bytes are the trained learnables' ``addressable_shards``;
steps/s is iterations over ``info.elapsed`` (compilation included, the same for both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CODE = r"""
import json, sys, jax, numpy as np
import difffn as df
from difffn._devices._partition import bytes_per_device

width, epochs = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
X = rng.normal(size=(512, 64)).astype(np.float32)
T = rng.integers(0, 8, size=512).astype(np.int32)
L = df.layers
rows = {}
for mode in ("replicated", "fsdp"):
    net = df.Network([L.FeatureInput(64), L.FullyConnected(width), L.ReLU(),
                      L.FullyConnected(width), L.ReLU(), L.FullyConnected(8), L.Softmax()])
    options = df.TrainingOptions("adam", max_epochs=epochs, mini_batch_size=64, verbose=False,
                                 execution_environment="multi-device", parameter_sharding=mode)
    net, info = df.trainnet(X, T, net, "crossentropy", options, key=jax.random.key(0))
    held = bytes_per_device(list(net.learnables.values()))
    rows[mode] = {"bytes": max(held.values()), "steps_per_s": len(info.training_history)
                  / info.elapsed}
print("RESULT" + json.dumps(rows))
"""


def run(quick: bool = False) -> None:
    width, epochs = (64, 1) if quick else (512, 4)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-c", CODE, str(width), str(epochs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=root,
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    rows = json.loads(line[len("RESULT") :])
    base = rows["replicated"]
    print(f"MLP 64-{width}-{width}-8, adam, 4 host devices, mini-batch 64")
    print(f"{'learnables':>12} {'bytes/device':>14} {'ratio':>7} {'steps/s':>9} {'ratio':>7}")
    for mode, row in rows.items():
        print(
            f"{mode:>12} {row['bytes']:>14,} {row['bytes'] / base['bytes']:>7.2f} "
            f"{row['steps_per_s']:>9.1f} {row['steps_per_s'] / base['steps_per_s']:>7.2f}"
        )
