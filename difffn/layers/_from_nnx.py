"""``FromNNX``: a flax.nnx module used as a difffn layer.

nnx's own functional API does the work: ``nnx.split`` takes the module apart into a static
``GraphDef`` and its variables, ``nnx.merge`` builds it again from (traced) values inside
``predict``/``forward``, ``nnx.view`` gives the training and inference modes
(``deterministic``, ``use_running_average``) and ``nnx.reseed`` puts difffn's ``key`` into the
module's random streams. The layer keeps the values: every ``nnx.Param`` is a learnable, every
``nnx.BatchStat`` is state, other variables are constants; the random streams are rebuilt from
the key at each call, so nothing random is stored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from .._core import Data, LayerError, Output
from .._layer import learnable, state
from . import _foreign
from ._checks import who


def _nnx():
    from flax import nnx  # flax is a dependency; nnx is imported only when it is used

    return nnx


@dataclasses.dataclass(frozen=True, eq=False)
class NNXStructure(_foreign.Structure):
    """The static part of a split nnx module (hashable: part of the compiled trace's key).

    Attributes:
      train: the ``GraphDef`` in training mode (``deterministic=False``,
        ``use_running_average=False``).
      eval: the ``GraphDef`` in inference mode.
      paths: per group (``params``, ``batch_stats``, ``constants``), the variables' nnx paths,
        as ``(name, path)`` pairs.
      rng_streams: per random-stream variable: path, ``"key"``/``"count"``, its stream tag,
        shape and key implementation.
      random: whether training draws from the streams (they are held by something other than
        an ``nnx.Dropout`` of rate 0), so that a key is needed.
      module_type: the module's class name, for messages.
    """

    train: Any
    eval: Any
    paths: tuple[tuple[tuple[str, tuple[Any, ...]], ...], ...]
    rng_streams: tuple[tuple[tuple[Any, ...], str, str, tuple[int, ...], Any], ...]
    random: bool
    module_type: str

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(sorted({tag for _, _, tag, _, _ in self.rng_streams}))


def _flat(nnx, state) -> dict[tuple, Any]:
    return {tuple(path): var for path, var in nnx.to_flat_state(state)}


def _nested(flat: dict[tuple, Any]) -> dict:
    nested: dict = {}
    for path, value in flat.items():
        node = nested
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return nested


class FromNNX(_foreign.ForeignModule):
    """A ``flax.nnx`` module used as a layer: its ``nnx.Param`` variables are learnables.

    The module's parameters become the learnable ``params`` (a dict from each parameter's path
    in the module, such as ``"linear1/kernel"``, to its value) and its ``nnx.BatchStat``
    variables the state ``batch_stats``: ``forward`` runs the module in training mode
    (``nnx.view(module, deterministic=False, use_running_average=False)``) and returns the
    updated batch statistics; ``predict`` runs it in inference mode and returns them unchanged.
    Other nnx variables are constants. Random streams (``nnx.Rngs`` held by ``nnx.Dropout`` and
    the like) are reseeded from difffn's ``key`` on every ``forward`` call (``nnx.reseed``), so
    training with them needs a key, as ``df.layers.Dropout`` does.

    Formats: without ``fmt`` the layer is ``formattable = False``: the module receives plain
    arrays and its outputs take the input's format (same rank). With ``fmt`` (the module's axis
    order, e.g. ``"BSSC"`` for an ``nnx.Conv``, ``"BC"`` for an ``nnx.Linear``) every input is
    permuted to it and the outputs are labelled ``output_format`` (default: ``fmt``).

    Learn-rate and L2 factors apply to the whole module: ``df.set_learn_rate_factor(net,
    "layer/params", f)``. The module object itself is not kept: the layer holds its values and
    its static structure, so it is an immutable pytree like every layer (``df.save``/``df.load``
    rebuild it from a freshly made module of the same structure).

    Args:
      module: an ``nnx.Module`` (built, with its parameters).
      fmt: the module's input format(s): one string for every input or one per input;
        ``None`` (default): plain arrays, outputs take the input's format.
      output_format: the format(s) of the module's outputs (default: ``fmt``); needs ``fmt``.
      name, description, num_inputs, input_names, num_outputs, output_names: the base
        properties; ``num_inputs`` defaults to the number of required positional parameters
        of the module's ``__call__``.

    Raises:
      LayerError: ``module`` is not an ``nnx.Module``, a bad ``fmt``/``output_format``, or
        training a module with random streams without a key.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> import difffn as df
      >>> mlp = nnx.Sequential(nnx.Linear(3, 8, rngs=nnx.Rngs(0)), nnx.relu,
      ...                      nnx.Linear(8, 2, rngs=nnx.Rngs(1)))
      >>> layer = df.layers.FromNNX(mlp, name="mlp")
      >>> sorted(layer.params)
      ['layers/0/bias', 'layers/0/kernel', 'layers/2/bias', 'layers/2/kernel']
      >>> net = df.Network([df.layers.FeatureInput(3, normalization="none", name="in"), layer,
      ...                   df.layers.Softmax(name="softmax")]).initialize(key=jax.random.key(0))
      >>> y = net.predict(jnp.ones((4, 3)))
      >>> df.dims(y), y.shape
      ('BC', (4, 2))
    """

    params: dict[str, Any] = learnable(default=None)  # set by __init__ from the module
    batch_stats: dict[str, Any] = state(default=None)
    constants: dict[str, Any] | None = None
    fmt: str | tuple[str, ...] | None = None
    output_format: str | tuple[str, ...] | None = None
    structure: NNXStructure | None = None
    formattable: bool = False

    def __init__(
        self,
        module: Any,
        *,
        fmt: str | None = None,
        output_format: str | None = None,
        **properties: Any,
    ) -> None:
        nnx = _nnx()
        _foreign.set_base(self, properties)
        if not isinstance(module, nnx.Module):
            raise LayerError(
                f"{who(self)}: module must be a flax.nnx Module; got {type(module).__name__}. "
                "Fix: FromNNX(nnx.Linear(3, 2, rngs=nnx.Rngs(0))); for an equinox module use "
                "df.layers.FromEquinox."
            )
        modes = {"raise_if_not_found": False}
        train = nnx.view(module, deterministic=False, use_running_average=False, **modes)
        inference = nnx.view(module, deterministic=True, use_running_average=True, **modes)
        graphdef, params, stats, rngs, rest = nnx.split(
            train, nnx.Param, nnx.BatchStat, nnx.RngState, ...
        )
        groups = []
        for group in (params, stats, rest):
            flat = _flat(nnx, group)
            groups.append({_foreign.path_name(p): (p, v.get_value()) for p, v in flat.items()})
        streams = tuple(
            (
                path,
                "key" if isinstance(var, nnx.RngKey) else "count",
                var.tag,
                tuple(var.get_value().shape),
                jax.random.key_impl(var.get_value()) if isinstance(var, nnx.RngKey) else None,
            )
            for path, var in _flat(nnx, rngs).items()
        )
        self.structure = NNXStructure(
            train=graphdef,
            eval=nnx.split(inference)[0],
            paths=tuple(tuple((n, p) for n, (p, _) in g.items()) for g in groups),
            rng_streams=streams,
            random=_draws_randomness(nnx, module),
            module_type=type(module).__name__,
        )
        self.params = {n: v for n, (_, v) in groups[0].items()}
        self.batch_stats = {n: v for n, (_, v) in groups[1].items()}
        self.constants = {n: v for n, (_, v) in groups[2].items()} or None
        self.fmt, self.output_format = fmt, output_format
        self._finish_init(module, skip=1, wrapper="FromNNX")

    def __post_init__(self) -> None:
        # Per layer here (it follows fmt): a field in place of Layer's class-level default.
        self.formattable = _foreign.check_formats(self)  # pyright: ignore[reportIncompatibleVariableOverride]

    @property
    def state_names(self) -> tuple[str, ...]:
        """``("batch_stats",)`` when the module has batch statistics, else ``()``."""
        return ("batch_stats",) if self.batch_stats else ()

    def module(self, *, training: bool = False, key: jax.Array | None = None) -> Any:
        """The nnx module with the layer's current values (a new object, built by ``nnx.merge``).

        Args:
          training: the training-mode module (``deterministic=False``,
            ``use_running_average=False``) instead of the inference-mode one.
          key: reseeds the module's random streams (``nnx.reseed``); without it they start
            from ``jax.random.key(0)``.
        """
        nnx = _nnx()
        s = self.structure
        assert s is not None  # set by __init__
        values = []
        for group, paths in zip((self.params, self.batch_stats, self.constants or {}), s.paths):
            values.append(_nested({p: group[n] for n, p in paths}))
        placeholders = {}
        for path, kind, _, shape, impl in s.rng_streams:
            if kind == "count":
                placeholders[path] = jnp.zeros(shape, jnp.uint32)
            else:
                k = jax.random.key(0, impl=impl)
                placeholders[path] = jax.random.split(k, shape) if shape else k
        module = nnx.merge(s.train if training else s.eval, *values, _nested(placeholders))
        if key is not None and s.rng_streams:
            keys: dict[str, Any] = {t: jax.random.fold_in(key, i) for i, t in enumerate(s.tags)}
            nnx.reseed(module, policy="match_shape", **keys)
        return module

    def predict(self, *inputs: Data) -> Output:
        s = self.structure
        assert s is not None  # set by __init__
        module = self.module(training=False)
        result = module(*_foreign.module_inputs(self, inputs))
        outputs = _foreign.layer_outputs(self, result, s.module_type)
        return (*outputs, self.batch_stats) if self.batch_stats else outputs

    def forward(self, *inputs: Data, key: jax.Array | None = None) -> Output:
        nnx = _nnx()
        s = self.structure
        assert s is not None  # set by __init__
        self._require_key(key, f"has random streams {list(s.tags)} (e.g. nnx.Dropout)")
        module = self.module(training=True, key=key)
        result = module(*_foreign.module_inputs(self, inputs))
        outputs = _foreign.layer_outputs(self, result, s.module_type)
        stats = _flat(nnx, nnx.state(module, nnx.BatchStat))
        names = dict(s.paths[1])
        if not names:
            return outputs
        return (*outputs, {n: stats[p].get_value() for n, p in names.items()})


def _draws_randomness(nnx, module) -> bool:
    """Whether some random stream of ``module`` is used in training (not a rate-0 dropout's)."""
    nodes = list(nnx.iter_graph(module))
    idle = {path for path, node in nodes if isinstance(node, nnx.Dropout) and node.rate == 0}
    return any(isinstance(node, nnx.RngStream) and path[:-1] not in idle for path, node in nodes)
