"""difffn with the rest of the JAX stack: difffn networks inside flax.nnx and equinox models.

The other direction, an nnx or equinox module inside a difffn network, is a layer:
``df.layers.FromNNX`` and ``df.layers.FromEquinox``. This module only re-exports; the nnx names
load ``flax.nnx`` on first use (PEP 562), so ``import difffn`` does not pay for it.
"""

from typing import TYPE_CHECKING, Any

from ._mask import learnable_mask as learnable_mask

if TYPE_CHECKING:  # for type checkers and the API reference; at run time, __getattr__ below
    from ._nnx import NNXNetwork as NNXNetwork
    from ._nnx import to_nnx as to_nnx

_NNX_NAMES = ("NNXNetwork", "to_nnx")

__all__ = ["NNXNetwork", "learnable_mask", "to_nnx"]


def __getattr__(name: str) -> Any:
    if name in _NNX_NAMES:
        from . import _nnx

        return getattr(_nnx, name)
    raise AttributeError(f"module 'difffn.interop' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
