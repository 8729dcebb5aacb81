"""Where training runs: ``execution_environment`` as a device placement (``jax.sharding``).

``"auto"``: JAX's default device. ``"cpu"`` / ``"gpu"``: the first device of that platform.
``"multi-device"``: a 1-D mesh over ``jax.devices()`` with axis ``"batch"``; parameters and
optimizer state are replicated, each mini-batch is split along its batch axis (data-parallel
SPMD: XLA inserts the gradient all-reduce, and batch statistics are computed over the whole
mini-batch, so the results equal one device's up to float rounding). The mini-batch size must be
a multiple of the device count; a validation or prediction batch that is not runs replicated.
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ._batches import as_device_array, batch_axis, count
from ._errors import OptionsError
from ._format import FormattedArray, dlarray

AXIS = "batch"


class Placement:
    """Devices for one training run, and how data and parameters are put on them."""

    def __init__(self, environment: str):
        self.environment = environment
        self.mesh = None
        if environment == "auto":
            self.devices = (jax.devices()[0],)
        elif environment in ("cpu", "gpu"):
            try:
                devices = jax.devices(environment)
            except RuntimeError:
                devices = []
            if not devices:
                raise OptionsError(
                    f"execution_environment={environment!r} but JAX sees no {environment.upper()}"
                    f" (devices: {[str(d) for d in jax.devices()]}). Fix: use 'auto', or "
                    "install a JAX build for that platform."
                )
            self.devices = (devices[0],)
        elif environment == "multi-device":
            self.devices = tuple(jax.devices())
            self.mesh = jax.make_mesh(
                (len(self.devices),),
                (AXIS,),
                axis_types=(jax.sharding.AxisType.Auto,),
                devices=self.devices,
            )
        else:
            raise OptionsError(f"unknown execution_environment {environment!r}")

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def replicated(self):
        if self.mesh is not None:
            return NamedSharding(self.mesh, P())
        return jax.sharding.SingleDeviceSharding(self.devices[0])

    def key(self):
        """A hashable identity (for caches of compiled steps)."""
        return (self.environment, self.devices)

    def put(self, tree):
        """Place a pytree (parameters, state, whole data sets) replicated."""
        return jax.device_put(tree, self.replicated)

    def check_batch(self, size: int, *, what: str = "mini_batch_size") -> None:
        if self.mesh is not None and size % self.count:
            lower = size - size % self.count
            suggestion = f"{lower} or {lower + self.count}" if lower else str(self.count)
            raise OptionsError(
                f"execution_environment='multi-device' splits each mini-batch over the "
                f"{self.count} devices, so {what} must be a multiple of {self.count}; got "
                f"{size}. Fix: {what}={suggestion}."
            )

    def put_batch(self, xs, ts, formats):
        """A batch of inputs and targets on the devices: split along the batch axis over the
        devices when it divides evenly, else replicated (``formats``: the inputs' formats)."""
        xs = tuple(as_device_array(x) for x in xs)
        ts = tuple(as_device_array(t) for t in ts)
        if self.mesh is None or count(ts[0], batch_axis(ts[0])) % self.count:
            return self.put(xs), self.put(ts)
        xs = tuple(
            jax.device_put(x, self.batch_sharding(x, fmt))
            for x, fmt in zip(xs, formats, strict=True)
        )
        ts = tuple(jax.device_put(t, self.batch_sharding(t, None)) for t in ts)
        return xs, ts

    def batch_sharding(self, x, fmt: str | None):
        """A sharding that splits ``x`` along its batch axis over the mesh."""
        spec = P(*([None] * batch_axis(x, fmt)), AXIS)
        return NamedSharding(self.mesh, spec)

    def constrain(self, x, axis: int):
        """Inside jit: split ``x`` over the devices along ``axis`` (if it divides evenly)."""
        if self.mesh is None:
            return x
        data = x.data if isinstance(x, FormattedArray) else x
        if data.shape[axis] % self.count:
            return x
        spec = P(*([None] * axis), AXIS)
        data = jax.lax.with_sharding_constraint(data, NamedSharding(self.mesh, spec))
        return dlarray(data, x.format) if isinstance(x, FormattedArray) else data
