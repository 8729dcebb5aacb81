"""mkdocs hook: the maths of the pages and docstrings as MathML, rendered by the browser.

``pymdownx.arithmatex`` (generic mode) marks ``$...$`` and ``$$...$$`` as
``<span class="arithmatex">\\(...\\)</span>`` and ``<div class="arithmatex">\\[...\\]</div>``;
this hook converts each to MathML with ``latex2mathml``, so the site needs no JavaScript and
fetches nothing (MathML is rendered by every current browser).
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert

_INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
_BLOCK = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)


def _mathml(tex: str, display: str) -> str:
    return convert(html.unescape(tex).strip(), display=display)


def on_page_content(content: str, **kwargs: object) -> str:
    content = _BLOCK.sub(lambda m: _mathml(m.group(1), "block"), content)
    return _INLINE.sub(lambda m: _mathml(m.group(1), "inline"), content)
