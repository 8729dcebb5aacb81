"""Run every example and keep what it prints and draws, for the documentation's gallery.

    python tools/gallery.py [NAME ...]

Each script in ``examples/`` runs as a user runs it (the main example, ``00_elu_digits``, with
its full settings, whose training-progress plot is the picture on the home page; the others with
``--small``), with ``DIFFFN_OUTPUT_DIR=docs/gallery/<name>``: its output goes to
``docs/gallery/<name>/output.txt`` next to the figures it writes. The site's gallery pages
(``docs/hooks/gallery.py``) show the script's docstring, its source, that output and the
figures. Rerun this after changing an example; ``tests/test_docs_site.py`` fails when an
example has no recorded output, or changed since it was recorded (``source.sha256``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GALLERY = ROOT / "docs" / "gallery"
FULL = {"00_elu_digits"}  # run as `make demo` runs it: its plot is the home page's picture


def source_hash(script: Path) -> str:
    """The hash of the script the output was recorded from (the test compares it)."""
    return hashlib.sha256(script.read_bytes()).hexdigest()


def run(script: Path) -> None:
    out = GALLERY / script.stem
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    args = [] if script.stem in FULL else ["--small"]
    env = {**os.environ, "MPLBACKEND": "Agg", "DIFFFN_OUTPUT_DIR": str(out)}
    env.pop("XLA_FLAGS", None)
    result = subprocess.run(
        [sys.executable, str(script), *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"{script.name} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    command = f"$ python examples/{script.name}{' ' + ' '.join(args) if args else ''}\n"
    printed = result.stdout.replace(str(ROOT) + os.sep, "")  # paths as in a clone
    (out / "output.txt").write_text(command + printed)
    (out / "source.sha256").write_text(source_hash(script) + "\n")
    print(f"{script.name}: {len(result.stdout.splitlines())} lines, "
          f"{len(list(out.glob('*.png')))} figure(s)")  # fmt: skip


def main(names: list[str]) -> None:
    scripts = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))
    for script in scripts:
        if not names or script.stem in names:
            run(script)


if __name__ == "__main__":
    main(sys.argv[1:])
