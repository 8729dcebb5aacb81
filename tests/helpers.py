"""Helpers shared by the test modules (``from helpers import tree_allclose``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# XLA without LLVM's optimization passes: the suite compiles many small programs once each
# (tests/conftest.py says why); subprocesses that set their own XLA_FLAGS add these.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def tree_allclose(a, b, *, rtol=1e-6, atol=1e-6) -> bool:
    """True when ``a`` and ``b`` have the same pytree structure and close leaves."""
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    if tree_a != tree_b:
        return False
    for x, y in zip(leaves_a, leaves_b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not np.allclose(x, y, rtol=rtol, atol=atol):
            return False
    return True


def assert_tree_allclose(a, b, *, rtol=1e-6, atol=1e-6) -> None:
    """Like :func:`tree_allclose`, with a message that says which leaf differs and by how much."""
    leaves_a, tree_a = jax.tree.flatten_with_path(a)[0], jax.tree.structure(a)
    leaves_b, tree_b = jax.tree.flatten_with_path(b)[0], jax.tree.structure(b)
    assert tree_a == tree_b, f"structures differ:\n{tree_a}\n{tree_b}"
    for (path, x), (_, y) in zip(leaves_a, leaves_b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        where = jax.tree_util.keystr(path) or "<root>"
        assert x.shape == y.shape, f"{where}: shape {x.shape} != {y.shape}"
        assert x.dtype == y.dtype, f"{where}: dtype {x.dtype} != {y.dtype}"
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=where)


def run_python(
    code_or_path, *args, env=None, timeout=600, devices=None
) -> subprocess.CompletedProcess:
    """Run Python in a fresh subprocess (x64 off, as a user would) and return the result.

    ``devices`` forces that many host (CPU) devices through ``XLA_FLAGS``.
    """
    full_env = dict(os.environ)
    full_env.pop("JAX_ENABLE_X64", None)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    if devices is not None:
        full_env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {TEST_XLA_FLAGS}"
    full_env.update(env or {})
    if isinstance(code_or_path, Path):
        cmd = [sys.executable, str(code_or_path), *args]
    else:
        cmd = [sys.executable, "-c", code_or_path, *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=ROOT
    )


class TraceCounter:
    """Counts how many times a Python function is traced (chex's ``assert_max_traces`` idea)."""

    def __init__(self):
        self.count = 0

    def __call__(self, fn):
        def wrapped(*args, **kwargs):
            self.count += 1
            return fn(*args, **kwargs)

        return wrapped


def unwritable_folder(tmp_path) -> Path:
    """A folder in which creating a file fails with a real OS error (for any user).

    A folder made read-only, where that stops this user (not root); else ``/sys``, which
    refuses new files even to root. Skips only when neither refuses.
    """
    import pytest

    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys")):
        try:
            (candidate / ".probe").write_bytes(b"")
        except OSError:
            return candidate
        (candidate / ".probe").unlink()
    pytest.skip("no folder here refuses new files to this user")
