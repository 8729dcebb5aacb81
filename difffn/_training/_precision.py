"""The compute precision of training (``TrainingOptions(precision=...)``): a dtype policy and,
for float16, dynamic loss scaling.

The policy is the usual mixed-precision one (NVIDIA's and ``jmp``'s): the learnables stay
float32 (the masters the optimizer updates, with its state in float32 too) and are cast to the
compute dtype inside the step, as are the floating inputs; the network's state (BatchNorm's
running statistics) stays float32; the outputs are cast back to float32 before the loss and
the metrics. Gradients reach the float32 masters through the casts, so they arrive in float32.

float16 has a narrow range: small gradients underflow to zero. Dynamic loss scaling multiplies
the loss by a large factor before differentiating and divides the gradients by it; when a
gradient overflows (inf or NaN), the step is skipped and the factor halves, and after a run of
finite steps it doubles. This is flax's `flax.training.dynamic_scale.DynamicScale`
(factor 2, growth interval 2000 steps, initial scale 2**16), carried through the compiled step
as part of the training state, with a count of the skipped steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._core import to_device

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class Scaling(NamedTuple):
    """Loss-scaling state carried by the step.

    Attributes:
      dynamic: flax's ``DynamicScale`` (scale and finite-step count) for float16, else None.
      skipped: steps skipped so far because their gradients were not finite (int32).
    """

    dynamic: Any
    skipped: Any


def _floating(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _cast(tree, dtype):
    # FormattedArray is a pytree whose leaf is its data: the format is kept.
    return jax.tree.map(lambda x: x.astype(dtype) if _floating(x) and x.dtype != dtype else x, tree)


@dataclasses.dataclass(frozen=True)
class Policy:
    """The precision of one run.

    Examples:
      >>> import jax.numpy as jnp
      >>> from difffn._training._precision import Policy
      >>> policy = Policy("bfloat16")
      >>> policy.compute([jnp.ones(2), jnp.arange(2)])
      [Array([1, 1], dtype=bfloat16), Array([0, 1], dtype=int32)]
      >>> policy.output(jnp.ones(2, jnp.bfloat16)).dtype
      dtype('float32')
    """

    name: str = "float32"

    @property
    def dtype(self):
        return DTYPES[self.name]

    @property
    def scaled(self) -> bool:
        return self.name == "float16"

    def compute(self, tree):
        """Floating leaves (arrays and ``FormattedArray`` data) in the compute dtype."""
        return tree if self.name == "float32" else _cast(tree, self.dtype)

    def output(self, tree):
        """Floating leaves back in float32 (for the loss and the metrics)."""
        return tree if self.name == "float32" else _cast(tree, jnp.float32)

    def initial_scaling(self) -> Scaling:
        dynamic = None
        if self.scaled:
            # imported here: flax's package import costs about a second (it loads flax.linen)
            from flax.training.dynamic_scale import DynamicScale

            # flax annotates fin_steps as an int; its own update makes it an array, as here
            dynamic = DynamicScale(
                fin_steps=to_device(np.int32(0)),
                scale=to_device(np.float32(2**16)),
            )
        return Scaling(dynamic, to_device(np.int32(0)))

    def value_and_grad(self, objective, learnables, scaling: Scaling):
        """``objective(learnables) -> (loss, aux)`` differentiated, with loss scaling for float16.

        Returns ``(loss, aux, grads, finite, scaling)``; ``finite`` (a traced bool) is False
        when the step must be skipped because a gradient overflowed.
        """
        if scaling.dynamic is None:
            (value, aux), grads = jax.value_and_grad(objective, has_aux=True)(learnables)
            return value, aux, grads, jnp.bool_(True), scaling
        dynamic, finite, (value, aux), grads = scaling.dynamic.value_and_grad(
            objective, has_aux=True
        )(learnables)
        return value, aux, grads, finite, scaling._replace(dynamic=dynamic)

    @staticmethod
    def count_skipped(scaling: Scaling, skipped) -> Scaling:
        return scaling._replace(skipped=scaling.skipped + skipped.astype(jnp.int32))


def scaling_payload(scaling: Scaling) -> dict | None:
    """The loss-scaling state as plain numbers (for checkpoints)."""
    if scaling is None:
        return None
    dynamic = scaling.dynamic
    return {
        "scale": None if dynamic is None else float(jax.device_get(dynamic.scale)),
        "fin_steps": None if dynamic is None else int(jax.device_get(dynamic.fin_steps)),
        "skipped": int(jax.device_get(scaling.skipped)),
    }


def restore_scaling(policy: Policy, saved: dict | None) -> Scaling:
    """The state of `scaling_payload` (a fresh one for a checkpoint without it)."""
    scaling = policy.initial_scaling()
    if not saved:
        return scaling
    dynamic = scaling.dynamic
    if dynamic is not None and saved.get("scale") is not None:
        dynamic = dynamic.replace(
            scale=to_device(np.float32(saved["scale"])),
            fin_steps=to_device(np.int32(saved["fin_steps"])),
        )
    return Scaling(dynamic, to_device(np.int32(saved["skipped"])))
