"""Type checking, judged by pyright and mypy (neither is ours).

One pyright run (standard mode) covers the library (``difffn/``), every example script, the
python code blocks of the README and of ``docs/*.md`` (extracted here into a temporary folder,
doctest prompts removed, the blocks of a page in one file, as a reader runs them in order) and a
probe of what a type checker must accept and reject (``L.Conv2D(3, 16)`` with its real fields,
``trainnet``'s two forms returning ``(Network, TrainingInfo)``, ``max_epoch=`` as an error).
``pyright --verifytypes`` measures the share of the public names whose types are known; mypy
checks a user script. A code block that is a fragment on purpose (it uses names the prose
defines) is preceded by the line ``<!-- typecheck: skip -->`` in its page.

pyright runs on node: the ``pyright`` package uses the machine's ``node`` (Node.js 20 here) and
ships pyright itself, so nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from difffn._training._option_types import SOLVER_OPTIONS
from difffn._training._options import OPTIONS

BIN = Path(sys.executable).parent
SKIP_MARK = "<!-- typecheck: skip -->"
FRAGMENT = "# pyright: reportUndefinedVariable=false, reportPossiblyUnboundVariable=false\n"
PREAMBLE = "import jax\nimport jax.numpy as jnp\nimport numpy as np\nimport difffn as df\n\n"

# pyright --verifytypes difffn --ignoreexternal: the share of exported symbols with known types
# (98.8 % on 2026-11-27, pyright 1.1.414; the issue asks for 95 %). The figure only goes up.
MIN_COMPLETENESS = 0.98
# pyright (standard mode) on difffn/ is clean (0 errors on 2026-11-27, pyright 1.1.414; 603
# before the typing work).
MAX_LIBRARY_ERRORS = 0

PROBE = """
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import difffn as df

L = df.layers


class Scale(df.Layer):
    weight: jax.Array = df.learnable(default=None)

    def initialize(self, layout: df.Layout, *, key: jax.Array) -> Scale:
        if self.weight is None:
            return self.replace(weight=jnp.ones((layout.size("C"),)))
        return self

    def predict(self, x: jax.Array) -> jax.Array:
        return x * self.weight


class Twice(df.DifferentiableFunction):
    def forward(self, x):
        return 2 * x

    def backward(self, dy, compute_gradients, x):
        return (2 * dy,)


net = df.Network([L.FeatureInput(3), L.FullyConnected(4), Scale(), L.Softmax()])
X, T = np.ones((8, 3), np.float32), np.zeros((8,), np.int32)
options = df.TrainingOptions("adam", max_epochs=1, verbose=False)
trained, info = df.trainnet(X, T, net, "index-crossentropy", options)
trained.predict(X).shape
info.training_history
trained, info = df.trainnet([(X, T)], [L.FeatureInput(3), L.FullyConnected(2)], "mse", options)
Twice()(jnp.ones(2)).sum()
L.Conv2D(3, 16, stride=2, name="conv")
"""

# Each line must be an error, and the rest of the probe must not be.
PROBE_ERRORS = """
df.TrainingOptions("adam", max_epoch=5)  # expect-error
df.TrainingOptions("adam", momentum=0.9)  # expect-error
df.TrainingOptions("sgdm", shuffle="sometimes")  # expect-error
L.Conv2D(3, 16, strides=2)  # expect-error
L.FullyConnected()  # expect-error
df.trainnet(X, T, net, "mse")  # expect-error
Scale(wieght=jnp.ones(3))  # expect-error
"""


def code_blocks(page: Path) -> str:
    """The page's python code blocks as one file: doctest prompts and outputs removed."""
    text = page.read_text()
    blocks = []
    for match in re.finditer(r"^([^\n]*\n)?```(?:python|pycon)\n(.*?)^```", text, re.S | re.M):
        if (match.group(1) or "").strip() == SKIP_MARK:
            continue
        lines = match.group(2).splitlines()
        if any(line.startswith(">>>") for line in lines):
            lines = [
                line[4:] for line in lines if line[:4] in (">>> ", "... ") or line in (">>>", "...")
            ]
        blocks.append("\n".join(lines))
    return PREAMBLE + "\n\n".join(blocks) + "\n" if blocks else ""


def pyright(*args: str, cwd: Path) -> dict:
    exe = BIN / "pyright"
    if not exe.exists() or shutil.which("node") is None:
        pytest.fail(
            "pyright (pip install -e '.[test]') and node (Node.js) are needed for the type checks"
        )
    result = subprocess.run(
        [str(exe), "--outputjson", "--pythonpath", sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        # The checkout first: an editable install puts a partial difffn/ (the force-included
        # examples) in site-packages, which would shadow the package and its py.typed.
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright printed no JSON: {result.stdout[-2000:]}{result.stderr[-2000:]}")


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> tuple[Path, list[dict]]:
    """One pyright run over the library, the examples, the docs' blocks and the probe."""
    folder = tmp_path_factory.mktemp("typecheck")
    shutil.copytree(ROOT / "examples", folder / "examples")  # they import each other
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        code = code_blocks(page)
        if code and page.parent.name == "docs":
            # A guide's blocks continue its prose: they may use names the prose introduces
            # (``net``, ``X``); everything else is checked as in the README and the examples.
            code = FRAGMENT + code
        if code:
            (folder / f"page_{page.stem.replace('-', '_')}.py").write_text(code)
    (folder / "probe.py").write_text(PROBE)
    (folder / "probe_errors.py").write_text(PROBE + PROBE_ERRORS)
    config = {  # pyright ignores absolute "include" entries: the targets go on the command line
        "extraPaths": [str(ROOT)],
        "typeCheckingMode": "standard",
        "pythonVersion": "3.11",
        "reportUnusedExpression": False,  # doctests end blocks with a bare expression
    }
    (folder / "pyrightconfig.json").write_text(json.dumps(config))
    report = pyright("-p", str(folder / "pyrightconfig.json"), str(folder), str(ROOT / "difffn"),
                     cwd=folder)  # fmt: skip
    analyzed = report["summary"]["filesAnalyzed"]
    expected = len(list((ROOT / "difffn").rglob("*.py"))) + len(list(folder.rglob("*.py")))
    assert analyzed >= expected, f"pyright analyzed {analyzed} files of {expected}"
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    return folder, errors


def _errors_in(errors: list[dict], path: Path) -> list[str]:
    return [
        f"{Path(d['file']).name}:{d['range']['start']['line'] + 1}: {d['message'].splitlines()[0]}"
        for d in errors
        if Path(d["file"]) == path
    ]


def _user_files(folder: Path) -> list[Path]:
    files = [*folder.glob("*.py"), *(folder / "examples").glob("*.py")]
    return sorted(p for p in files if p.stem != "probe_errors")


@pytest.mark.slow
def test_examples_docs_and_readme_type_check(checked):
    folder, errors = checked
    found = [e for path in _user_files(folder) for e in _errors_in(errors, path)]
    assert not found, "pyright (standard) on user code:\n" + "\n".join(found)


@pytest.mark.slow
def test_a_type_checker_rejects_what_difffn_rejects(checked):
    folder, errors = checked
    path = folder / "probe_errors.py"
    lines = path.read_text().splitlines()
    expected = {i + 1 for i, line in enumerate(lines) if line.endswith("# expect-error")}
    flagged = {d["range"]["start"]["line"] + 1 for d in errors if Path(d["file"]) == path}
    missing = sorted(expected - flagged)
    assert not missing, f"pyright accepted: {[lines[i - 1] for i in missing]}"
    assert flagged <= expected, _errors_in(errors, path)


@pytest.mark.slow
def test_the_library_type_checks_clean(checked):
    _, errors = checked
    library = [d for d in errors if Path(d["file"]).is_relative_to(ROOT / "difffn")]
    assert len(library) <= MAX_LIBRARY_ERRORS, (
        f"pyright (standard) reports {len(library)} errors in difffn/ (at most "
        f"{MAX_LIBRARY_ERRORS} allowed); the first: "
        + "; ".join(
            f"{Path(d['file']).relative_to(ROOT)}:{d['range']['start']['line'] + 1}: "
            f"{d['message'].splitlines()[0]}"
            for d in library[:10]
        )
    )


@pytest.mark.slow
def test_public_types_are_known(tmp_path):
    report = pyright("--verifytypes", "difffn", "--ignoreexternal", cwd=tmp_path)
    completeness = report["typeCompleteness"]
    score = completeness["completenessScore"]
    assert completeness["pyTypedPath"], "difffn ships no py.typed"
    assert score >= MIN_COMPLETENESS, (
        f"pyright --verifytypes: {score:.1%} of difffn's exported symbols have known types; "
        f"at least {MIN_COMPLETENESS:.0%} expected"
    )


@pytest.mark.slow
def test_mypy_checks_a_user_script(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(PROBE)
    bad = tmp_path / "bad.py"
    bad.write_text(PROBE + 'df.TrainingOptions("adam", max_epoch=5)\nL.Conv2D(3, 16, strides=2)\n')
    command = [sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-error-summary"]
    command += ["--cache-dir", str(tmp_path / "cache"), "--python-version", "3.11"]
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    good = subprocess.run([*command, str(script)], capture_output=True, text=True, env=env)
    assert good.returncode == 0, good.stdout + good.stderr
    flagged = subprocess.run([*command, str(bad)], capture_output=True, text=True, env=env)
    assert re.search(r'bad\.py:\d+: error: .*"max_epoch"', flagged.stdout), flagged.stdout
    assert re.search(r'bad\.py:\d+: error: Unexpected keyword argument "strides"', flagged.stdout)


def test_option_types_name_the_table_s_options():
    """The TypedDicts that type TrainingOptions' keywords list exactly the table's options."""
    for solver, typed in SOLVER_OPTIONS.items():
        own = {o.name for o in OPTIONS if o.name != "solver" and o.applies_to(solver)}
        keys = set(typed.__required_keys__) | set(typed.__optional_keys__)  # type: ignore[attr-defined]
        assert keys == own, (solver, sorted(keys ^ own))
