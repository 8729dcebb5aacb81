"""Load an example script as a module, so benchmarks measure the very code users read."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(stem: str):
    """``load("01_srelu_function")`` returns that script's module (not run as __main__)."""
    name = f"difffn_example_{stem}"
    if str(EXAMPLES) not in sys.path:  # as when run as a script: the examples' shared modules
        sys.path.append(str(EXAMPLES))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
