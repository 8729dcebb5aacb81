r"""Solvers: MATLAB's SGDM, Adam and RMSProp as optax transformations, and the custom-loop helpers.

MATLAB's update rules, which these follow exactly (``α`` learn rate times the parameter's
learn-rate factor, ``g`` the gradient, ``t`` the iteration from 1):

* SGDM: $v \leftarrow \gamma v - \alpha g,\ \theta \leftarrow \theta + v$. The velocity
  accumulates learn-rate-scaled steps, so a learn-rate change affects only new steps (unlike
  ``optax.sgd``'s momentum, which scales the whole velocity). Built as
  ``chain(scale_by_learn_rate, optax.trace(γ))``.
* Adam: $m \leftarrow \beta_1 m + (1-\beta_1) g,\ v \leftarrow \beta_2 v + (1-\beta_2) g^2,\
  \theta \leftarrow \theta - \alpha \frac{m / (1-\beta_1^t)}{\sqrt{v / (1-\beta_2^t)} + \epsilon}$
  (``optax.scale_by_adam``).
* RMSProp: $v \leftarrow \beta_2 v + (1-\beta_2) g^2,\
  \theta \leftarrow \theta - \alpha \frac{g}{\sqrt{v} + \epsilon}$ (``optax.scale_by_rms`` with
  ``eps_in_sqrt=False`` and no bias correction; optax's default puts ε under the root).

``trainnet`` chains, in this order: coupled L2 regularization ($g + \lambda f_{L2} W$, for
every solver), gradient clipping, then the solver with per-parameter learn-rate factors. The
learn rate is an extra argument of ``update`` (``learn_rate=``), so schedules need no
re-compilation.

The custom-loop helpers ``sgdmupdate``, ``adamupdate`` and ``rmspropupdate`` keep MATLAB's
argument order. ``net`` may be a ``df.Network`` (its learnable parameters are updated, each with
its learn-rate factor; the optimizer state is a ``ParameterTable`` like ``net.learnables``), a
``df.ParameterTable`` or any pytree of arrays (``grad`` and the state then have its structure).
They add no L2 regularization (as in MATLAB: add it to the gradients yourself).
"""

from __future__ import annotations

import functools
import numbers
import warnings
from typing import Any, NamedTuple, TypeVar, cast

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import optax

from .._core import OptionsError, PyTree
from .._layer import ParameterTable, learnable_mask
from .._network import LEARN_RATE, Network, leaf_factors

# -- optax transformations ---------------------------------------------------------------------


def _per_leaf(fn, updates, factors, *rest):
    if factors is None:
        return jax.tree.map(lambda u, *r: fn(u, 1.0, *r), updates, *rest)
    leaves, treedef = jax.tree.flatten(updates)
    others = [jax.tree.leaves(r) for r in rest]
    if len(factors) != len(leaves):
        raise ValueError(f"{len(factors)} factors for {len(leaves)} parameters")
    return jax.tree.unflatten(
        treedef,
        [
            fn(u, f, *(o[i] for o in others))
            for i, (u, f) in enumerate(zip(leaves, factors, strict=True))
        ],
    )


def scale_by_learn_rate(factors=None) -> optax.GradientTransformationExtraArgs:
    """Multiply updates by ``-learn_rate * factor`` (the learn rate is an ``update`` extra arg).

    Args:
      factors: one learn-rate factor per leaf of the parameters (leaf order), or None for 1.
    """

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None, *, learn_rate, **extra):
        del params, extra
        lr = jnp.asarray(learn_rate)

        def scale(u, f):
            if f == 0:
                return jnp.zeros_like(u)
            return (-f * lr).astype(u.dtype) * u if f != 1 else (-lr).astype(u.dtype) * u

        return _per_leaf(scale, updates, factors), state

    # update takes the learn rate as a keyword: one of the extra args optax passes on
    return optax.GradientTransformationExtraArgs(
        init, cast(optax.TransformUpdateExtraArgsFn, update)
    )


def add_l2_regularization(l2: float, factors=None) -> optax.GradientTransformation:
    """Coupled L2: add ``l2 * factor * W`` to each gradient (MATLAB's L2Regularization)."""

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        if l2 == 0:
            return updates, state

        def add(u, f, w):
            return u if f == 0 else u + (l2 * f) * w.astype(u.dtype)

        return _per_leaf(add, updates, factors, params), state

    return optax.GradientTransformation(init, update)


def clip_by_parameter_norm(threshold: float) -> optax.GradientTransformation:
    """Scale each parameter's gradient down to L2 norm ``threshold`` when it is larger."""

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params

        def clip(g):
            norm = jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32))))
            scale = jnp.where(norm > threshold, threshold / jnp.maximum(norm, 1e-30), 1.0)
            return g * scale.astype(g.dtype)

        return jax.tree.map(clip, updates), state

    return optax.GradientTransformation(init, update)


def gradient_clipping(method: str, threshold: float) -> optax.GradientTransformation:
    """MATLAB's gradient thresholding: ``"l2norm"``, ``"global-l2norm"``, ``"absolute-value"``."""
    if threshold == float("inf"):
        return optax.identity()
    if method == "l2norm":
        return clip_by_parameter_norm(threshold)
    if method == "global-l2norm":
        return optax.clip_by_global_norm(threshold)
    if method == "absolute-value":
        return optax.clip(threshold)
    raise OptionsError(f"unknown gradient_threshold_method {method!r}")


def solver(name: str, options, lr_factors=None) -> optax.GradientTransformationExtraArgs:
    """The solver of ``options`` (sgdm/adam/rmsprop) with per-leaf learn-rate factors."""
    if name == "sgdm":
        return optax.chain(scale_by_learn_rate(lr_factors), optax.trace(decay=options.momentum))
    if name == "adam":
        return optax.chain(
            optax.scale_by_adam(
                b1=options.gradient_decay_factor,
                b2=options.squared_gradient_decay_factor,
                eps=options.epsilon,
            ),
            scale_by_learn_rate(lr_factors),
        )
    if name == "rmsprop":
        return optax.chain(
            optax.scale_by_rms(
                decay=options.squared_gradient_decay_factor,
                eps=options.epsilon,
                initial_scale=0.0,
                eps_in_sqrt=False,
            ),
            scale_by_learn_rate(lr_factors),
        )
    raise OptionsError(f"unknown solver {name!r}")


_INJECTED = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)


def _injected(node) -> bool:
    """A state of ``optax.inject_hyperparams`` whose learning rate is a number (not a schedule
    of its own, which it would recompute at every step)."""
    return (
        isinstance(node, _INJECTED)
        and "learning_rate" in node.hyperparams
        and "learning_rate" not in getattr(node, "hyperparams_states", {})
    )


def injected_learn_rate(state) -> float | None:
    """The learning rate a custom solver was built with by ``optax.inject_hyperparams``, or None
    when it has none trainnet can set (then it keeps its own learn rate)."""
    found = [n for n in jax.tree.leaves(state, is_leaf=_injected) if _injected(n)]
    return float(found[0].hyperparams["learning_rate"]) if found else None


def drive_learn_rate(tx, factors=None) -> optax.GradientTransformationExtraArgs:
    """A user's optax transformation with trainnet's learn rate and learn-rate factors.

    Each ``update`` writes the ``learn_rate`` extra argument into every learning rate that
    ``optax.inject_hyperparams`` put in its state (so schedules reach it without rebuilding or
    re-tracing it), then multiplies each leaf's update by its learn-rate factor (the update
    already holds the learn rate, so this is the factor times the learn rate, as for the
    built-in solvers).
    """

    def init(params):
        return tx.init(params)

    def update(updates, state, params=None, *, learn_rate, **extra):
        del extra

        def drive(node):
            if not _injected(node):
                return node
            rate = node.hyperparams["learning_rate"]
            hyperparams = {**node.hyperparams, "learning_rate": jnp.asarray(learn_rate, rate.dtype)}
            return node._replace(hyperparams=hyperparams)

        state = jax.tree.map(drive, state, is_leaf=_injected)
        updates, state = tx.update(updates, state, params)

        def scale(u, f):
            return u if f == 1 else jnp.zeros_like(u) if f == 0 else (u * f).astype(u.dtype)

        scaled = _per_leaf(scale, updates, factors)
        return scaled, state

    # update takes the learn rate as a keyword: one of the extra args optax passes on
    return optax.GradientTransformationExtraArgs(
        init, cast(optax.TransformUpdateExtraArgsFn, update)
    )


def training_transform(options, lr_factors, l2_factors) -> optax.GradientTransformationExtraArgs:
    """L2 regularization, clipping and the solver, as trainnet applies them.

    ``options.solver`` is a name, or any optax transformation: it then takes the place of the
    solver, with the same L2, clipping and learn-rate factors (`drive_learn_rate`).
    """
    if isinstance(options.solver, optax.GradientTransformation):
        chosen = drive_learn_rate(options.solver, lr_factors)
    else:
        chosen = solver(options.solver, options, lr_factors)
    return optax.chain(
        add_l2_regularization(options.l2_regularization, l2_factors),
        gradient_clipping(options.gradient_threshold_method, options.gradient_threshold),
        chosen,
    )


# -- parameter views for the custom-loop helpers --------------------------------------------------


class _View(NamedTuple):
    params: list  # the leaves that are updated
    factors: tuple[float, ...] | None
    to_leaves: Any  # value (same kind as net/grad/state) -> list of leaves
    params_out: Any  # list of leaves -> the updated `net`
    state_out: Any  # list of leaves -> a state value (table or pytree)


def _view(who: str, net) -> _View:
    if isinstance(net, Network):
        if not net.initialized:
            raise OptionsError(
                f"{who}: the network is not initialized. Fix: net = net.initialize(key=...)."
            )
        leaves, treedef = jax.tree.flatten(net)
        mask = jax.tree.leaves(learnable_mask(net))
        index = [i for i, m in enumerate(mask) if m]
        factors = leaf_factors(net, LEARN_RATE)
        factors = tuple(factors[i] for i in index)

        def with_learnables(values):
            new = list(leaves)
            for i, v in zip(index, values, strict=True):
                new[i] = v
            return jax.tree.unflatten(treedef, new)

        def to_leaves(value, what):
            if isinstance(value, Network):
                # Static metadata (e.g. learn-rate factors set after taking the gradient) may
                # differ; the leaves and which of them are learnable must not.
                if jax.tree.structure(value) != treedef and (
                    [lyr.name for lyr in value.layers] != [lyr.name for lyr in net.layers]
                    or jax.tree.leaves(learnable_mask(value)) != mask
                ):
                    raise OptionsError(
                        f"{who}: {what} is a network of another structure than net. Fix: take "
                        "the gradient of a function of this very network."
                    )
                other = jax.tree.leaves(value)
                return [other[i] for i in index]
            if isinstance(value, ParameterTable):
                expected = list(net.learnables)
                if list(value) != expected:
                    raise OptionsError(
                        f"{who}: {what} has rows {list(value)}; expected the rows of "
                        f"net.learnables, {expected}."
                    )
                other = jax.tree.leaves(net.replace(learnables=value))
                return [other[i] for i in index]
            raise OptionsError(
                f"{who}: with a df.Network, {what} must be a df.Network of gradients (from "
                "jax.grad of a function of the network) or a ParameterTable like net.learnables; "
                f"got {type(value).__name__}."
            )

        return _View(
            [leaves[i] for i in index],
            factors,
            to_leaves,
            with_learnables,
            lambda values: with_learnables(values).learnables,
        )

    leaves, treedef = jax.tree.flatten(net)

    def to_leaves(value, what):
        if jax.tree.structure(value) != treedef:
            raise OptionsError(
                f"{who}: {what} has structure {jax.tree.structure(value)}; expected the "
                f"structure of the parameters, {treedef}."
            )
        return jax.tree.leaves(value)

    def rebuild(values):
        return jax.tree.unflatten(treedef, values)

    return _View(leaves, None, to_leaves, rebuild, rebuild)


def _state(view: _View, value, what: str):
    if value is None:
        return [jnp.zeros_like(p) for p in view.params]
    return view.to_leaves(value, what)


def _check_decay(who: str, name: str, value) -> None:
    """A decay factor: a number in [0, 1)."""
    _check_number(who, name, value, low=0, low_open=False, high=1, high_open=True)


def _check_number(who: str, name: str, value, *, low, high=None, low_open=True, high_open=False):
    if isinstance(value, jax.core.Tracer) or (
        hasattr(value, "shape") and not isinstance(value, numbers.Number) and value.ndim != 0
    ):
        return value
    try:
        v = float(cast(Any, value))  # anything: float() decides
    except (TypeError, ValueError):
        raise OptionsError(
            f"{who}: {name} must be a real number; got {value!r}. Fix: pass {name} as a float."
        ) from None
    ok = (v > low if low_open else v >= low) and (
        high is None or (v < high if high_open else v <= high)
    )
    if not ok:
        lo = ("(" if low_open else "[") + str(low)
        hi = "inf)" if high is None else str(high) + (")" if high_open else "]")
        raise OptionsError(
            f"{who}: {name} must be in {lo}, {hi}; got {value!r}. Fix: pass a value in that "
            f"range (or leave {name} out for its default)."
        )
    return value


@functools.partial(jax.jit, static_argnames=("factors",))
def _sgdm_step(params, grads, velocity, learn_rate, momentum, factors):
    tx = optax.chain(scale_by_learn_rate(factors), optax.trace(decay=momentum))
    state = (optax.EmptyState(), optax.TraceState(trace=velocity))
    updates, new_state = tx.update(grads, state, params, learn_rate=learn_rate)
    _, trace = cast(tuple[Any, optax.TraceState], new_state)  # the chain's states
    return optax.apply_updates(params, updates), trace.trace


class SolverWarning(UserWarning):
    """A custom-loop update got a value it could not use as given, and said what it did instead.

    Today: ``df.adamupdate`` with a *traced* iteration below 1 (inside ``jax.jit``, ``vmap`` or
    ``scan``), whose value is known only when the compiled step runs. The step then uses
    iteration 1, so the parameters stay finite, and this warning names the value and the fix.
    """


def _warn_iteration_from_zero(iteration) -> None:
    # Runs on the host when the compiled step runs (jax.debug.callback): an exception here
    # could only reach the user as JAX's JaxRuntimeError, so this warns, and the step goes on.
    # Checked here too: under vmap the cond below becomes a select that runs both branches.
    if np.min(iteration) >= 1:
        return
    warnings.warn(
        "adamupdate: iteration must be counted from 1 (MATLAB's definition: the bias "
        f"correction divides by 1 - β^t, which is 0 at t = 0); got {int(np.min(iteration))} "
        "inside a traced function (such as jax.jit), so this step used iteration 1 and the "
        "parameters stay finite. Fix: pass iteration = step + 1 for a step count from 0.",
        SolverWarning,
        stacklevel=2,
    )


@functools.partial(jax.jit, static_argnames=("factors",))
def _adam_step(params, grads, mu, nu, iteration, learn_rate, b1, b2, eps, factors):
    # A traced iteration cannot be checked when adamupdate is called, and an exception raised
    # by the compiled step can only surface as JAX's own JaxRuntimeError (no Python exception
    # type crosses the user's jit). So a bad one is treated as 1 (t = 0 would divide by
    # 1 - β^0 = 0 and give NaN parameters) and a SolverWarning says so when the step runs.
    iteration = jnp.asarray(iteration)
    jax.lax.cond(
        jnp.any(iteration < 1),
        lambda: jax.debug.callback(_warn_iteration_from_zero, iteration),
        lambda: None,
    )
    tx = optax.chain(optax.scale_by_adam(b1=b1, b2=b2, eps=eps), scale_by_learn_rate(factors))
    count = jnp.maximum(iteration.astype(jnp.int32), 1) - 1
    state = (optax.ScaleByAdamState(count=count, mu=mu, nu=nu), optax.EmptyState())
    updates, new_state = tx.update(grads, state, params, learn_rate=learn_rate)
    adam, _ = cast(tuple[optax.ScaleByAdamState, Any], new_state)  # the chain's states
    return optax.apply_updates(params, updates), adam.mu, adam.nu


@functools.partial(jax.jit, static_argnames=("factors",))
def _rmsprop_step(params, grads, nu, learn_rate, decay, eps, factors):
    tx = optax.chain(
        optax.scale_by_rms(decay=decay, eps=eps, initial_scale=0.0, eps_in_sqrt=False),
        scale_by_learn_rate(factors),
    )
    state = (optax.ScaleByRmsState(nu=nu), optax.EmptyState())
    updates, new_state = tx.update(grads, state, params, learn_rate=learn_rate)
    rms, _ = cast(tuple[optax.ScaleByRmsState, Any], new_state)  # the chain's states
    return optax.apply_updates(params, updates), rms.nu


_Params = TypeVar("_Params")  # a df.Network, or a pytree of parameters


def sgdmupdate(
    net: _Params,
    grad: PyTree,
    vel: PyTree | None = None,
    learn_rate: float = 0.01,
    momentum: float = 0.9,
) -> tuple[_Params, PyTree]:
    r"""One SGDM step (MATLAB ``sgdmupdate``): $v \leftarrow \gamma v - \alpha g$,
    $\theta \leftarrow \theta + v$.

    Args:
      net: a ``df.Network`` (its learnables are updated, each with its learn-rate factor), a
        ``df.ParameterTable`` or any pytree of arrays.
      grad: the gradients: for a network, a network of gradients (``jax.grad`` of a function of
        it) or a table like ``net.learnables``; otherwise the structure of ``net``.
      vel: the velocity from the previous call, or None at the start (zeros).
      learn_rate: the global learn rate α (0.01).
      momentum: γ (0.9).

    Returns:
      ``(net, vel)``: the updated parameters (same kind as ``net``) and the velocity (a
      ``ParameterTable`` for a network, else ``net``'s structure).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> params = {"w": jnp.array([1.0, 2.0])}
      >>> params, vel = df.sgdmupdate(params, {"w": jnp.array([1.0, -1.0])}, None, 0.1, 0.9)
      >>> params["w"], vel["w"]
      (Array([0.9, 2.1], dtype=float32), Array([-0.1,  0.1], dtype=float32))
    """
    who = "sgdmupdate"
    _check_number(who, "learn_rate", learn_rate, low=0)
    _check_number(who, "momentum", momentum, low=0, high=1, low_open=False)
    view = _view(who, net)
    grads = view.to_leaves(grad, "grad")
    velocity = _state(view, vel, "vel")
    params, velocity = _sgdm_step(
        view.params, grads, velocity, learn_rate, momentum, factors=view.factors
    )
    return view.params_out(params), view.state_out(velocity)


def adamupdate(
    net: _Params,
    grad: PyTree,
    average_grad: PyTree | None,
    average_sq_grad: PyTree | None,
    iteration: int,
    learn_rate: float = 0.001,
    gradient_decay_factor: float = 0.9,
    squared_gradient_decay_factor: float = 0.999,
    epsilon: float = 1e-08,
) -> tuple[_Params, PyTree, PyTree]:
    r"""One Adam step (MATLAB ``adamupdate``), with bias correction by ``iteration`` (from 1).

    $m \leftarrow \beta_1 m + (1-\beta_1) g$, $v \leftarrow \beta_2 v + (1-\beta_2)
    g^2$, $\theta \leftarrow \theta - \alpha \hat m / (\sqrt{\hat v} + \epsilon)$ with
    $\hat m = m / (1 - \beta_1^t)$, $\hat v = v / (1 - \beta_2^t)$.

    Args:
      net, grad: as for ``sgdmupdate``.
      average_grad, average_sq_grad: the moving averages from the previous call, or None.
      iteration: the iteration number t, counted from 1. A concrete value below 1 (or not an
        int) is an ``OptionsError``. A traced one (inside ``jax.jit``) is known only when the
        compiled step runs, where no Python exception can reach you except as JAX's
        ``JaxRuntimeError``; there a value below 1 is used as 1 (the parameters stay finite)
        and a [`SolverWarning`][difffn.SolverWarning] names the value and the fix.
      learn_rate: α (0.001).
      gradient_decay_factor: β1 (0.9).
      squared_gradient_decay_factor: β2 (0.999).
      epsilon: ε (1e-8).

    Returns:
      ``(net, average_grad, average_sq_grad)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> w, m, v = df.adamupdate(jnp.array([1.0]), jnp.array([0.5]), None, None, 1)
      >>> w  # the first step moves every parameter by about the learn rate
      Array([0.999], dtype=float32)
    """
    who = "adamupdate"
    if not isinstance(iteration, jax.core.Tracer):  # traced: warned inside the step
        value = np.asarray(iteration)
        if not (
            value.ndim == 0
            and (np.issubdtype(value.dtype, np.integer) or isinstance(iteration, numbers.Integral))
            and not isinstance(iteration, bool)
            and value >= 1
        ):
            raise OptionsError(
                f"{who}: iteration must be an int counted from 1; got {iteration!r}. Fix: pass "
                "iteration = step + 1 for a step count from 0."
            )
    _check_number(who, "learn_rate", learn_rate, low=0)
    _check_decay(who, "gradient_decay_factor", gradient_decay_factor)
    _check_decay(who, "squared_gradient_decay_factor", squared_gradient_decay_factor)
    _check_number(who, "epsilon", epsilon, low=0)
    view = _view(who, net)
    grads = view.to_leaves(grad, "grad")
    mu = _state(view, average_grad, "average_grad")
    nu = _state(view, average_sq_grad, "average_sq_grad")
    params, mu, nu = _adam_step(
        view.params,
        grads,
        mu,
        nu,
        iteration,
        learn_rate,
        gradient_decay_factor,
        squared_gradient_decay_factor,
        epsilon,
        factors=view.factors,
    )
    return view.params_out(params), view.state_out(mu), view.state_out(nu)


def rmspropupdate(
    net: _Params,
    grad: PyTree,
    average_sq_grad: PyTree | None,
    learn_rate: float = 0.001,
    squared_gradient_decay_factor: float = 0.9,
    epsilon: float = 1e-08,
) -> tuple[_Params, PyTree]:
    r"""One RMSProp step (MATLAB ``rmspropupdate``): $v \leftarrow \beta_2 v + (1-\beta_2)
    g^2$, $\theta \leftarrow \theta - \alpha g / (\sqrt{v} + \epsilon)$.

    Args:
      net, grad: as for ``sgdmupdate``.
      average_sq_grad: the moving average from the previous call, or None.
      learn_rate: α (0.001).
      squared_gradient_decay_factor: β2 (0.9).
      epsilon: ε (1e-8), added outside the square root as in MATLAB.

    Returns:
      ``(net, average_sq_grad)``.
    """
    who = "rmspropupdate"
    _check_number(who, "learn_rate", learn_rate, low=0)
    _check_decay(who, "squared_gradient_decay_factor", squared_gradient_decay_factor)
    _check_number(who, "epsilon", epsilon, low=0)
    view = _view(who, net)
    grads = view.to_leaves(grad, "grad")
    nu = _state(view, average_sq_grad, "average_sq_grad")
    params, nu = _rmsprop_step(
        view.params,
        grads,
        nu,
        learn_rate,
        squared_gradient_decay_factor,
        epsilon,
        factors=view.factors,
    )
    return view.params_out(params), view.state_out(nu)
