"""The built documentation site, read as a reader gets it (HTML), not as it is written.

The site is built once (``mkdocs build --strict``, as ``make docs``) into a temporary folder.
Then: no Sphinx role is left as raw text (``:math:``, ``:func:``, ...); the maths is MathML; no
private module (``difffn._...``) is named anywhere in a page; every link between pages, and every
``#anchor``, resolves; the gallery shows every example with its recorded output, recorded from
the script as it is now; the home page shows the main example's training-progress plot.
"""

from __future__ import annotations

import hashlib
import html.parser
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow

ROLE = re.compile(r":(math|func|class|mod|meth|data|attr|exc|obj|ref):`")
EXAMPLES = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))


class _Page(html.parser.HTMLParser):
    """The links, ids and visible text of one page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.images: list[str] = []
        self.ids: set[str] = set()
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"] or "")
        if tag == "a" and values.get("href"):
            self.links.append(values["href"] or "")
        if tag == "img" and values.get("src"):
            self.images.append(values["src"] or "")
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text.append(data)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    # offline: any attempt to fetch goes to a closed port
    env.update(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(folder)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "WARNING" not in result.stderr, result.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def pages(site) -> dict[Path, _Page]:
    parsed = {}
    for path in site.rglob("*.html"):
        page = _Page()
        page.feed(path.read_text())
        parsed[path] = page
    return parsed


def test_no_raw_roles_and_no_private_modules(site, pages):
    raw, private = [], []
    for path, page in pages.items():
        text = "".join(page.text)
        raw += [f"{path.relative_to(site)}: {m.group(0)}" for m in ROLE.finditer(text)]
        source = path.read_text()
        private += [
            f"{path.relative_to(site)}: {m.group(0)}"
            for m in re.finditer(r"difffn(\.\w+)*\._[a-z]\w*", source)
        ]
    assert not raw, f"raw Sphinx roles on the site: {raw[:20]}"
    assert not private, f"private modules named on the site: {sorted(set(private))[:20]}"


def test_maths_is_rendered(site, pages):
    losses = pages[site / "reference" / "losses" / "index.html"]
    source = (site / "reference" / "losses" / "index.html").read_text()
    assert source.count("<math") >= 3, "the loss formulas are not MathML"
    assert not re.search(r"\$[^$\s][^$]*\$", "".join(losses.text)), "a $...$ left unrendered"
    assert "arithmatex" not in source, "an arithmatex span was not converted"


def test_every_internal_link_and_anchor_resolves(site, pages):
    broken = []
    for path, page in pages.items():
        for href in page.links + page.images:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith("mailto:"):
                continue
            if not parts.path:
                target = path
            elif parts.path.startswith("/"):  # the 404 page links from the site's root
                target = site / unquote(parts.path).lstrip("/")
            else:
                target = (path.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(site)} -> {href}")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{path.relative_to(site)} -> {href} (no such anchor)")
    assert not broken, f"{len(broken)} broken links: {broken[:20]}"


def test_the_gallery_shows_every_example_with_its_output(site, pages):
    gallery = pages[site / "gallery" / "index.html"]
    text = "".join(gallery.text)
    stale = []
    for script in EXAMPLES:
        assert script.stem in gallery.ids, f"{script.name} is not in the gallery"
        recorded = ROOT / "docs" / "gallery" / script.stem
        digest = hashlib.sha256(script.read_bytes()).hexdigest()
        sha = recorded / "source.sha256"
        if not sha.exists() or sha.read_text().strip() != digest:
            stale.append(script.stem)
        assert f"$ python examples/{script.name}" in text, f"{script.name}: no recorded output"
    assert not stale, f"outputs recorded from older scripts: {stale}. Fix: python tools/gallery.py"


def test_the_home_page_shows_the_training_progress_plot(site, pages):
    images = pages[site / "index.html"].images
    plots = [src for src in images if src.endswith("elu_digits_training_progress.png")]
    assert plots and (site / plots[0]).stat().st_size > 10_000, images
