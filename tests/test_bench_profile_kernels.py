"""benchmarks/profile_kernels.py: XLA's thunks classified from XLA's own optimized HLO."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import profile_kernels


def _conv(x, w, stride=1):
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def test_convolutions_and_matrix_products_are_told_apart():
    """XLA rewrites every convolution to one form (b01f_01io->b01f); the classifier still tells
    the forward convolution, the input gradient and the filter gradient apart, in the HLO that
    XLA itself compiled for a training step's gradients."""
    x = jnp.ones((8, 16, 16, 4), jnp.float32)
    w = jnp.ones((3, 3, 4, 6), jnp.float32)
    v = jnp.ones((16 * 16 * 6, 5), jnp.float32)

    def loss(x, w, v):
        y = jax.nn.relu(_conv(x, w))
        return jnp.sum((y.reshape(8, -1) @ v) ** 2)

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, w, v).compile().as_text()
    instructions = profile_kernels._entry_instructions(hlo)
    computations = profile_kernels._computations(hlo)
    names = profile_kernels.entry_names(hlo)
    kinds = {profile_kernels.classify(n, instructions, computations) for n in names}
    groups = {k.split(" -> ")[0] for k in kinds}
    assert {"conv forward", "conv input gradient", "conv filter gradient"} <= groups, kinds
    assert "dot" in groups, kinds
    filters = [k for k in kinds if k.startswith("conv filter gradient")]
    # the filter gradient's output is the filter's size (3x3, 4 -> 6 channels, in some order)
    shapes = [re.search(r"-> \[([\dx]+)\]", k).group(1).split("x") for k in filters]
    assert shapes and all(sorted(map(int, s)) == [3, 3, 4, 6] for s in shapes), filters
    assert profile_kernels.classify("no-such-thunk", instructions, computations) == "?"


def test_summary_groups_and_shares():
    result = {
        "rows": [
            {"kernel": "a", "group": "dot", "s": 0.3},
            {"kernel": "b", "group": "dot", "s": 0.1},
            {"kernel": "c", "group": "elementwise", "s": 0.1},
        ]
    }
    rows = profile_kernels.summary(result, "group")
    assert [r[0] for r in rows] == ["dot", "elementwise"]
    np.testing.assert_allclose([r[1] for r in rows], [0.4, 0.1])
    np.testing.assert_allclose([r[2] for r in rows], [0.8, 0.2])


def test_the_kernel_reproducer_times_the_kernels_it_names(monkeypatch, capsys):
    """benchmarks/repro_cpu_kernels.py: every kernel it reports runs and is reported with its
    time and rate (torch hidden, as in CI), and the attention kernel counts its FLOPs right."""
    from benchmarks import repro_cpu_kernels

    monkeypatch.setattr(repro_cpu_kernels, "REPEATS", 1)
    seconds, flops, (q, k) = repro_cpu_kernels.attention_scores(batch=2, steps=8, head=4)
    assert seconds > 0 and flops == 3 * 2 * 2 * 8 * 8 * 4
    assert q.shape == k.shape == (2, 8, 4)
    monkeypatch.setattr(repro_cpu_kernels.importlib.util, "find_spec", lambda name: None)
    assert repro_cpu_kernels.main() == 0
    out = capsys.readouterr().out
    for row in ("conv 3x3 filter gradient", "dense fwd+bwd", "attention scores fwd+bwd"):
        assert re.search(rf"{re.escape(row)}\s+XLA\s+[\d.]+ ms \(\s*[\d.]+ GFLOP/s\)", out), out
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        for row in ("dS K (batched)", "dS^T Q (batched)", "dense x W"):  # two children
            pattern = rf"{re.escape(row)}\s+XLA\s+[\d.]+ ms on one core,\s+[\d.]+ ms on \d+ "
            assert re.search(pattern, out), out


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux's CPU affinity")
def test_the_reproducer_pins_its_child_to_one_core():
    """Item 5's child process runs on one core when pinned, on all otherwise."""
    code = (
        "import os; from benchmarks import repro_cpu_kernels as r; r.REPEATS = 1; "
        "t = r.batched_products({pin}); print(len(os.sched_getaffinity(0)), sorted(t))"
    )
    for pin in (True, False):
        done = subprocess.run([sys.executable, "-c", code.format(pin=pin)], capture_output=True,
                              text=True, check=True, timeout=300)  # fmt: skip
        cores, names = done.stdout.split(" ", 1)
        assert int(cores) == (1 if pin else len(os.sched_getaffinity(0))), done.stdout
        assert "dense x W" in names


_TRAIN_BOTH_WAYS = """
import jax, numpy as np, difffn as df
net = df.Network([df.layers.FeatureInput(4), df.layers.FullyConnected(2), df.layers.Softmax()])
net = net.initialize(key=jax.random.key(0))
x, t = np.zeros((32, 4), np.float32), np.zeros(32, np.int32)
for spe in (1, "auto"):
    options = df.TrainingOptions("sgdm", max_epochs=1, mini_batch_size=4, verbose=False,
                                 steps_per_execution=spe)
    df.trainnet(x, t, net, "crossentropy", options)
"""


def test_the_step_modules_hlo_is_read_from_xla_dump(tmp_path):
    """trainnet's step compiles as ``jit_step`` (one per call) or ``jit_train_steps`` (several
    per call): each module's optimized HLO is found among the files ``--xla_dump_to`` writes,
    not another module's and not the reports beside it."""
    dump = tmp_path / "dump"
    env = os.environ | {"XLA_FLAGS": f"--xla_dump_to={dump}", "DIFFFN_COMPILATION_CACHE": "off"}
    done = subprocess.run(
        [sys.executable, "-c", _TRAIN_BOTH_WAYS], env=env, capture_output=True, text=True,
        check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    for module in profile_kernels.MODULES:
        hlo = profile_kernels._step_hlo(str(dump), module)
        assert hlo.startswith(f"HloModule {module},"), (module, hlo[:80])
    assert profile_kernels._step_hlo(str(dump), "jit_no_such_module") == ""
