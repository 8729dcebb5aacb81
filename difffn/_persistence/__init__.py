"""Files: the checksummed container, `df.save`/`df.load`, `jax.export` files and `df.export`.

Every difffn file is a container (`container`); networks are saved as data (`save`/`load`); compiled
functions are exported with `jax.export` (`jax_export`) and deployed as `ExportedNetwork`s.

This file is the package's internal API: the floors above import these names from here, and
nothing else from the package's modules (tests/test_architecture.py holds it).
"""

from . import _container as container
from . import _export as jax_export
from ._container import Each as Each
from ._container import Optional as Optional
from ._container import check_schema as check_schema
from ._container import msgpack_codec as msgpack_codec
from ._deploy import ExportedNetwork as ExportedNetwork
from ._deploy import export as export
from ._deploy import load_exported as load_exported
from ._serialization import check_network_structure as check_network_structure
from ._serialization import load as load
from ._serialization import network_payload as network_payload
from ._serialization import network_structure as network_structure
from ._serialization import restore_network as restore_network
from ._serialization import save as save

__all__ = [
    "Each",
    "ExportedNetwork",
    "Optional",
    "check_schema",
    "container",
    "export",
    "jax_export",
    "load",
    "load_exported",
    "msgpack_codec",
    "check_network_structure",
    "network_payload",
    "network_structure",
    "restore_network",
    "save",
]
