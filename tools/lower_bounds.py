"""Print pip constraints that pin every dependency of difffn to its lower bound.

``make test-oldest`` installs difffn with its test extras under these constraints, so the suite
runs on the oldest versions ``pyproject.toml`` allows: a lower bound is a version the suite has
passed on, not a guess. A requirement without a lower bound is an error (it promises every
version).

    python tools/lower_bounds.py > constraints.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def requirements(project: dict) -> list[str]:
    """The project's requirements and those of every extra (difffn's own extras left out)."""
    items = list(project.get("dependencies", ()))
    for extra in project.get("optional-dependencies", {}).values():
        items += [r for r in extra if not r.startswith(project["name"])]
    return items


def lower_bounds(project: dict) -> dict[str, str]:
    """``{name: lowest version}`` from each requirement's ``>=`` bound."""
    pins: dict[str, str] = {}
    for requirement in requirements(project):
        match = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)", requirement)
        if match is None:
            raise SystemExit(f"cannot read the requirement {requirement!r}")
        name, spec = match.group(1).lower(), match.group(3)
        low = re.search(r">=\s*([0-9][^,;\s]*)", spec)
        if low is None:
            raise SystemExit(f"{requirement!r} has no lower bound (>=): give it one")
        if name in pins and pins[name] != low.group(1):
            raise SystemExit(f"{name} has two lower bounds: {pins[name]} and {low.group(1)}")
        pins[name] = low.group(1)
    return pins


def main() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    for name, version in sorted(lower_bounds(project).items()):
        sys.stdout.write(f"{name}=={version}\n")


if __name__ == "__main__":
    main()
