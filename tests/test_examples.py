"""Every numbered example runs, with small settings, in a fresh process (as a user runs it)."""

from __future__ import annotations

import pytest
from helpers import ROOT, run_python

EXAMPLES = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))
# The main example (00, what `make demo` runs) runs through `difffn demo --small` in
# tests/test_cli.py, in a fresh process too: the rest run here.
MAIN = "00_elu_digits"


def test_examples_exist():
    assert EXAMPLES, "no numbered examples found in examples/"
    assert MAIN in [p.stem for p in EXAMPLES]


@pytest.mark.parametrize(
    "path",
    [p for p in EXAMPLES if p.stem != MAIN],
    ids=[p.stem for p in EXAMPLES if p.stem != MAIN],
)
def test_example_runs_with_small_settings(path, tmp_path):
    result = run_python(
        path, "--small", env={"MPLBACKEND": "Agg", "DIFFFN_OUTPUT_DIR": str(tmp_path)}
    )
    assert result.returncode == 0, (
        f"{path.name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    assert result.stdout.strip(), f"{path.name} printed nothing"
