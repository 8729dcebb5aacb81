"""The `Layer` class: fields, calling a layer, its custom backward, parameter walks and tables.

Field declarations (`learnable`, `state`), the `Layer` base with its one constructor, `InputLayer`,
`call_layer`, the custom backward of a layer, one walk over annotated parameters and the
`ParameterTable`s built on it. The built-in layers are the public catalogue `difffn.layers`.

This file is the package's internal API: the floors above import these names from here, and
nothing else from the package's modules (tests/test_architecture.py holds it).
"""

from . import _parameters as parameters
from ._fields import BASE_FIELDS as BASE_FIELDS
from ._fields import LEARNABLE as LEARNABLE
from ._fields import SHARDING as SHARDING
from ._fields import STATE as STATE
from ._fields import NetworkBase as NetworkBase
from ._fields import learnable as learnable
from ._fields import state as state
from ._input_layer import InputLayer as InputLayer
from ._layer import Layer as Layer
from ._layer_call import call_layer as call_layer
from ._layer_call import run_user as run_user
from ._learnables_grad import learnables_grad as learnables_grad
from ._parameters import leaf_kinds as leaf_kinds
from ._parameters import learnable_mask as learnable_mask
from ._parameters import walk as walk
from ._table import ParameterTable as ParameterTable

__all__ = [
    "BASE_FIELDS",
    "InputLayer",
    "LEARNABLE",
    "Layer",
    "NetworkBase",
    "ParameterTable",
    "SHARDING",
    "STATE",
    "call_layer",
    "leaf_kinds",
    "learnable",
    "learnable_mask",
    "learnables_grad",
    "parameters",
    "run_user",
    "state",
    "walk",
]
