"""benchmarks/bench_models.py at its quick sizes: the four frameworks train the same program.

The benchmark's comparison is honest only if difffn, the hand-written loop, flax.nnx and equinox
start from the same parameters and compute the same thing: the loss of the first step (same
forward pass) and of the second (same gradients and the same SGD-with-momentum update) agree.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import bench_models


def _losses(model, framework):
    # The benchmark is user code, run with JAX's default rank promotion as users run it
    # (flax's and equinox's layers broadcast biases implicitly).
    with jax.numpy_rank_promotion("allow"):
        train = bench_models.trainer(model, framework, quick=True, batches=2)
        _, losses = train(1)
        if framework == "equinox":
            # the benchmark times many runs, each from the same initial parameters: equinox's
            # loop donates its inputs, so a second run shows whether they were reused
            _, again = train(1)
            np.testing.assert_array_equal(again, losses)
    return np.asarray(losses)


@pytest.fixture(scope="module")
def hand_written():
    """The hand-written jax + optax loop's losses per model, computed once."""
    computed = {}

    def losses(model):
        if model not in computed:
            computed[model] = _losses(model, "jax.jit + optax")
        return computed[model]

    return losses


@pytest.mark.slow  # each test compiles a training step (and the hand-written one, once per model)
@pytest.mark.parametrize("framework", ["difffn.trainnet", "flax.nnx", "equinox"])
@pytest.mark.parametrize("model", ["resnet", "transformer"])
def test_every_framework_computes_the_same_losses(model, framework, hand_written):
    expected = hand_written(model)
    assert expected.shape == (2,) and np.all(np.isfinite(expected))
    assert expected[1] != expected[0]  # the second step sees updated parameters
    np.testing.assert_allclose(_losses(model, framework), expected, rtol=1e-5)


def test_worker_memory_is_its_own_not_its_parents():
    """A worker reports its own peak memory, not the high-water mark of the process that
    started it (Linux's ru_maxrss carries the parent's across fork and exec)."""
    import subprocess
    import sys

    held = np.ones(2**27)  # 1 GiB, touched: this process's peak is at least that
    child = subprocess.run(
        [sys.executable, "-c", "from benchmarks import bench_models as b; print(b.peak_rss_mib())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    own = float(child.stdout.split()[-1])
    assert held.nbytes / 2**20 >= 1024
    assert 10 < own < 900, f"the worker reported {own:.0f} MiB, its parent holds over 1 GiB"
    assert bench_models.peak_rss_mib() > 1024


@pytest.mark.slow  # builds and trains the PyTorch models (runs where torch is installed)
@pytest.mark.parametrize("model", ["resnet", "transformer"])
def test_pytorch_loops_compute_the_same_losses(model, hand_written):
    """PyTorch is not a dependency: where it is installed (the benchmark's own environment), its
    eager loops start from difffn's parameters and match the hand-written JAX loop's losses."""
    pytest.importorskip("torch")
    expected = hand_written(model)
    for variant in bench_models.torch_variants(model):
        if variant == "torch.compile":
            continue  # the same model, compiled: minutes of compiling; the benchmark checks it
        _, losses = bench_models.trainer(model, variant, quick=True, batches=2)(1)
        np.testing.assert_allclose(losses, expected, rtol=1e-5, err_msg=variant)


def test_without_torch_the_benchmark_says_how_to_add_it(monkeypatch):
    from benchmarks import _torch

    monkeypatch.setattr(_torch.importlib.util, "find_spec", lambda name: None)
    assert not _torch.available() and bench_models.torch_variants("resnet") == ()
    assert "pip install torch" in _torch.HOW_TO_ADD


def test_cpu_flags_benchmark_compiles_each_candidate_and_compares_its_losses():
    from benchmarks import bench_cpu_flags

    xnn = bench_cpu_flags.CANDIDATES["xnnpack dot"]
    candidates = {"default": {}, "xnnpack dot": xnn, "bogus": {"xla_cpu_no_such_option": True}}
    with jax.numpy_rank_promotion("allow"):
        result = bench_cpu_flags.measure("transformer", True, candidates)
    assert result["default"]["loss_diff"] == 0.0 and result["default"]["step_s"] > 0
    assert result["default"]["cpu_step_s"] > 0
    assert result["xnnpack dot"]["loss_diff"] < 1e-5  # the same losses, other kernels
    assert "xla_cpu_no_such_option" in result["bogus"]["error"]


def test_workers_compile_without_the_users_cache_unless_given_one(monkeypatch, tmp_path):
    """Network.initialize and trainnet turn the persistent cache on by default: a worker that
    left it on would write into the user's cache folder, and the next run's cold first step
    would not be cold. Workers get DIFFFN_COMPILATION_CACHE=off, or the cache pair's folder."""
    import subprocess

    seen = []

    def run(command, env=None, **kwargs):
        seen.append(env["DIFFFN_COMPILATION_CACHE"])
        return subprocess.CompletedProcess(command, 0, stdout='{"ok": 1}\n', stderr="")

    monkeypatch.setattr(bench_models.subprocess, "run", run)
    assert bench_models._in_subprocess("--worker", "resnet", "equinox") == {"ok": 1}
    assert bench_models._in_subprocess("--worker", "x", "y", cache=str(tmp_path)) == {"ok": 1}
    assert seen == ["off", str(tmp_path)]


def test_the_table_splits_difffns_first_step_into_initializing_and_trainnet(capsys):
    """The cold first step of difffn includes building and initializing its network, which the
    hand-written loop (handed difffn's parameters) does not do: the report says both."""
    row = {"step_s": 0.1, "step_s_median": 0.1, "cpu_step_s": 0.2, "maxrss_mib": 500.0}
    row |= {"losses": [2.5, 2.3], "noise": 0.05}
    results = {
        "difffn.trainnet": row | {"first_step_s": 3.0, "initialize_s": 1.0},
        "jax.jit + optax": row | {"first_step_s": 2.5},
    }
    bench_models.print_results("resnet", results, quick=True)
    out = capsys.readouterr().out
    assert (
        "first step (cold): difffn 3.00 s, of which 1.00 s building and initializing the "
        "network, 2.00 s trainnet from the initialized network; jit+optax 2.50 s" in out
    )
    assert "difffn no slower: 1.20x, from initialized parameters 0.80x)" in out


def test_the_table_compares_the_first_step_when_both_make_their_parameters(capsys):
    """Building and initializing is in difffn's timed part; the hand-written loop's cold first
    step is also measured making its own parameters (one jitted initializer, as JAX users
    write it), and the report gives that comparison beside the other."""
    row = {"step_s": 0.1, "step_s_median": 0.1, "cpu_step_s": 0.2, "maxrss_mib": 500.0}
    row |= {"losses": [2.5, 2.3], "noise": 0.05}
    results = {
        "difffn.trainnet": row | {"first_step_s": 3.0, "initialize_s": 1.0},
        "jax.jit + optax": row | {"first_step_s": 2.5},
    }
    bench_models.print_results("resnet", results, quick=True, own_init={"first_step_s": 6.0})
    out = capsys.readouterr().out
    assert (
        "first step (cold), both making their parameters: difffn 3.00 s, jit+optax with its "
        "own jitted initializers 6.00 s (difffn 0.50x)" in out
    )


def test_the_hand_written_initializer_draws_every_leaf_in_its_shape():
    like = {"a": {"w": jax.ShapeDtypeStruct((3, 3, 4, 8), jnp.float32)}}
    like["a"]["b"] = jax.ShapeDtypeStruct((8,), jnp.float32)
    params = bench_models.hand_initializer(like)(jax.random.key(0))
    assert params["a"]["w"].shape == (3, 3, 4, 8) and float(jnp.std(params["a"]["w"])) > 0
    assert bool(jnp.all(params["a"]["b"] == 1.0))
