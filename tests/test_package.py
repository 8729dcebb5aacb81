"""The package as a user gets it: a wheel and an sdist, installed outside the repository.

The wheel and the sdist are built from this checkout with ``python -m build --no-isolation``
(hatchling from the test environment: nothing is downloaded), checked by ``twine check`` (the
package index's own rendering of the README), and the wheel is installed with ``--no-deps
--no-index`` into a fresh virtual environment in a temporary folder. That environment sees the
test environment's packages (jax, flax, ...) through a ``.pth`` file, never this checkout: the
commands run from the temporary folder with no ``PYTHONPATH``, and the test checks that
``difffn`` is imported from the new environment.
"""

from __future__ import annotations

import email
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT

import difffn as df

pytestmark = pytest.mark.slow


def _run(command: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["MPLBACKEND"] = "Agg"
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (
        f"{command} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    )
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], ROOT)
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory, dist) -> Path:
    """A fresh environment with the wheel installed (and the test environment's packages)."""
    folder = tmp_path_factory.mktemp("user")
    env = folder / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env)], folder)
    python = env / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            folder,
        ).stdout.strip()
    )
    (site / "suite_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(dist.glob("*.whl"))
    # The new environment's own python runs pip (seen through the .pth file), so the difffn
    # script runs that python; --ignore-installed: pip leaves the test environment alone.
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed",
          "--no-warn-script-location", str(wheel)], folder)  # fmt: skip
    return env


def test_twine_checks_the_wheel_and_the_sdist(dist):
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2 and any(f.endswith(".whl") for f in files), files
    result = _run([sys.executable, "-m", "twine", "check", "--strict", *files], dist)
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_the_wheel_holds_the_license_the_types_and_the_examples(dist):
    wheel = zipfile.ZipFile(next(dist.glob("*.whl")))
    names = wheel.namelist()
    assert "difffn/py.typed" in names
    assert "difffn/examples/00_elu_digits.py" in names
    license_file = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    assert "Apache License" in wheel.read(license_file).decode()
    metadata = email.message_from_bytes(
        wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    )
    assert metadata["Version"] == df.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    assert {u.split(",")[0] for u in metadata.get_all("Project-URL")} >= {"Documentation", "Source"}
    assert re.search(
        r"Requires-Dist: jax<0\.\d+,>=|Requires-Dist: jax>=[\d.]+,<0\.\d+", str(metadata)
    )
    # The README is the package page: its links must work off the repository.
    readme = metadata.get_payload()
    relative = re.findall(r"\]\((?!https?://|#)([^)]+)\)", readme)
    assert not relative, f"relative links in the README (broken on the package index): {relative}"
    assert 'pip install "difffn[onnx]"' in readme and "make test" in readme


def test_the_installed_wheel_runs_outside_the_repository(venv):
    python, difffn = venv / "bin" / "python", venv / "bin" / "difffn"
    where = _run([str(python), "-c", "import difffn; print(difffn.__file__)"], venv.parent)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    version = _run([str(difffn), "--version"], venv.parent)
    assert re.fullmatch(rf"difffn {re.escape(df.__version__)} \(jax [\d.]+, Python 3\.\d+\.\d+\)\n",
                        version.stdout), version.stdout  # fmt: skip
    demo = _run([str(difffn), "demo", "--small"], venv.parent)
    assert "Test Summary" in demo.stdout and "accuracy" in demo.stdout.lower(), demo.stdout[-2000:]


def test_lower_bounds_pin_every_requirement_and_jax_is_bounded_above():
    """tools/lower_bounds.py (make test-oldest) pins each requirement; while difffn imports
    jax._src, JAX's next minor version is excluded."""
    result = _run([sys.executable, str(ROOT / "tools" / "lower_bounds.py")], ROOT)
    pins = dict(line.split("==") for line in result.stdout.split())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {"jax", "jaxlib", "flax", "optax", "flatbuffers"} <= set(pins)
    private = [
        p.relative_to(ROOT)
        for p in (ROOT / "difffn").rglob("*.py")
        if re.search(r"^\s*(from|import) jax\._src", p.read_text(), re.M)
    ]
    jax = next(r for r in project["dependencies"] if re.match(r"jax\b(?!lib)", r))
    if private:
        major, minor = (int(x) for x in pins["jax"].split(".")[:2])
        assert f"<{major}.{minor + 1}" in jax, (
            f"{private} import jax._src, so {jax!r} needs the upper bound <{major}.{minor + 1}"
        )
        listed = (ROOT / "docs" / "architecture.md").read_text().split("## jax._src imports")[1]
        for path in private:
            assert f"`{path.relative_to('difffn')}`" in listed, f"{path} is not listed"
