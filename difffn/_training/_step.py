"""The compiled training step of ``trainnet``, its evaluation step, and their cache.

One step is one ``jax.jit`` function: forward, loss, backward, the optax chain (coupled L2,
clipping, the solver with per-parameter learn-rate factors), and the state update, with the
learnables, the other leaves and the optimizer state donated so each iteration updates buffers
in place. On a mesh its input and output shardings are explicit: the learnables and their
optimizer state as ``_partition`` lays them out, everything else replicated, the batch split
over the mesh's ``"data"`` axis; a batch padded to split over it (``_sharding``) has the padding
cut from the outputs (and from padded targets) before the loss (``_batches.Keep``). The compute
precision (``_precision``) casts the learnables and inputs inside the step and scales the loss
for float16.

Its data argument is what a data source feeds (``_sources``): ``"gather"`` takes the whole
device-resident data and gathers the mini-batch from the epoch's order inside the compiled
function; ``"direct"`` takes the mini-batch itself; ``"sequences"`` takes a padded mini-batch with
its padding masks, and the recurrent state of the previous chunk of split sequences
(``_sequence_source``). Networks with layers that must run eagerly
(``acceleratable = False``) run the step un-jitted at the top level (the network compiles its own
segments, ``Network.run``) with a jitted update.

Compiled steps are cached across ``trainnet`` calls, keyed on everything the trace depends on:
the network's structure, the learnable leaves, the loss, the metrics, the options that change the
solver (``_options.step_key``, derived from the options table), the factors, the devices and
the learnables' layout.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, cast

import jax
import jax.numpy as jnp
import optax

from .._batching import sequence_source as _seq
from .._core import OptionsError, kernel_options, run_once, stripdims
from .._core import batches as _batches
from .._core import user_code as _user_code
from .._devices import optimizer_shardings
from . import _chunk, _options
from ._precision import Policy
from ._state import combine, split

_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 32


def cached_steps(
    *,
    net,
    learnable_index,
    loss,
    loss_label,
    metrics,
    options,
    make_tx,
    factors,
    placement,
    layout,
) -> Steps:
    """The `Steps` of a run, shared with earlier runs that compile the same trace.

    ``make_tx()`` builds the optax chain (only when no cached steps fit); ``factors`` are the
    learn-rate and L2 factors of every leaf; ``layout`` the learnables' ``LearnableLayout``.
    """
    key = (
        jax.tree.structure(net),
        learnable_index,
        loss,
        metrics,
        _options.step_key(options),
        factors,
        placement.key(),
        layout.key(),
    )
    steps = _CACHE.get(key)
    if steps is None:
        steps = Steps(
            net=net,
            learnable_index=learnable_index,
            loss=loss,
            loss_label=loss_label,
            metrics=metrics,
            tx=make_tx(),
            placement=placement,
            layout=layout,
            policy=Policy(options.precision),
        )
        _CACHE[key] = steps
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return steps


def _keep_if(frozen, old, new):
    """``old`` where ``frozen`` (a traced bool), else ``new``, leaf by leaf.

    Leaves of one shape and dtype (all of them, in practice) take one ``lax.select_n`` on the
    scalar flag: ``jnp.where`` would stage a nested ``jit`` per leaf (two per parameter, in
    the trace of every step)."""

    def pick(o, n):
        o, n = jnp.asarray(o), jnp.asarray(n)
        if o.shape == n.shape and o.dtype == n.dtype:
            return jax.lax.select_n(frozen, n, o)
        return jnp.where(frozen, o, n)

    return jax.tree.map(pick, old, new)


def loss_value(loss, name, outputs, targets, **mask):
    """The user's loss on the outputs and targets (and ``mask=``, for padded sequences), as a
    scalar (named errors otherwise)."""
    value = _user_code.call(
        loss,
        *outputs,
        *targets,
        what=f"trainnet: the loss {name!r}",
        fix=(
            f"{_user_code.TRACEABLE_FIX} (the loss is compiled into the training step), or "
            "compute it from jnp functions without Python branches"
        ),
        call_fix=(
            "a loss takes the network outputs, then the targets, loss(Y1, ..., T1, ...), and "
            "returns a scalar."
        ),
        error=OptionsError,
        **mask,
    )
    return scalar_loss(value, name)


def scalar_loss(value, name):
    """The loss value as a scalar array (a clear error for anything else)."""
    if value is None:
        raise OptionsError(
            f"trainnet: the loss {name!r} returned None; a loss must return a scalar array. "
            "Fix: add the missing `return` (e.g. return jnp.mean((Y - T) ** 2))."
        )
    value = stripdims(value)
    if jnp.ndim(value) != 0:
        raise OptionsError(
            f"trainnet: the loss {name!r} returned an array of shape {jnp.shape(value)}; a loss "
            "must return a scalar. Fix: reduce it over the observations, e.g. jnp.mean(...) "
            "or jnp.sum(...)."
        )
    return value


class Steps:
    """The jitted (or eager) training and evaluation functions of one run's configuration."""

    def __init__(
        self, *, net, learnable_index, loss, loss_label, metrics, tx, placement, layout, policy
    ):
        self.treedef = jax.tree.structure(net)
        self.learnable_index = learnable_index
        self.loss = loss
        self.loss_label = loss_label
        self.metrics = metrics
        self.tx = tx
        self.placement = placement
        self.policy = policy
        self.wanted = net.output_ports()
        self.accelerate = net.acceleratable
        self.learnable_shardings = layout.shardings(placement)
        self._jitted: dict = {}

    def init_state(self, learnables):
        """The optimizer state of ``learnables``, laid out like them (optax ``init``, jitted and
        compiled for its one run)."""
        shapes = jax.eval_shape(self.tx.init, learnables)
        self.opt_shardings = optimizer_shardings(
            self.tx, shapes, self.learnable_shardings, self.placement
        )
        return run_once(self.tx.init, learnables, out_shardings=self.opt_shardings)

    def _carry_shardings(self):
        replicated = self.placement.replicated
        return (self.learnable_shardings, replicated, self.opt_shardings, replicated, replicated)

    def _core(
        self, carry, xs, ts, key, iteration, learn_rate, masks=None, sequences=None, keep=None
    ):
        """One step; ``masks`` and ``sequences`` (``(chunked, carried state or None)``) for
        padded sequences: then it also returns the recurrent state when ``chunked``; ``keep``: the
        inputs were padded to split over the mesh, and only the outputs' rows that
        ``_batches.Keep`` names are real (the targets have just those)."""
        learnables, others, opt_state, nan_at, scaling = carry
        step_key = jax.random.fold_in(key, iteration)
        policy = self.policy
        xs = policy.compute(xs)

        def objective(learnables):
            # Each mini-batch holds independent observations: recurrent state (layers that
            # define reset_state, e.g. LSTM) starts afresh, as in MATLAB. Layers that accumulate
            # statistics (BatchNorm) do not define reset_state and keep theirs.
            weights = policy.compute(learnables)
            net = combine(self.treedef, self.learnable_index, weights, others).reset_state()
            if masks is None:
                outputs, states = net.run(xs, step_key, training=True, outputs=self.wanted)
                outputs = policy.output(outputs)
                if keep is not None:  # the padding carries no weight: it never reaches the loss
                    outputs = tuple(_batches.real_rows(y, keep) for y in outputs)
                value = loss_value(self.loss, self.loss_label, outputs, ts)
                return value, (outputs, states, (None,) * len(outputs))
            assert sequences is not None  # given with masks
            chunked, carried = sequences
            if carried is not None:  # the next chunk of split sequences: their state goes on
                net = _seq.continue_from(net, carried)
            # with masks, run returns the outputs' masks too
            outputs, states, out_masks = cast(
                tuple[Any, Any, Any],
                net.run(xs, step_key, training=True, outputs=self.wanted, masks=masks),
            )
            outputs = policy.output(outputs)
            out_masks = _seq.output_masks(outputs, out_masks, masks, chunked)
            mask = _seq.loss_mask(self.loss, self.loss_label, out_masks)
            value = loss_value(self.loss, self.loss_label, outputs, ts, **mask)
            return value, (outputs, states, out_masks)

        value, (outputs, states, out_masks), grads, finite, scaling = policy.value_and_grad(
            objective, learnables, scaling
        )
        # The first NaN loss is noted on the device (the host reads it when it next waits
        # anyway); the steps after it change nothing, so training stops exactly there.
        frozen = nan_at > 0
        nan_at = jnp.where(frozen | ~jnp.isnan(value), nan_at, iteration)
        # float16: a step whose gradients overflowed is skipped (the loss scale shrinks).
        scaling = policy.count_skipped(scaling, ~frozen & ~finite)
        skip = frozen | ~finite
        learnables, opt_state = self._update(learnables, grads, opt_state, learn_rate, skip)
        net = combine(self.treedef, self.learnable_index, learnables, others)
        # Stored reset, so the state's shape (and the donated buffers) stay the same each step.
        _, new_others = split(net.with_layer_states(states).reset_state(), self.learnable_index)
        others = _keep_if(skip, others, new_others)
        values = tuple(_seq.metric_value(m, outputs[0], ts[0], out_masks[0]) for m in self.metrics)
        carry = (learnables, others, opt_state, nan_at, scaling)
        if sequences is not None and sequences[0]:
            return carry, value, values, _seq.carried_states(net, states)
        return carry, value, values

    def _update_impl(self, learnables, grads, opt_state, learn_rate, frozen):
        updates, new_state = self.tx.update(grads, opt_state, learnables, learn_rate=learn_rate)
        new = (optax.apply_updates(learnables, updates), new_state)
        return _keep_if(frozen, (learnables, opt_state), new)

    def _update(self, learnables, grads, opt_state, learn_rate, frozen):
        if self.accelerate:
            return self._update_impl(learnables, grads, opt_state, learn_rate, frozen)
        return self._jit("update", self._update_impl, donate=(0, 2))(
            learnables, grads, opt_state, learn_rate, frozen
        )

    def _jit(self, name, fn, donate=(), statics=()):
        key = (name, statics)
        if key not in self._jitted:
            shardings = {}
            if self.placement.mesh is not None:
                replicated = self.placement.replicated
                carry = self._carry_shardings()
                shardings = {
                    # (carry, data, key, iteration, learn_rate): the data keeps its own
                    "step": dict(
                        in_shardings=(carry, None, replicated, replicated, replicated),
                        out_shardings=(carry, replicated, replicated),
                    ),
                    "update": dict(out_shardings=(self.learnable_shardings, self.opt_shardings)),
                    "accumulate": dict(out_shardings=replicated),
                    "evaluate": dict(out_shardings=replicated),
                }.get(name, {})  # "sequences": one device (the trainer refuses a mesh)
            self._jitted[key] = jax.jit(
                fn, donate_argnums=donate, compiler_options=kernel_options(), **shardings
            )
        return self._jitted[key]

    def step(self, spec):
        """The step for a data source's ``spec``: ``step(carry, data, key, iteration,
        learn_rate) -> (carry, loss, metric values)``; the carry is ``(learnables, others,
        opt_state, nan_at, scaling)`` (``nan_at``: the iteration of the first NaN loss, 0
        before; ``scaling``: the ``_precision.Scaling`` state)."""
        if spec[0] == "sequences":
            return self._sequence_step(spec)
        step = self._step_fn(spec)
        if not self.accelerate:
            return step
        return self._jit("step", step, donate=(0,), statics=spec)

    def chunk(self, spec, length: int, args):
        """``length`` steps of a ``"gather"`` or ``"direct"`` spec in one compiled call
        (``_chunk``), or None when they must run one call each (see ``_chunk.loop_safe``);
        ``args`` are the first step's arguments, to check the step's program."""
        # the data's shapes too: jit compiles anew for them, and so the check reads them anew
        batch = args[1][:2]
        key = ("chunk", spec, length, _chunk.signature(batch))
        if key not in self._jitted:
            single = jax.jit(self._step_fn(spec))  # one trace: the check's, reused in the loop
            treedef = jax.tree.structure(args[1])
            program = jax.jit(
                _chunk.steps(single, length, spec[0], treedef), donate_argnums=(0,),
                compiler_options=kernel_options(),
            )  # fmt: skip
            if self.placement.devices[0].platform == "cpu":  # XLA:CPU's rule
                jaxpr = single.trace(*args).jaxpr
                convolutions = _chunk.convolutions(jaxpr)
                if convolutions and not _chunk.loop_safe(jaxpr):
                    program = None
                elif convolutions:  # and as XLA compiled them (jit reuses this compilation)
                    data = args[1] if spec[0] == "gather" else [  # as _chunk.Stacker's
                        jax.ShapeDtypeStruct((length, *a.shape), a.dtype, sharding=a.sharding)
                        for a in jax.tree.leaves(args[1])
                    ]  # fmt: skip
                    rest = (jax.ShapeDtypeStruct((length,), jnp.float32),
                            jax.ShapeDtypeStruct((), jnp.int32))  # fmt: skip
                    hlo = program.lower(args[0], data, *args[2:4], *rest).compile().as_text()
                    if not _chunk.compiled_safe(hlo or "", convolutions):
                        program = None
            self._jitted[key] = program
        return self._jitted[key]

    def _step_fn(self, spec):
        """The un-jitted step of a ``"gather"`` or ``"direct"`` spec."""
        placement = self.placement
        if spec[0] == "gather":
            _, batch_size, in_axes, t_axes, padded = spec
            keep = _batches.keep_first(batch_size, padded)

            def batch(data: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
                X, T, order, b = data
                index = jax.lax.dynamic_slice_in_dim(order, b * batch_size, batch_size)
                # padding: copies of the first observation, cut from the outputs in _core
                rows = jnp.concatenate([index, jnp.broadcast_to(index[:1], (padded - batch_size,))])
                xs = tuple(
                    placement.constrain(_batches.take(x, rows, a, in_bounds=True), a)
                    for x, a in zip(X, in_axes, strict=True)
                )
                ts = tuple(
                    placement.constrain(_batches.take(t, index, a, in_bounds=True), a)
                    for t, a in zip(T, t_axes, strict=True)
                )
                return xs, ts

        else:
            _, in_axes, t_axes, keep = spec

            def batch(data: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
                xs, ts = data
                xs = tuple(placement.constrain(x, a) for x, a in zip(xs, in_axes, strict=True))
                ts = tuple(placement.constrain(t, a) for t, a in zip(ts, t_axes, strict=True))
                if keep is not None and keep.targets:  # padded like the inputs: cut alike
                    ts = tuple(
                        _batches.real_rows(t, keep, a) for t, a in zip(ts, t_axes, strict=True)
                    )
                return xs, ts

        def step(carry, data, key, iteration, learn_rate):
            xs, ts = batch(data)
            return self._core(carry, xs, ts, key, iteration, learn_rate, keep=keep)

        return step

    def _sequence_step(self, spec):
        """The step of padded sequences: data ``(xs, ts, masks, carried state or None)``."""
        _, in_axes, t_axes, chunked, _ = spec
        placement = self.placement

        def step(carry, data, key, iteration, learn_rate):
            xs, ts, masks, carried = data
            xs = tuple(placement.constrain(x, a) for x, a in zip(xs, in_axes, strict=True))
            ts = tuple(placement.constrain(t, a) for t, a in zip(ts, t_axes, strict=True))
            masks = tuple(None if m is None else placement.constrain(m, 0) for m in masks)
            return self._core(
                carry, xs, ts, key, iteration, learn_rate, masks=masks, sequences=(chunked, carried)
            )

        if not self.accelerate:
            return step
        return self._jit("sequences", step, donate=(0,), statics=spec)

    def accumulate(self, total, value, n, states, new_states):
        """Validation totals: loss times batch size summed, metric states merged (jitted)."""

        def accumulate(total, value, n, states, new_states):
            merged = tuple(
                m.merge(a, b) for m, a, b in zip(self.metrics, states, new_states, strict=True)
            )
            return total + value * n, merged

        return self._jit("accumulate", accumulate)(total, value, n, states, new_states)

    def evaluate(self):
        """evaluate(learnables, others, xs, ts, masks=None) -> (loss, metric states of this
        batch); ``masks``: padding masks of sequence inputs."""

        def evaluate(learnables, others, xs, ts, masks=None):
            policy = self.policy
            weights = policy.compute(learnables)
            net = combine(self.treedef, self.learnable_index, weights, others)
            xs = policy.compute(xs)
            if masks is None:
                outputs, _ = net.run(xs, None, training=False, outputs=self.wanted)
                outputs = policy.output(outputs)
                out_masks = (None,) * len(outputs)
                mask = {}
            else:
                outputs, _, out_masks = net.run(
                    xs, None, training=False, outputs=self.wanted, masks=masks
                )
                outputs = policy.output(outputs)
                mask = _seq.loss_mask(self.loss, self.loss_label, out_masks)
            value = loss_value(self.loss, self.loss_label, outputs, ts, **mask)
            states = tuple(
                _seq.metric_update(m, outputs[0], ts[0], out_masks[0]) for m in self.metrics
            )
            return value, states

        if not self.accelerate:
            return evaluate
        return self._jit("evaluate", evaluate)
