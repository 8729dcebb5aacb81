"""ONNX ``Resize`` on 2-D images, in the cases where ``df.layers.Resize2D`` computes it exactly.

``Resize2D`` (MATLAB's ``resize2dLayer``) interpolates with ONNX's formulas for nearest and
linear modes, the ``half_pixel`` and ``asymmetric`` coordinate modes, and the ``floor`` and
``round_prefer_ceil`` nearest modes (``floor(x + 0.5)``); ``resize_options`` turns a node's
attributes into its options, or says why it cannot. The operator runs through the layer, so
the ``Resize2D`` the importer maps a node to and this operator compute the same thing. Other
modes (cubic, ``round_prefer_floor``, ``align_corners``, crops, antialiasing) are not
implemented: the node is a ``df.ONNXImportError`` (or a placeholder).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..layers import Resize2D
from . import _labels
from ._ops import Unsupported, op

_MODES = {"nearest": "nearest", "linear": "bilinear"}
_COORDINATES = {"half_pixel": "half-pixel", "asymmetric": "asymmetric"}
_ROUNDING = {"floor": "floor", "round_prefer_ceil": "round"}


def resize_options(a, in_shape, scales, sizes) -> dict:
    """``Resize2D`` keyword arguments for a ``Resize`` node on an NCHW tensor of ``in_shape``
    (``scales`` and ``sizes`` are its constant inputs or None); raises ``Unsupported``."""
    if a.opset < 11:
        raise Unsupported("Resize before opset 11 (no coordinate_transformation_mode)")
    if in_shape is None or len(in_shape) != 4:
        raise Unsupported("Resize of a tensor that is not a 2-D image (N, C, H, W)")
    mode = a.get("mode", "nearest")
    if mode not in _MODES:
        raise Unsupported(f"Resize mode={mode!r} (nearest and linear only)")
    coordinates = a.get("coordinate_transformation_mode", "half_pixel")
    rounding = a.get("nearest_mode", "round_prefer_floor")
    extras = {
        "exclude_outside": a.get("exclude_outside", 0),
        "antialias": a.get("antialias", 0),
        "axes": a.get("axes") is not None,
        "keep_aspect_ratio_policy": a.get("keep_aspect_ratio_policy", "stretch") != "stretch",
    }
    bad = [name for name, value in extras.items() if value]
    if bad:
        raise Unsupported(f"Resize with {bad[0]}")
    if coordinates == "pytorch_half_pixel":
        coordinates = "half_pixel"  # the same unless an output axis has size 1 (checked below)
        one_pixel = True
    else:
        one_pixel = False
    if coordinates not in _COORDINATES:
        raise Unsupported(f"Resize coordinate_transformation_mode={coordinates!r}")
    options: dict[str, Any] = {
        "method": _MODES[mode],
        "geometric_transform_mode": _COORDINATES[coordinates],
    }
    if mode == "nearest":
        if rounding not in _ROUNDING:
            raise Unsupported(f"Resize nearest_mode={rounding!r} (floor, round_prefer_ceil)")
        options["nearest_rounding_mode"] = _ROUNDING[rounding]
    if sizes is not None and np.size(sizes):
        sizes = [int(n) for n in np.asarray(sizes).reshape(-1)]
        # sizes[0] is read as the batch size (the file's, or a stand-in at import)
        if len(sizes) != 4 or sizes[1] != in_shape[1]:
            raise Unsupported(f"Resize sizes={sizes} that change the channels")
        options["output_size"] = (sizes[2], sizes[3])
        out = sizes[2:]
    elif scales is not None and np.size(scales):
        scales = [float(s) for s in np.asarray(scales).reshape(-1)]
        if len(scales) != 4 or scales[:2] != [1.0, 1.0] or min(scales[2:]) <= 0:
            raise Unsupported(f"Resize scales={scales} that change the batch or channels")
        options["scale"] = (scales[2], scales[3])
        out = [int(np.floor(n * s)) for n, s in zip(in_shape[2:], scales[2:])]
    else:
        raise Unsupported("Resize without constant scales or sizes")
    if one_pixel and min(out) <= 1:
        raise Unsupported("Resize pytorch_half_pixel to an axis of size 1")
    if min(out) < 1:
        raise Unsupported(f"Resize to the empty size {out}")
    return options


def _check(a, node):
    dtype = node.input_dtypes[0]
    if dtype is not None and not np.issubdtype(dtype, np.floating):
        raise Unsupported(f"Resize is implemented for floating-point images; got {dtype}")


@op("Resize", static=(1, 2, 3), check=_check, labels=_labels.keep)
def resize(a, x, roi=None, scales=None, sizes=None):
    layer = Resize2D(**resize_options(a, x.shape, scales, sizes))
    y = layer.predict(jnp.transpose(x, (0, 2, 3, 1)))  # NCHW -> NHWC, Resize2D's plain input
    return jnp.transpose(y, (0, 3, 1, 2))
