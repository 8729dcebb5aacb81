"""Networks: the static graph and its editing, layouts through the graph, execution and its cache.

Graph construction and editing, initialization (`propagate`), input checks, execution (traced,
compiled and cached per input signature, or in segments), the compile cache, JAX's persistent
compilation cache (`compilation_cache`, turned on by `initialize` and `trainnet`), learn-rate and L2
factors of learnables, and the `Network` class itself.

This file is the package's internal API: the floors above import these names from here, and
nothing else from the package's modules (tests/test_architecture.py holds it).
"""

from . import _compilation_cache as compilation_cache
from ._cache import RetraceWarning as RetraceWarning
from ._cache import clear_caches as clear_caches
from ._execute import needed_layers as needed_layers
from ._factors import L2 as L2
from ._factors import LEARN_RATE as LEARN_RATE
from ._factors import _set as set_factor
from ._factors import get_l2_factor as get_l2_factor
from ._factors import get_learn_rate_factor as get_learn_rate_factor
from ._factors import leaf_factors as leaf_factors
from ._factors import set_l2_factor as set_l2_factor
from ._factors import set_learn_rate_factor as set_learn_rate_factor
from ._network import Network as Network
from ._propagate import resolve_layouts as resolve_layouts

__all__ = [
    "L2",
    "LEARN_RATE",
    "Network",
    "RetraceWarning",
    "set_factor",
    "clear_caches",
    "compilation_cache",
    "get_l2_factor",
    "get_learn_rate_factor",
    "leaf_factors",
    "needed_layers",
    "resolve_layouts",
    "set_l2_factor",
    "set_learn_rate_factor",
]
