"""Where training runs: ``execution_environment`` as devices, a mesh, and data put on them.

``"auto"``: JAX's default device. ``"cpu"`` / ``"gpu"``: the first device of that platform.
``"multi-device"``: a mesh over this process's devices. ``"multi-host"``: a mesh over every
process's devices (``jax.devices()`` after ``jax.distributed.initialize``); every process runs
the same training and feeds its share of each batch (``_distributed``).

The mesh has two axes, ``("data", "model")`` (``TrainingOptions(mesh_shape=...)``; default:
every device on ``"data"``). Each batch is split along its batch axis over ``"data"`` and
replicated over ``"model"`` (data-parallel SPMD: XLA inserts the gradient reduction, and batch
statistics are computed over the whole batch, so the results equal one device's up to float
rounding). Learnables are replicated or split by ``_partition``.

A training mini-batch that the ``"data"`` size does not divide is padded to the next multiple
with copies of its first observation, cut from the outputs before the loss and the metrics, so
they carry no weight: the loss and gradients are the unpadded batch's. MATLAB's multi-GPU
training likewise keeps every observation of a mini-batch (it splits it unevenly over the
workers) rather than dropping some. A network whose state learns from the whole batch
(BatchNorm's running statistics: a layer with state that is not reset between mini-batches)
would see the copies, so its uneven batches run replicated instead (every device computes the
whole batch). When each process feeds its own share (a multi-process iterable), every process
pads its share to the same size, so the padding sits at the end of each process's block of the
global batch and the step cuts it block by block (``_batches.Keep``); replicated, the shares
are gathered into every process. A validation batch that does not divide runs replicated;
prediction pads (``_predict``).

Data reach the devices as global ``jax.Array``s: from arrays that every process holds whole
(`Placement.host_batch`: each process copies only the rows of its own devices, through
``jax.make_array_from_callback``), or from each process's own batch
(`Placement.local_batch`: ``jax.make_array_from_process_local_data``; the global batch is
the processes' batches in process order).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .._core import (
    FormattedArray,
    OptionsError,
    as_device_array,
    batch_axis,
    count,
    dlarray,
    has_method,
    pad_with_first,
    stripdims,
)
from .._layer import STATE, walk
from . import _distributed

# Where training and prediction run (the ExecutionEnvironment option); the last two use a mesh.
ENVIRONMENTS = ("auto", "cpu", "gpu", "multi-device", "multi-host")
MESH_ENVIRONMENTS = ("multi-device", "multi-host")

AXES = ("data", "model")
DATA = "data"


class HostArray(NamedTuple):
    """A numpy copy of a data array on the host, with its format (None: a plain array)."""

    data: np.ndarray
    format: str | None

    @classmethod
    def of(cls, x) -> HostArray:
        fmt = x.format if isinstance(x, FormattedArray) else None
        return cls(np.asarray(stripdims(x)), fmt)


class Placement:
    """Devices for one run (training or prediction), and how data and parameters go on them.

    Args:
      environment: ``execution_environment``.
      mesh_shape: ``((axis, size), ...)`` as ``TrainingOptions`` stores it (size -1: the
        devices left), or None.
      who: the caller, for messages.
    """

    uneven = "pad"  # how a batch the "data" size does not divide is split: "pad" or "replicate"

    def __init__(self, environment: str, *, mesh_shape=None, who: str = "trainnet"):
        self.environment = environment
        self.mesh = None
        self.multi_host = environment == "multi-host"
        if environment == "auto":
            self.devices = (jax.local_devices()[0],)
        elif environment in ("cpu", "gpu"):
            try:
                devices = jax.local_devices(backend=environment)
            except RuntimeError:
                devices = []
            if not devices:
                raise OptionsError(
                    f"execution_environment={environment!r} but JAX sees no {environment.upper()}"
                    f" (devices: {[str(d) for d in jax.local_devices()]}). Fix: use 'auto', or "
                    "install a JAX build for that platform."
                )
            self.devices = (devices[0],)
        elif environment in ("multi-device", "multi-host"):
            if self.multi_host:
                _distributed.require_initialized(who)
            self.devices = tuple(jax.devices() if self.multi_host else jax.local_devices())
            shape = _mesh_sizes(mesh_shape, len(self.devices), environment)
            self.mesh = jax.make_mesh(
                shape,
                AXES,
                axis_types=(jax.sharding.AxisType.Auto,) * len(AXES),
                devices=self.devices,
            )
        else:
            raise OptionsError(f"unknown execution_environment {environment!r}")

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def data_size(self) -> int:
        """How many parts a batch is split into (the mesh's ``"data"`` size; 1 without a mesh)."""
        return 1 if self.mesh is None else self.mesh.shape[DATA]

    @property
    def processes(self) -> int:
        return jax.process_count() if self.multi_host else 1

    @property
    def is_primary(self) -> bool:
        """Whether this process prints, plots and calls ``output_fcn``."""
        return not self.multi_host or _distributed.is_primary()

    @property
    def replicated(self):
        if self.mesh is not None:
            return NamedSharding(self.mesh, P())
        return jax.sharding.SingleDeviceSharding(self.devices[0])

    def describe(self) -> str:
        """The devices in words, for messages (``"4 devices, mesh data=2 x model=2"``)."""
        if self.mesh is None:
            return str(self.devices[0])
        shape = " x ".join(f"{a}={n}" for a, n in self.mesh.shape.items())
        where = f" in {self.processes} processes" if self.multi_host else ""
        return f"{self.count} devices{where}, mesh {shape}"

    def key(self):
        """A hashable identity (for caches of compiled steps)."""
        shape = None if self.mesh is None else self.mesh.shape_tuple
        return (self.environment, self.devices, shape)

    def sharding(self, spec: P):
        """A ``NamedSharding`` of ``spec`` over the mesh (replicated without a mesh)."""
        return self.replicated if self.mesh is None else NamedSharding(self.mesh, spec)

    def put(self, tree, shardings=None, *, copy: bool = False):
        """Place a pytree (parameters, state, whole data sets) replicated, or with ``shardings``
        (a matching pytree, or one sharding for every leaf); ``copy``: never alias the given
        buffers (the step donates what it is given).

        Every process passes the same values; arrays on one of this process's devices are
        copied to the mesh through the host (one process cannot place its own device buffers
        onto another process's devices), PRNG keys by their key data.
        """
        shardings = self.replicated if shardings is None else shardings
        if not self.multi_host:
            return jax.device_put(tree, shardings, may_alias=False if copy else None)
        if not isinstance(shardings, jax.sharding.Sharding):
            return jax.tree.map(lambda x, s: self._put_global(x, s, copy), tree, shardings)
        return jax.tree.map(lambda x: self._put_global(x, shardings, copy), tree)

    def _put_global(self, x, sharding, copy):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.sharding == sharding and not copy:
                return x
            return jax.device_put(x, sharding, may_alias=False if copy else None)
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = self._put_global(jax.random.key_data(x), sharding, copy)
            impl = jax.random.key_impl(x)
            return jax.jit(
                lambda d: jax.random.wrap_key_data(d, impl=impl), out_shardings=sharding
            )(data)
        return jax.device_put(np.asarray(x), sharding)

    def plan_uneven(self, net, size: int, shares: int = 1) -> str | None:
        """Decide how mini-batches of ``size`` observations that the ``"data"`` size does not
        divide are split (`uneven`), and say so (None when it divides).

        Args:
          net: the network trained (its layers decide between padding and replication).
          size: the global mini-batch size.
          shares: how many equal shares it is fed in (one per process of a multi-process
            iterable, each padded on its own; 1 otherwise).
        """
        if self.divides(size):
            return None
        parts = self.data_size
        learners = sorted(
            {
                p.path.split("/")[0]
                for p in walk(net)
                if p.kind == STATE and not has_method(p.layer, "reset_state")
            }
        )
        if learners:
            self.uneven = "replicate"
            gathered = ", gathered from every process's share" if shares > 1 else ""
            return (
                f"Mini-batches of {size} observations do not split over the {parts} parts of "
                f"the mesh's 'data' axis, and the state of {', '.join(learners)} learns from the "
                f"whole batch: they run replicated (each device computes the whole batch"
                f"{gathered}; the results are the same). A mini-batch size that is a multiple "
                f"of {parts} splits."
            )
        self.uneven = "pad"
        padded = self.padded(size, shares)
        each = f" ({padded // shares} per process)" if shares > 1 else ""
        return (
            f"Mini-batches of {size} observations are padded to {padded}{each} to split over "
            f"the {parts} parts of the mesh's 'data' axis; the {padded - size} padded "
            "observation(s) carry no weight in the loss, the metrics or the gradients."
        )

    def padded(self, size: int, shares: int = 1) -> int:
        """``size`` rounded up to split over the ``"data"`` size when uneven batches are padded;
        ``size`` itself when it divides or they run replicated.

        A batch fed in ``shares`` equal shares (one per process) is padded share by share, each
        to the same size, so that the shares together split: e.g. 2 shares of 3 over 4 parts
        become 2 shares of 4.
        """
        if self.divides(size) or self.uneven != "pad":
            return size
        step = self.data_size // math.gcd(shares, self.data_size)  # rows per share that split
        return -(-(size // shares) // step) * step * shares

    def divides(self, size: int) -> bool:
        return self.mesh is None or size % self.data_size == 0

    # -- batches ---------------------------------------------------------------------------------

    def put_batch(self, xs, ts, formats):
        """A batch of inputs and targets that every process holds whole, on the devices: split
        along the batch axis when it divides evenly, else replicated (``formats``: the inputs')."""
        n = count(ts[0], batch_axis(ts[0]))
        if not self.multi_host:
            xs = tuple(as_device_array(x) for x in xs)
            ts = tuple(as_device_array(t) for t in ts)
            if not self.divides(n):
                return self.put(xs), self.put(ts)
            xs = tuple(
                jax.device_put(x, self.batch_sharding(x, fmt))
                for x, fmt in zip(xs, formats, strict=True)
            )
            ts = tuple(jax.device_put(t, self.batch_sharding(t, None)) for t in ts)
            return xs, ts
        rows = np.arange(n)
        split = self.divides(n)
        xs = tuple(
            self.host_batch(HostArray.of(x), batch_axis(x, fmt), rows, split=split)
            for x, fmt in zip(xs, formats, strict=True)
        )
        ts = tuple(self.host_batch(HostArray.of(t), batch_axis(t), rows, split=split) for t in ts)
        return xs, ts

    def put_inputs(self, xs, axes):
        """Inputs that every process holds whole, split over the mesh along their batch axes
        (which the ``"data"`` size divides), for prediction."""
        if self.mesh is None:
            return [self.put(as_device_array(x)) for x in xs]
        out = []
        for x, axis in zip(xs, axes, strict=True):
            rows = np.arange(count(x, axis))
            if self.multi_host:
                out.append(self.host_batch(HostArray.of(x), axis, rows))
            else:
                sharding = self.sharding(P(*([None] * axis), DATA))
                out.append(jax.device_put(as_device_array(x), sharding))
        return out

    def host_batch(self, x: HostArray, axis: int, rows: np.ndarray, *, split: bool = True):
        """Observations ``rows`` of ``x`` (an array every process holds whole) as one global
        array, split over the mesh along ``axis`` (or replicated, ``split=False``); each process
        copies only the rows its own devices hold."""
        host = x.data
        shape = list(host.shape)
        shape[axis] = len(rows)
        spec = P(*([None] * axis), DATA) if split else P()
        sharding = self.sharding(spec)

        def rows_of(index):
            wanted = rows[index[axis]] if len(index) > axis else rows
            part = np.take(host, wanted, axis=axis)
            rest = tuple(slice(None) if a == axis else s for a, s in enumerate(index))
            return part[rest]

        array = jax.make_array_from_callback(tuple(shape), sharding, rows_of)
        return array if x.format is None else dlarray(array, x.format)

    def local_batch(self, xs, ts, formats, rows: int | None = None):
        """This process's own batch (every process passes one of the same shape) as part of one
        global batch: the processes' batches in process order, split over the mesh.

        ``rows``: pad every share (inputs and targets) to that many observations with copies
        of its first (`padded`; the step cuts them, ``_batches.Keep``).
        """
        xs = tuple(
            self._local(x, batch_axis(x, fmt), rows) for x, fmt in zip(xs, formats, strict=True)
        )
        ts = tuple(self._local(t, batch_axis(t), rows) for t in ts)
        return xs, ts

    def _local(self, x, axis: int, rows: int | None):
        host = np.asarray(stripdims(x))
        if rows is not None:
            host = pad_with_first(host, rows, axis)
        shape = list(host.shape)
        shape[axis] *= self.processes
        sharding = self.sharding(P(*([None] * axis), DATA))
        array = jax.make_array_from_process_local_data(sharding, host, tuple(shape))
        return dlarray(array, x.format) if isinstance(x, FormattedArray) else array

    def batch_sharding(self, x, fmt: str | None):
        """A sharding that splits ``x`` along its batch axis over the mesh."""
        return self.sharding(P(*([None] * batch_axis(x, fmt)), DATA))

    def constrain(self, x, axis: int):
        """Inside jit: split ``x`` over the mesh along ``axis`` (if it divides evenly)."""
        if self.mesh is None:
            return x
        data = x.data if isinstance(x, FormattedArray) else x
        if data.shape[axis] % self.data_size:
            return x
        spec = P(*([None] * axis), DATA)
        data = jax.lax.with_sharding_constraint(data, NamedSharding(self.mesh, spec))
        return dlarray(data, x.format) if isinstance(x, FormattedArray) else data


def _mesh_sizes(mesh_shape, devices: int, environment: str) -> tuple[int, ...]:
    """The mesh's axis sizes in ``AXES`` order, checked against the number of devices."""
    sizes: dict[str, int] = dict(mesh_shape or ((DATA, -1),))
    sizes = {axis: sizes.get(axis, 1) for axis in AXES}
    known = int(np.prod([s for s in sizes.values() if s != -1]))
    for axis, size in sizes.items():
        if size == -1:
            sizes[axis] = devices // known if known and devices % known == 0 else 0
    if int(np.prod(list(sizes.values()))) != devices:
        given = dict(mesh_shape or ())
        raise OptionsError(
            f"TrainingOptions(mesh_shape={given!r}) asks for a mesh of "
            f"{' x '.join(str(s) for s in sizes.values())} devices, but "
            f"execution_environment={environment!r} has {devices} devices. Fix: sizes whose "
            f"product is {devices}, e.g. mesh_shape={{'data': {devices}}}, or -1 for one axis "
            "(the devices left)."
        )
    return tuple(sizes[a] for a in AXES)
