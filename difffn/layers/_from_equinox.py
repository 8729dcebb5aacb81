"""``FromEquinox``: an equinox module used as a difffn layer.

An equinox module is a pytree; the layer keeps its leaves and its treedef and rebuilds it with
``jax.tree.unflatten`` inside ``predict``/``forward``. The leaves that ``eqx.is_inexact_array``
selects (what ``eqx.filter_grad`` differentiates) are the learnables, other arrays are
constants, the rest (activation functions, flags) is static. State (``eqx.nn.State`` from
``eqx.nn.make_with_state``, e.g. ``eqx.nn.BatchNorm``'s running statistics) is difffn state.
Equinox modules take one observation; the layer maps them over the batch with ``jax.vmap``
(``axis_name="batch"``, the name ``eqx.nn.BatchNorm`` is built with), as equinox's own examples
do. Training and inference are ``eqx.nn.inference_mode``.

equinox is an optional dependency (``pip install difffn[equinox]``): it is imported only when a
``FromEquinox`` is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from .._core import Data, LayerError, MissingDependencyError, Output, PyTree
from .._layer import learnable
from .._layer import state as state_field
from . import _foreign
from ._checks import who

BATCH_AXIS_NAME = "batch"


def _eqx():
    try:
        import equinox
    except ImportError:
        raise MissingDependencyError(
            "df.layers.FromEquinox needs equinox, which is not installed. Fix: pip install "
            "equinox (or pip install 'difffn[equinox]')."
        ) from None
    return equinox


@dataclasses.dataclass(frozen=True, eq=False)
class EquinoxStructure(_foreign.Structure):
    """The static part of an equinox module (hashable: part of the compiled trace's key).

    Attributes:
      treedef: the module's treedef.
      statics: ``(leaf index, value)`` of the leaves that are not arrays.
      params, constants: ``(name, leaf index)`` of the inexact-array leaves and of the others.
      state_treedef: the treedef of the ``eqx.nn.State`` (None without state); ``state_names``
        the names of its leaves, in leaf order.
      takes_key: whether the module's ``__call__`` takes ``key=``.
      random: whether the module holds an ``eqx.nn.Dropout`` (training then needs a key).
      module_type: the module's class name, for messages.
    """

    treedef: Any
    statics: tuple[tuple[int, Any], ...]
    params: tuple[tuple[str, int], ...]
    constants: tuple[tuple[str, int], ...]
    state_treedef: Any
    state_names: tuple[str, ...]
    takes_key: bool
    random: bool
    module_type: str


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _state_names(eqx_state) -> tuple[str, ...]:
    """One name per leaf of an ``eqx.nn.State``: its index's marker, then the path inside."""
    values, markers = eqx_state.tree_flatten()
    names = []
    for marker, value in zip(markers, values):
        for path, _ in jax.tree_util.tree_flatten_with_path(value)[0]:
            inner = _foreign.path_name(path)
            names.append(f"{marker}/{inner}" if inner else str(marker))
    return tuple(names)


class FromEquinox(_foreign.ForeignModule):
    """An ``equinox`` module used as a layer: its inexact-array leaves are learnables.

    The leaves of the module that ``eqx.is_inexact_array`` selects (what ``eqx.filter_grad``
    differentiates) become the learnable ``params``, a dict from each leaf's path in the module
    (``"layers/0/weight"``) to its value; other array leaves are ``constants``. A stateful module
    (built with ``eqx.nn.make_with_state``) is given its ``state=``: the ``eqx.nn.State`` leaves
    are the layer's state, by index marker and path (``"MLP.bn.ema_state_index/0"``), updated by
    ``forward`` (training mode) and used by ``predict`` (``eqx.nn.inference_mode``). The module
    is called as equinox modules are: ``module(*X, [state], key=key)``, returning ``Y`` (or
    ``(Y, state)``); it gets ``key`` only when its ``__call__`` takes one.

    Batch: equinox modules take one observation, so by default (``vmap=True``) the layer maps
    the module over the batch axis with ``jax.vmap(..., axis_name="batch")`` (build
    ``eqx.nn.BatchNorm(..., axis_name="batch")``) and splits ``key`` per observation.
    ``vmap=False`` gives the module the whole batch.

    Formats: without ``fmt`` the layer is ``formattable = False``: the module receives plain
    arrays (batch on axis 0) and its outputs take the input's format. With ``fmt`` (the axis
    order of the batched input, e.g. ``"BCSS"`` for an ``eqx.nn.Conv2d``, whose observations are
    channel-first) every input is permuted to it and the outputs are labelled
    ``output_format`` (default: ``fmt``); the ``B`` label says which axis is mapped.

    Learn-rate and L2 factors apply to the whole module (``"layer/params"``). The module object
    is not kept: ``df.save``/``df.load`` rebuild the layer from a module of the same structure.

    Args:
      module: an ``equinox.Module``.
      state: its ``eqx.nn.State``, when it has stateful layers.
      fmt: the input format(s), one string or one per input (``None``: plain arrays).
      output_format: the output format(s) (default: ``fmt``); needs ``fmt``.
      vmap: map the module over the batch (default True).
      name, description, num_inputs, input_names, num_outputs, output_names: the base
        properties; ``num_inputs`` defaults to the module's required positional parameters
        (less the state).

    Raises:
      MissingDependencyError: equinox is not installed.
      LayerError: ``module`` is not an equinox module, it has stateful layers but no
        ``state=``, a leaf that is neither an array nor hashable, bad formats, or training a
        module with dropout without a key.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import equinox as eqx
      >>> import difffn as df
      >>> mlp = eqx.nn.MLP(3, 2, width_size=8, depth=1, key=jax.random.key(0))
      >>> layer = df.layers.FromEquinox(mlp, name="mlp")
      >>> sorted(layer.params)
      ['layers/0/bias', 'layers/0/weight', 'layers/1/bias', 'layers/1/weight']
      >>> y = layer(df.dlarray(jnp.ones((4, 3)), "BC"))   # mapped over the 4 observations
      >>> df.dims(y), y.shape
      ('BC', (4, 2))
    """

    params: dict[str, Any] = learnable(default=None)  # set by __init__ from the module
    state: dict[str, Any] = state_field(default=None)
    constants: dict[str, Any] | None = None
    fmt: str | tuple[str, ...] | None = None
    output_format: str | tuple[str, ...] | None = None
    vmap: bool = True
    structure: EquinoxStructure | None = None
    formattable: bool = False

    def __init__(
        self,
        module: Any,
        *,
        state: PyTree | None = None,
        fmt: str | None = None,
        output_format: str | None = None,
        vmap: Any = True,
        **properties: Any,
    ) -> None:
        eqx = _eqx()
        _foreign.set_base(self, properties)
        if not isinstance(module, eqx.Module):
            raise LayerError(
                f"{who(self)}: module must be an equinox Module; got {type(module).__name__}. "
                "Fix: FromEquinox(eqx.nn.MLP(...)); for a flax.nnx module use "
                "df.layers.FromNNX."
            )
        stateful = any(
            isinstance(leaf, eqx.nn.StateIndex)
            for leaf in jax.tree.leaves(module, is_leaf=lambda x: isinstance(x, eqx.nn.StateIndex))
        )
        if stateful and state is None:
            raise LayerError(
                f"{who(self)}: the module {type(module).__name__} has stateful layers "
                "(eqx.nn.StateIndex, e.g. eqx.nn.BatchNorm) but no state was given. Fix: "
                "model, state = eqx.nn.make_with_state(Model)(...); FromEquinox(model, "
                "state=state)."
            )
        if state is not None and not isinstance(state, eqx.nn.State):
            raise LayerError(
                f"{who(self)}: state must be an eqx.nn.State (from eqx.nn.make_with_state); "
                f"got {type(state).__name__}."
            )
        flat, treedef = jax.tree_util.tree_flatten_with_path(module)
        statics, params, constants = [], {}, {}
        for i, (path, leaf) in enumerate(flat):
            name = _foreign.path_name(path)
            if eqx.is_inexact_array(leaf):
                params[name] = (i, leaf)
            elif _is_array(leaf):
                constants[name] = (i, leaf)
            else:
                try:
                    hash(leaf)
                except TypeError:
                    raise LayerError(
                        f"{who(self)}: the module's leaf {name!r} is an unhashable "
                        f"{type(leaf).__name__}, which can be neither a parameter nor static "
                        "configuration. Fix: make it an array or mark the field "
                        "eqx.field(static=True) with a hashable value."
                    ) from None
                statics.append((i, leaf))
        call = type(module).__call__
        self.structure = EquinoxStructure(
            treedef=treedef,
            statics=tuple(statics),
            params=tuple((n, i) for n, (i, _) in params.items()),
            constants=tuple((n, i) for n, (i, _) in constants.items()),
            state_treedef=jax.tree.structure(state) if state is not None else None,
            state_names=_state_names(state) if state is not None else (),
            takes_key=_foreign.accepts_keyword(call, "key"),
            random=any(
                isinstance(leaf, eqx.nn.Dropout) and leaf.p > 0
                for leaf in jax.tree.leaves(module, is_leaf=lambda x: isinstance(x, eqx.nn.Dropout))
            ),
            module_type=type(module).__name__,
        )
        self.params = {n: v for n, (_, v) in params.items()}
        self.constants = {n: v for n, (_, v) in constants.items()} or None
        if state is not None:
            self.state = dict(zip(self.structure.state_names, jax.tree.leaves(state)))
        self.fmt, self.output_format, self.vmap = fmt, output_format, vmap
        self._finish_init(module, skip=2 if state is not None else 1, wrapper="FromEquinox")

    def __post_init__(self) -> None:
        if not isinstance(self.vmap, bool):
            raise LayerError(f"{who(self)}: vmap must be True or False; got {self.vmap!r}.")
        # Per layer here (it follows fmt): a field in place of Layer's class-level default.
        self.formattable = _foreign.check_formats(self)  # pyright: ignore[reportIncompatibleVariableOverride]
        if self.vmap and self.fmt is not None:
            count = _foreign.port_count(self, "input")
            for f in _foreign.formats(self, self.fmt, count, "fmt"):
                if "B" not in f:
                    raise LayerError(
                        f"{who(self)}: fmt {f!r} has no B (batch) axis, so the layer cannot "
                        "map the module over the observations. Fix: include B in fmt (the "
                        "batched input's axis order), or pass vmap=False."
                    )

    @property
    def state_names(self) -> tuple[str, ...]:
        """``("state",)`` for a module with an ``eqx.nn.State``, else ``()``."""
        return ("state",) if self.state else ()

    def module(self, *, training: bool = False) -> Any:
        """The equinox module with the layer's current values (in training or inference mode)."""
        eqx = _eqx()
        s = self.structure
        assert s is not None  # set by __init__
        leaves: list[Any] = [None] * s.treedef.num_leaves
        for i, value in s.statics:
            leaves[i] = value
        for group, index in ((self.params, s.params), (self.constants or {}, s.constants)):
            for name, i in index:
                leaves[i] = group[name]
        module = jax.tree.unflatten(s.treedef, leaves)
        return eqx.nn.inference_mode(module, value=not training)

    def predict(self, *inputs: Data) -> Output:
        return self._run(inputs, training=False, key=None)

    def forward(self, *inputs: Data, key: jax.Array | None = None) -> Output:
        self._require_key(key, "holds eqx.nn.Dropout")
        return self._run(inputs, training=True, key=key)

    def _run(self, inputs, *, training: bool, key):
        s = self.structure
        assert s is not None  # set by __init__
        module = self.module(training=training)
        xs = _foreign.module_inputs(self, inputs)
        has_state = s.state_treedef is not None
        eqx_state = (
            jax.tree.unflatten(s.state_treedef, [self.state[n] for n in s.state_names])
            if has_state
            else None
        )
        use_key = s.takes_key and key is not None

        def call(xs, st, k):
            args = (*xs, st) if has_state else xs
            return module(*args, **({"key": k} if use_key else {}))

        if self.vmap:
            fmts = _foreign.input_formats(self)
            in_axes = tuple(f.index("B") for f in fmts) if fmts else (0,) * len(xs)
            batch = xs[0].shape[in_axes[0]]
            keys = jax.random.split(key, batch) if use_key and key is not None else None
            out_fmts = _foreign.output_formats(self)
            out_axes = 0
            if out_fmts is not None:
                axes = tuple(f.index("B") if "B" in f else None for f in out_fmts)
                out_axes = axes[0] if self.num_outputs == 1 else axes
            result = jax.vmap(
                call,
                in_axes=(in_axes, None, 0 if use_key else None),
                out_axes=(out_axes, None) if has_state else out_axes,
                axis_name=BATCH_AXIS_NAME,
            )(xs, eqx_state, keys)
        else:
            result = call(xs, eqx_state, key)
        if has_state:
            result, eqx_state = result
        outputs = _foreign.layer_outputs(self, result, s.module_type)
        if not has_state:
            return outputs
        return (*outputs, dict(zip(s.state_names, jax.tree.leaves(eqx_state))))
