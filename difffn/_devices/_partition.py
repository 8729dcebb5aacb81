"""How learnables and their optimizer state are laid out over the mesh (``parameter_sharding``).

Each learnable leaf gets one ``PartitionSpec`` over the mesh axes ``("data", "model")``:

* the spec its field declares, ``df.learnable(sharding=P(...))`` (checked: every named axis
  exists, and each split dimension is divisible by the product of its axes' sizes);
* else, with ``parameter_sharding="fsdp"``: split along its largest dimension that the
  ``"data"`` size divides (the first such, on a tie), as in ZeRO-3 / FSDP: each device keeps
  1/N of the parameter and XLA all-gathers it where the step needs it whole and
  reduce-scatters its gradient;
* else replicated.

The optimizer state follows its parameters: optax's ``tree_map_params`` finds the parameter-
shaped parts of any optax state (momentum, Adam's moments) from the transformation's ``init``,
and the rest (counts, injected hyperparameters) is replicated. Without a mesh every leaf is on
the one device.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import optax
from jax.sharding import PartitionSpec as P

from .._core import OptionsError
from .._layer import LEARNABLE, SHARDING, walk
from ._sharding import DATA, Placement


@dataclasses.dataclass(frozen=True)
class LearnableLayout:
    """The specs of a run's learnable leaves (in the order of the learnable leaves).

    Attributes:
      specs: one ``PartitionSpec`` per learnable leaf.
      paths: the parameter path of each leaf (``"layer/field"``), for messages.
    """

    specs: tuple
    paths: tuple[str, ...]

    def shardings(self, placement: Placement) -> list:
        return [placement.sharding(spec) for spec in self.specs]

    def key(self) -> tuple:
        """A hashable identity (for the cache of compiled steps)."""
        return self.specs


def learnable_layout(net, placement: Placement, mode: str) -> LearnableLayout:
    """The spec of every learnable leaf of ``net`` (a ``df.Network``) on ``placement``.

    Raises:
      OptionsError: a declared spec names an axis the mesh lacks, has more entries than the
        parameter has dimensions, or splits a dimension its axes' sizes do not divide.
    """
    specs, paths = [], []
    for p in walk(net):
        if p.kind != LEARNABLE or p.nested:
            continue
        declared = _declared(p)
        for leaf in p.leaves:
            paths.append(p.path)
            if placement.mesh is None:
                specs.append(P())
            elif declared is not None:
                specs.append(_checked(declared, leaf, p.path, placement))
            elif mode == "fsdp":
                specs.append(fsdp_spec(leaf.shape, placement.data_size))
            else:
                specs.append(P())
    return LearnableLayout(tuple(specs), tuple(paths))


def _declared(p):
    for f in dataclasses.fields(p.layer):
        if f.name == p.field:
            return f.metadata.get(SHARDING)
    return None


def fsdp_spec(shape, parts: int) -> P:
    """Split along the largest dimension that ``parts`` divides; replicated if none does.

    Examples:
      >>> from difffn._devices._partition import fsdp_spec
      >>> fsdp_spec((6, 8), 4), fsdp_spec((3,), 4), fsdp_spec((8, 8), 4)
      (P(None, 'data'), P(), P('data',))
    """
    best = None
    for axis, size in enumerate(shape):
        if parts > 1 and size % parts == 0 and (best is None or size > shape[best]):
            best = axis
    if best is None:
        return P()
    return P(*([None] * best), DATA)


def _checked(spec: P, leaf, path: str, placement: Placement) -> P:
    mesh = placement.mesh
    assert mesh is not None  # the caller checks a spec only on a mesh
    shape = tuple(leaf.shape)
    where = f"df.learnable(sharding={spec}) of {path!r} (shape {shape})"
    if len(spec) > len(shape):
        raise OptionsError(
            f"trainnet: {where} has {len(spec)} entries for a parameter of {len(shape)} "
            f"dimension(s). Fix: one entry per dimension at most, e.g. P(None, 'model')."
        )
    for dim, entry in enumerate(spec):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        for axis in axes:
            if axis not in mesh.shape:
                raise OptionsError(
                    f"trainnet: {where} names the mesh axis {axis!r}, which the mesh does not "
                    f"have; its axes are {list(mesh.shape)} ({placement.describe()}). Fix: name "
                    "'data' or 'model' (sized with TrainingOptions(mesh_shape=...))."
                )
        parts = math.prod(mesh.shape[a] for a in axes)
        if shape[dim] % parts:
            raise OptionsError(
                f"trainnet: {where} splits dimension {dim} (size {shape[dim]}) over "
                f"{' x '.join(axes)} = {parts} devices, which does not divide it. Fix: a "
                f"mesh_shape whose {'/'.join(axes)} size divides {shape[dim]}, or another spec."
            )
    return spec


def optimizer_shardings(tx, opt_state_shapes, learnable_shardings, placement: Placement):
    """Shardings for an optax state (a pytree of shapes): each parameter-shaped part as its
    parameter, the rest replicated."""
    if placement.mesh is None:
        return jax.tree.map(lambda _: placement.replicated, opt_state_shapes)
    replicated = placement.replicated
    return optax.tree_utils.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        opt_state_shapes,
        learnable_shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
    )


def bytes_per_device(tree) -> dict:
    """Bytes of ``tree``'s arrays held on each device (from their ``addressable_shards``)."""
    held: dict = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held


def bytes_sent_per_step(learnable_bytes: int, data_size: int, mode: str, *, reduce_scatter=True):
    """The bytes each device sends per training step for the learnables' collectives, by the
    standard ring costs (``docs/scaling.md``, *Toward a pod*), on a data axis of ``data_size``.

    ``"replicated"``: one all-reduce of the gradients, ``2 (N - 1) / N x B``. ``"fsdp"``: an
    all-gather of the parameters, ``(N - 1) / N x B``, and the gradients reduced to their shards:
    a reduce-scatter, ``(N - 1) / N x B`` (``reduce_scatter=True``: XLA's GPU and TPU pipelines
    form one), or an all-reduce followed by each device taking its shard, ``2 (N - 1) / N x B``
    (XLA on CPU). Scalars (the loss, the metrics) and activations' collectives are not counted.

    Args:
      learnable_bytes: ``B``, the bytes of all the learnables (float32).
      data_size: ``N``, the size of the mesh's ``"data"`` axis.
      mode: ``parameter_sharding``, ``"replicated"`` or ``"fsdp"``.
      reduce_scatter: whether the fsdp gradients are reduced by a reduce-scatter.

    Returns:
      ``{collective: bytes sent per device}``.

    Examples:
      >>> from difffn._devices._partition import bytes_sent_per_step
      >>> bytes_sent_per_step(1000, 4, "replicated")
      {'all-reduce': 1500.0}
      >>> bytes_sent_per_step(1000, 4, "fsdp")
      {'all-gather': 750.0, 'reduce-scatter': 750.0}
      >>> bytes_sent_per_step(1000, 4, "fsdp", reduce_scatter=False)
      {'all-gather': 750.0, 'all-reduce': 1500.0}
    """
    ring = (data_size - 1) / data_size * learnable_bytes
    if mode == "replicated":
        return {"all-reduce": 2 * ring}
    if reduce_scatter:
        return {"all-gather": ring, "reduce-scatter": ring}
    return {"all-gather": ring, "all-reduce": 2 * ring}
