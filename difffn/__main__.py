"""``python -m difffn``: the ``difffn`` command line (``check``, ``demo``)."""

import sys

from ._cli import main

sys.exit(main())
