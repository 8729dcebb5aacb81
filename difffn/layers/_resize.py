"""``Resize2D``: MATLAB's ``resize2dLayer`` (nearest or bilinear, by scale, size or reference).

Written with per-axis interpolation matrices rather than ``jax.image.resize`` because MATLAB's
options (the asymmetric coordinate mode, the floor rounding of nearest neighbours, a given scale
that maps coordinates by itself) are not all ``jax.image.resize``'s; where the two agree
(half-pixel, bilinear or round, scale = output / input) the tests compare them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._core import Data, LayerError, Output
from .._layer import Layer
from ._checks import bad_argument, choice, data_and_format, relabel, spatial_2d_format, who


def _matrix(out: int, size: int, scale: float, layer) -> np.ndarray:
    """The ``(out, size)`` interpolation matrix of one axis (sizes are static: built in numpy)."""
    dst = np.arange(out, dtype=np.float64)
    if layer.geometric_transform_mode == "half-pixel":
        src = (dst + 0.5) / scale - 0.5
    else:
        src = dst / scale
    weights = np.zeros((out, size))
    rows = np.arange(out)
    if layer.method == "nearest":
        index = np.floor(src) if layer.nearest_rounding_mode == "floor" else np.floor(src + 0.5)
        weights[rows, np.clip(index, 0, size - 1).astype(int)] = 1.0
        return weights
    src = np.clip(src, 0, size - 1)
    low = np.floor(src).astype(int)
    high = np.minimum(low + 1, size - 1)
    frac = src - low
    np.add.at(weights, (rows, low), 1 - frac)
    np.add.at(weights, (rows, high), frac)
    return weights


def _resize_axis(data, axis: int, out: int, scale: float, layer):
    """Resize one axis with a matrix product (its gradient is one too; gathers scatter)."""
    matrix = jnp.asarray(_matrix(out, data.shape[axis], scale, layer), data.dtype)
    letters = "abcdefghijklmnopqrstuvwxyz"[: data.ndim]
    target = letters.replace(letters[axis], "Z")
    return jnp.einsum(f"Z{letters[axis]},{letters}->{target}", matrix, data)


class Resize2D(Layer):
    """Resize 2-D images by interpolation (MATLAB's ``resize2dLayer``).

    Give exactly one of ``scale``, ``output_size`` or ``enable_reference_input=True`` (then the
    layer has two inputs, ``"in"`` and ``"ref"``, and the output takes the spatial size of
    ``"ref"``). Input and output: 2-D images with one ``B``, two ``S`` and one ``C`` axis in any
    order; the format is kept. A plain input is NHWC.

    Output coordinates map back to input coordinates as ``(dst + 0.5) / scale - 0.5``
    (``"half-pixel"``, the default) or ``dst / scale`` (``"asymmetric"``), with ``scale =
    output / input`` per axis (the given ``scale`` when there is one), clamped to the image.

    Args:
      scale: a positive number or ``(sh, sw)``: the output has ``floor(input * scale)`` pixels.
      output_size: ``(h, w)``; one of them may be ``None`` to keep the aspect ratio.
      enable_reference_input: take the output size from a second input (default False).
      method: ``"nearest"`` (default) or ``"bilinear"``.
      geometric_transform_mode: ``"half-pixel"`` (default) or ``"asymmetric"``.
      nearest_rounding_mode: ``"round"`` (default: halves round up) or ``"floor"``.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> x = df.dlarray(jnp.arange(4.0).reshape(1, 2, 2, 1), "BSSC")
      >>> df.layers.Resize2D(scale=2)(x).data[0, :, :, 0]
      Array([[0., 0., 1., 1.],
             [0., 0., 1., 1.],
             [2., 2., 3., 3.],
             [2., 2., 3., 3.]], dtype=float32)
      >>> df.layers.Resize2D(output_size=(3, 3), method="bilinear")(x).data[0, :, :, 0]
      Array([[0. , 0.5, 1. ],
             [1. , 1.5, 2. ],
             [2. , 2.5, 3. ]], dtype=float32)
    """

    formattable = True

    _: dataclasses.KW_ONLY
    scale: Any = None
    output_size: Any = None
    enable_reference_input: bool = False
    method: str = "nearest"
    geometric_transform_mode: str = "half-pixel"
    nearest_rounding_mode: str = "round"

    def __post_init__(self) -> None:
        given = [
            n
            for n, v in (("scale", self.scale), ("output_size", self.output_size))
            if v is not None
        ]
        if self.enable_reference_input:
            given.append("enable_reference_input")
        if len(given) != 1:
            raise LayerError(
                f"{who(self)}: give exactly one of scale, output_size or "
                f"enable_reference_input=True; got {given or 'none'}. Fix: e.g. "
                "Resize2D(scale=2) or Resize2D(output_size=(32, 32))."
            )
        if self.scale is not None:
            self.scale = self._scale(self.scale)
        if self.output_size is not None:
            self.output_size = self._output_size(self.output_size)
        if not isinstance(self.enable_reference_input, bool):
            raise bad_argument(
                self,
                "enable_reference_input",
                "True or False",
                self.enable_reference_input,
                "enable_reference_input=True adds the input 'ref' whose size the output takes.",
            )
        # MATLAB's ports: "in", plus "ref" with a reference input.
        self.num_inputs: int
        self.input_names: tuple[str, ...]
        if self.enable_reference_input:
            self.num_inputs, self.input_names = 2, ("in", "ref")
        else:
            self.num_inputs, self.input_names = 1, ("in",)
        self.method = choice(self, "method", self.method, ("nearest", "bilinear"))
        self.geometric_transform_mode = choice(
            self,
            "geometric_transform_mode",
            self.geometric_transform_mode,
            ("half-pixel", "asymmetric"),
        )
        self.nearest_rounding_mode = choice(
            self, "nearest_rounding_mode", self.nearest_rounding_mode, ("round", "floor")
        )

    def _scale(self, value):
        items = (value, value) if isinstance(value, (int, float)) else value
        positive = lambda v: (  # noqa: E731
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        )
        if isinstance(items, (tuple, list)) and len(items) == 2 and all(map(positive, items)):
            return float(items[0]), float(items[1])
        raise bad_argument(
            self, "scale", "a positive number or a pair (sh, sw)", value, "e.g. scale=2."
        )

    def _output_size(self, value):
        ok = (
            isinstance(value, (tuple, list))
            and len(value) == 2
            and all(
                v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0)
                for v in value
            )
            and value != (None, None)
            and list(value) != [None, None]
        )
        if not ok:
            raise bad_argument(
                self,
                "output_size",
                "a pair (h, w) of positive ints, one of which may be None (aspect ratio kept)",
                value,
                "e.g. output_size=(32, 32) or (32, None).",
            )
        return tuple(value)

    def _sizes(self, sizes, reference):
        """The output sizes and the coordinate scales of the two spatial axes."""
        if self.scale is not None:
            out = tuple(max(int(math.floor(n * s)), 1) for n, s in zip(sizes, self.scale))
            return out, self.scale
        if reference is not None:
            out = tuple(reference)
        else:
            h, w = self.output_size
            if h is None:
                h = max(int(math.floor(sizes[0] * w / sizes[1])), 1)
            if w is None:
                w = max(int(math.floor(sizes[1] * h / sizes[0])), 1)
            out = (h, w)
        return out, tuple(o / n for o, n in zip(out, sizes))

    def predict(self, *inputs: Data) -> Output:
        x = inputs[0]
        data, fmt = data_and_format(x)
        fmt = spatial_2d_format(self, fmt, data.shape)
        spatial = [i for i, label in enumerate(fmt) if label == "S"]
        reference = None
        if self.enable_reference_input:
            ref, ref_fmt = data_and_format(inputs[1])
            ref_fmt = spatial_2d_format(self, ref_fmt, ref.shape)
            reference = [ref.shape[i] for i, label in enumerate(ref_fmt) if label == "S"]
        sizes = [data.shape[a] for a in spatial]
        out, scales = self._sizes(sizes, reference)
        if not jnp.issubdtype(data.dtype, jnp.floating):
            data = data.astype(jnp.float32)
        for a, o, s in zip(spatial, out, scales, strict=True):
            data = _resize_axis(data, a, o, s, self)
        return relabel(x, data, fmt)
