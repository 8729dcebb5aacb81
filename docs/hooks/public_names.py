"""mkdocs hook: the site names difffn's objects by their public names only.

mkdocs-autorefs gives each cross-reference a tooltip with the object's canonical path, which is
where it is defined (``FormatError (difffn._core._errors.FormatError)``); a reader imports it as
``df.FormatError``. This drops such tooltips, so no private module appears on the site
(``tests/test_docs_site.py`` checks it).
"""

from __future__ import annotations

import re

_PRIVATE_TITLE = re.compile(r'\s+title="[^"]*\bdifffn(?:\.\w+)*\._\w+[^"]*"')


def on_post_page(output: str, **kwargs: object) -> str:
    return _PRIVATE_TITLE.sub("", output)
