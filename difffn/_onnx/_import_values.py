"""The importer's table of tensor kinds: what ``df.import_onnx`` knows about each ONNX tensor.

Every tensor is a ``Const`` (initializers, ``Constant`` nodes and what is folded from them), a
``Deferred`` value (computed from constants and the *shapes* of runtime tensors, evaluated
while tracing) or a ``Runtime`` value (a layer's output port). The walk (``_import``), the
inputs (``_import_inputs``), the folding (``_import_fold``) and the emission of layers
(``_import_emit``) read and write one such table, ``Importer.values``; ``NodeInfo`` is the
view of one node that operator checks and mapping rules look at.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._network import Network
from ._load import Node
from ._ops import Attrs


@dataclasses.dataclass
class Runtime:
    """A tensor computed when the network runs: a layer output port.

    ``shape`` is in ONNX order with stand-in sizes for the batch (and unknown sequence
    lengths); ``order`` is set when difffn flattened an image channels-last: feature ``j`` of
    the ONNX tensor is the stored feature ``order[j]``. ``guess`` names the placeholder layer
    whose output sizes the file does not give, where ``shape`` follows from that guess.
    """

    port: tuple[str, str] | None
    labels: str
    shape: tuple[int, ...] | None
    dtype: np.dtype | None
    order: np.ndarray | None = None
    guess: str | None = None


@dataclasses.dataclass
class Const:
    value: np.ndarray


@dataclasses.dataclass
class Deferred:
    """A value computed from constants and shapes (its producing node's outputs)."""


@dataclasses.dataclass
class NodeInfo:
    """What operator checks and mappings may look at for one node."""

    node: Node
    a: Attrs
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_kinds: list[str]  # "runtime", "const", "program" or "absent"
    input_values: list  # constants' values (np.ndarray), else None
    input_shapes: list
    input_dtypes: list
    input_labels: list


@dataclasses.dataclass
class ImportResult:
    """The network, and the ONNX labels of its inputs and outputs (tests read these)."""

    network: Network
    input_labels: dict[str, str]
    output_labels: dict[str, str]
