"""The documentation site: every public name has a reference entry, and the strict build passes.

The reference pages (``docs/reference/*.md``) hold mkdocstrings blocks (``::: difffn.name``)
that render each name from its docstring; ``mkdocs build --strict`` fails on a broken link, an
unknown reference or a guide missing from the nav (``mkdocs.yml``). The build runs offline:
the theme loads no web fonts, and the test points every proxy at a closed port.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import types

import pytest
from helpers import ROOT

import difffn as df

REFERENCE = ROOT / "docs" / "reference"
# The public modules whose names the reference must cover (df.ops once it exists).
MODULES = ("difffn", "difffn.layers", "difffn.losses", "difffn.metrics", "difffn.testing",
           "difffn.data", "difffn.interop", "difffn.ops")  # fmt: skip


def reference_entries() -> set[str]:
    entries = set()
    for page in REFERENCE.glob("*.md"):
        entries |= set(re.findall(r"^::: (\S+)", page.read_text(), flags=re.MULTILINE))
    return entries


def public_names(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")]
    return sorted(n for n in names if n != "annotations")


def test_every_public_name_has_a_reference_entry():
    entries = reference_entries()
    missing = []
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        for name in public_names(module):
            value = getattr(module, name)
            target = (
                value.__name__ if isinstance(value, types.ModuleType) else f"{module_name}.{name}"
            )
            if target not in entries:
                missing.append(target)
    assert not missing, (
        f"public names without an API reference entry: {missing}. Fix: add '::: <name>' to the "
        "page of docs/reference/ where it belongs."
    )


def test_every_reference_entry_names_a_public_object():
    for entry in sorted(reference_entries()):
        parts = entry.split(".")
        assert parts[0] == "difffn", entry
        obj = df
        for i, part in enumerate(parts[1:], start=2):
            assert not part.startswith("_"), f"{entry}: reference public paths only"
            if not hasattr(obj, part):  # a submodule not imported by difffn itself (testing)
                importlib.import_module(".".join(parts[:i]))
            obj = getattr(obj, part)


def build(config, site, *, cwd):
    env = dict(os.environ)
    closed = "http://127.0.0.1:9"  # nothing listens: a download attempt fails the build
    env.update(HTTP_PROXY=closed, HTTPS_PROXY=closed, http_proxy=closed, https_proxy=closed,
               NO_MKDOCS_2_WARNING="1")  # fmt: skip
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )


@pytest.mark.slow
def test_the_site_builds_strict_and_offline(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("material")
    result = build(ROOT / "mkdocs.yml", tmp_path / "site", cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    training = (tmp_path / "site" / "reference" / "training" / "index.html").read_text()
    assert 'id="difffn.trainnet"' in training and "MATLAB" in training  # from the docstring
    html = "".join(p.read_text() for p in (tmp_path / "site").rglob("*.html"))
    assert "fonts.googleapis" not in html


@pytest.mark.slow
def test_the_strict_build_fails_on_broken_links_references_and_pages(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("material")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    config = (ROOT / "mkdocs.yml").read_text().replace("paths: [.]", f"paths: [{ROOT}]")
    (tmp_path / "mkdocs.yml").write_text(config)
    with open(tmp_path / "docs" / "networks.md", "a") as page:
        page.write("\nSee [nowhere](missing.md) and [df.nope][difffn.nope].\n")
    (tmp_path / "docs" / "orphan.md").write_text("# A guide nobody put in the nav\n")
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site", cwd=tmp_path)
    assert result.returncode != 0
    assert "contains a link 'missing.md'" in result.stderr
    assert "Could not find cross-reference target 'difffn.nope'" in result.stderr
    assert "orphan.md" in result.stderr
