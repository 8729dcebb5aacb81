"""ONNX import and export (``df.import_onnx``, ``df.export_onnx``).

This package only re-exports; each concern lives in one private module: ``_load`` (reading and
validating files), ``_ops*`` (the operators, by family), ``_labels`` (ONNX's NCHW and difffn's
channels-last), ``_import`` and ``_mapping`` (graphs to networks), ``_layers`` (the layers an
imported network holds), ``_export`` and ``_lower`` (networks to ONNX). The ``onnx`` package is
imported only inside the functions that need it.
"""

from ._export import export_onnx as export_onnx
from ._import import import_onnx as import_onnx

__all__ = ["export_onnx", "import_onnx"]
