"""A layer's custom ``backward``, wired in through ``custom_vjp`` over its parameters and inputs.

:func:`call_with_backward` runs a layer's ``predict``/``forward`` inside a ``custom_vjp`` whose
arguments are the layer's learnables, state, constant leaves, inputs and key; its reverse rule
calls the user's ``backward(*X, *Y, *dLdY, [*dLdSout], memory)`` and checks every gradient it
returns (count, shape, dtype) against the value it belongs to, at trace time. Output cotangents
that are symbolic zeros reach the user as real zeros; when every one is zero the backward is
not called at all.

This module does not run the user's methods itself: the caller (``_layer_call``) passes the
function that does, so that calling a layer and its custom backward stay in separate modules
without an import cycle.
"""

from __future__ import annotations

import jax

from . import _cotangents as ct
from ._describe import who
from ._errors import BackwardError, LayerError
from ._fields import LEARNABLE, STATE, is_network
from ._format import FormattedArray, dlarray, stripdims
from ._primitive import custom_vjp
from ._signatures import backward_takes_state, has_method


def call_with_backward(layer, inputs, training: bool, key, run_user):
    """Run ``layer`` with its custom backward; returns ``(outputs, new_state)``.

    Args:
      layer: an initialized layer whose class defines ``backward``.
      inputs: the values the user's method receives (plain or formatted, as the layer wants).
      training: use ``forward`` (training time) instead of ``predict``.
      key: randomness for ``forward``.
      run_user: ``run_user(layer, inputs, training, key) -> (outputs, new_state, memory)``, the
        function that invokes the user's method and splits what it returns.
    """
    cls = type(layer)
    learnables = tuple(getattr(layer, n) for n in cls._learnable_fields)
    for n, w in zip(cls._learnable_fields, learnables):
        if is_network(w):
            raise LayerError(
                f"{who(layer)} holds a network in learnable {n!r} and "
                "defines backward; a custom backward cannot cover a nested network. Fix: remove "
                "backward (autodiff differentiates through the nested network)."
            )
    states = tuple(getattr(layer, n) for n in cls._state_fields)
    leaf_fields = layer._leaf_fields
    const_fields = tuple(n for n in leaf_fields if cls._field_kinds[n] not in (LEARNABLE, STATE))
    consts = tuple(getattr(layer, n) for n in const_fields)
    # The layer's own pytree node with its fields as leaves: rebuilding it from new field
    # values is the pytree fast path (no validation), as when JAX unflattens a layer.
    treedef = jax.tree_util.tree_structure(layer, is_leaf=lambda node: node is not layer)
    takes_state = backward_takes_state(cls, layer.num_inputs, layer.num_outputs)

    def assemble(ws, ss, cs):
        values = dict(zip(cls._learnable_fields, ws))
        values.update(zip(cls._state_fields, ss))
        values.update(zip(const_fields, cs))
        return treedef.unflatten([values[n] for n in leaf_fields])

    def run(ws, ss, cs, xs, k):
        outputs, new_state, _ = run_user(assemble(ws, ss, cs), xs, training, k)
        return tuple(outputs), tuple(new_state)

    def fwd(ws, ss, cs, xs, k):
        is_primal = lambda x: hasattr(x, "perturbed")  # noqa: E731
        values = jax.tree.map(lambda p: p.value, (ws, ss, cs, xs, k), is_leaf=is_primal)
        flags = jax.tree.map(lambda p: bool(p.perturbed), (ws, ss, xs), is_leaf=is_primal)
        ws_, ss_, cs_, xs_, k_ = values
        outputs, new_state, memory = run_user(assemble(ws_, ss_, cs_), xs_, training, k_)
        specs = ct.Static(
            (
                tuple(any(jax.tree.leaves(f)) for f in flags[0]),
                tuple(any(jax.tree.leaves(f)) for f in flags[1]),
                tuple(any(jax.tree.leaves(f)) for f in flags[2]),
                tuple(_spec(y) for y in outputs),
                tuple(_spec(s) for s in new_state),
            )
        )
        residuals = (ws_, ss_, cs_, xs_, tuple(outputs), memory, specs)
        return (tuple(outputs), tuple(new_state)), residuals

    def bwd(residuals, cotangents):
        ws, ss, cs, xs, outputs, memory, specs = residuals
        w_req, s_req, x_req, y_specs, s_out_specs = specs.value
        dys, dss = cotangents
        zero_state = tuple(None for _ in ss)
        nothing = (tuple(None for _ in ws), zero_state, _none_like(cs), _none_like(xs), None)
        if all(
            ct.is_symbolic_zero(c) for c in jax.tree.leaves((dys, dss), is_leaf=ct.is_symbolic_zero)
        ):
            return nothing
        dys = tuple(_instantiate(c, y, spec) for c, y, spec in zip(dys, outputs, y_specs))
        args = [*xs, *outputs, *dys]
        if takes_state:
            args += [_instantiate(c, None, spec) for c, spec in zip(dss, s_out_specs)]
        args.append(memory)
        try:
            result = assemble(ws, ss, cs).backward(*args)
        except Exception as error:
            if memory is None and not training and has_method(cls, "forward"):
                raise BackwardError(
                    f"{who(layer, 'backward')} failed with memory=None: "
                    "memory comes from forward (training), but here predict was differentiated "
                    "(layer(x), net.predict), which has no memory, as in MATLAB. Fix: handle "
                    "memory is None in backward (recompute what it needs from X and Y), or "
                    f"differentiate the training path (net.forward). It raised: "
                    f"{type(error).__name__}: {error}"
                ) from error
            raise
        name = who(layer, "backward")
        n_in, n_w, n_s = len(xs), len(ws), len(ss) if takes_state else 0
        names = (
            [f"dLd{n}" for n in layer.input_names]
            + [f"dLd{n}" for n in cls._learnable_fields]
            + ([f"dLd{n}" for n in cls._state_fields] if takes_state else [])
        )
        grads = ct.normalize_returns(result, n_in + n_w + n_s, who=name, names=names)
        total = len(grads)
        dxs = tuple(
            _check_input_gradient(
                g,
                x,
                required,
                name,
                f"the gradient of input {layer.input_names[i]!r} ({i + 1} of {total})",
            )
            for i, (g, x, required) in enumerate(zip(grads[:n_in], xs, x_req))
        )
        dws = tuple(
            ct.check_gradient(
                g,
                ct.Spec.of(w),
                who=name,
                required=required,
                what=f"the gradient of learnable {field!r} ({n_in + j + 1} of {total})",
            )
            for j, (g, w, required, field) in enumerate(
                zip(grads[n_in : n_in + n_w], ws, w_req, cls._learnable_fields)
            )
        )
        if takes_state:
            dss_in = tuple(
                _check_state_gradient(
                    g,
                    s,
                    required,
                    name,
                    f"the gradient of state {field!r} ({n_in + n_w + j + 1} of {total})",
                )
                for j, (g, s, required, field) in enumerate(
                    zip(grads[n_in + n_w :], ss, s_req, cls._state_fields)
                )
            )
        else:
            dss_in = zero_state
        return dws, dss_in, _none_like(cs), dxs, None

    run_with_backward = custom_vjp(run, fwd, bwd, name=f"{cls.__name__}.backward")
    outputs, new_state = run_with_backward(learnables, states, consts, tuple(inputs), key)
    return outputs, new_state


def _spec(value):
    data = stripdims(value)
    return ct.Spec.of(data) if data is not None else None


def _none_like(tree):
    return jax.tree.map(lambda _: None, tree)


def _instantiate(cotangent, primal, spec):
    """A real array for a (possibly symbolic-zero) cotangent, formatted like its primal."""
    if isinstance(cotangent, FormattedArray):
        data = ct.instantiate(cotangent.data, spec)
        return dlarray(data, cotangent.format)
    data = ct.instantiate(cotangent, spec)
    if isinstance(primal, FormattedArray):
        return dlarray(data, primal.format)
    return data


def _check_input_gradient(grad, x, required, owner, what):
    checked = ct.check_gradient(
        stripdims(grad) if grad is not None else None,
        ct.Spec.of(stripdims(x)),
        who=owner,
        what=what,
        required=required,
    )
    if checked is not None and isinstance(x, FormattedArray):
        return dlarray(checked, x.format)
    if checked is None and isinstance(x, FormattedArray):
        return None
    return checked


def _check_state_gradient(grad, s, required, owner, what):
    if s is None:
        return None
    return ct.check_gradient(grad, ct.Spec.of(s), who=owner, what=what, required=required)
