"""Placement on devices: the mesh, learnable layouts (replicated, fsdp) and `jax.distributed`.

Where training and prediction run (`ENVIRONMENTS`), the `("data", "model")` mesh of one process or
many, how batches and learnables are placed on it, joining processes with `jax.distributed`,
and stopping them in bounded time when one is lost.

This file is the package's internal API: the floors above import these names from here, and
nothing else from the package's modules (tests/test_architecture.py holds it).
"""

from ._distributed import agree as agree
from ._distributed import all_agree as all_agree
from ._distributed import broadcast_int as broadcast_int
from ._distributed import gather_rows as gather_rows
from ._partition import learnable_layout as learnable_layout
from ._partition import optimizer_shardings as optimizer_shardings
from ._sharding import ENVIRONMENTS as ENVIRONMENTS
from ._sharding import MESH_ENVIRONMENTS as MESH_ENVIRONMENTS
from ._sharding import HostArray as HostArray
from ._sharding import Placement as Placement
from ._watchdog import EXIT_STATUS as EXIT_STATUS
from ._watchdog import watching as watching

__all__ = [
    "ENVIRONMENTS",
    "EXIT_STATUS",
    "HostArray",
    "MESH_ENVIRONMENTS",
    "Placement",
    "agree",
    "all_agree",
    "broadcast_int",
    "gather_rows",
    "learnable_layout",
    "optimizer_shardings",
    "watching",
]
