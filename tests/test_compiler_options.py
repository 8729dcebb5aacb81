"""The XLA compile options difffn chooses (``difffn/_core/_compiler_options.py``).

Checked against XLA itself: the compiled program's own text says which kernels it got, and the
numbers are compared with the program compiled with XLA's defaults.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import run_python

import difffn as df
from difffn._core import kernel_options, run_once
from difffn._training import _step

L = df.layers


def _conv_loss(x, w):
    y = jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return jnp.tanh(y).sum()


def _ynn_lines(fn, *args, options=None) -> list[str]:
    """The YNNPACK fusions of the compiled program (``%ynn_fusion = ... kind=kCustom``)."""
    text = jax.jit(fn, compiler_options=options).lower(*args).compile().as_text()
    return [line for line in text.splitlines() if "ynn_fusion" in line and "kCustom" in line]


def test_training_programs_get_xla_own_convolutions_and_the_same_numbers():
    x = jax.random.normal(jax.random.key(0), (8, 16, 16, 8))
    w = 0.1 * jax.random.normal(jax.random.key(1), (3, 3, 8, 8))
    grad = jax.grad(_conv_loss, argnums=(0, 1))
    options = kernel_options()
    assert options == {
        "xla_cpu_experimental_ynn_fusion_type": (
            "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"
        )
    }
    if jax.default_backend() == "cpu":  # XLA:CPU's default: the filter gradient to YNNPACK
        x64, w64 = jnp.ones((64, 32, 32, 16)), jnp.ones((3, 3, 16, 16))
        assert _ynn_lines(grad, x64, w64)
        assert not _ynn_lines(grad, x64, w64, options=options)
    ours = jax.jit(grad, compiler_options=options)(x, w)
    xlas = jax.jit(grad)(x, w)
    for a, b in zip(ours, xlas, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_trainnet_compiles_its_step_with_them(monkeypatch):
    seen = []
    real = jax.jit

    def spy(fn, **kwargs):
        seen.append(kwargs.get("compiler_options"))
        return real(fn, **kwargs)

    monkeypatch.setattr(_step.jax, "jit", spy)
    net = df.Network([L.FeatureInput(3), L.FullyConnected(2), L.Softmax()])
    X = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    T = np.arange(16) % 2
    options = df.TrainingOptions(max_epochs=1, mini_batch_size=8, verbose=False)
    df.trainnet(X, T, net.initialize(key=jax.random.key(0)), "crossentropy", options)
    assert seen and all(s == kernel_options() for s in seen if s is not None)
    assert kernel_options() in seen


_FLAGS_SCRIPT = """
import json, jax
from difffn._core import kernel_options
print(json.dumps(kernel_options()))
"""


@pytest.mark.parametrize(
    "flags, expected",
    [
        ("", True),
        ("--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_REDUCE", False),
    ],
)
def test_a_users_own_ynnpack_flag_rules(flags, expected):
    done = run_python(_FLAGS_SCRIPT, "flags", timeout=120, env={"XLA_FLAGS": flags})
    assert done.returncode == 0, done.stderr[-2000:]
    assert bool(json.loads(done.stdout.strip().splitlines()[-1])) is expected


def test_run_once_gives_what_jit_gives():
    key = jax.random.key(7)
    got = run_once(lambda k: tuple(jax.random.split(k, 3)), key)
    want = tuple(jax.random.split(key, 3))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(jax.random.key_data(a), jax.random.key_data(b))
