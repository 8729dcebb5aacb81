"""A layer's custom ``backward``, wired in through ``custom_vjp`` over its parameters and inputs.

`call_with_backward` runs a layer's ``predict``/``forward`` inside a ``custom_vjp`` whose
arguments are the layer's learnables, state, constant leaves, inputs and key; its reverse rule
calls the user's ``backward(*X, *Y, *dLdY, [*dLdSout], memory)`` and checks every gradient it
returns (count, shape, dtype) against the value it belongs to, at trace time. Output cotangents
that are symbolic zeros reach the user as real zeros; when every one is zero the backward is
not called at all.

What is kept for the backward: the parameters (the layer is rebuilt from them), and the inputs,
outputs and memory value that ``backward`` takes. A parameter whose name starts with ``_``
(``def backward(self, x, _y, dLdY, _memory)``, MATLAB's ``~``) receives ``None`` and its value
is not kept: a residual that costs no memory.

Second order follows ``DifferentiableFunction``'s rule, with the same builder
(``_function.twin_custom_vjp``): the forward rule calls the operation itself, so an outer
derivative of the outputs uses ``backward`` again;
the memory value is differentiated by autodiff of the user's method, through an *inner* twin
that also returns it (and keeps what that needs, only under an outer derivative).

This module does not run the user's methods itself: the caller (``_layer_call``) passes the
function that does, so that calling a layer and its custom backward stay in separate modules
without an import cycle.
"""

from __future__ import annotations

import dataclasses

import jax

from .._core import (
    BackwardError,
    FormattedArray,
    LayerError,
    backward_takes_state,
    dims,
    dlarray,
    has_method,
    positional,
    stripdims,
    who,
)
from .._function import autodiff_jvp, twin_custom_vjp
from .._function import cotangents as ct
from ._fields import LEARNABLE, STATE, is_network


@dataclasses.dataclass(frozen=True)
class Kept:
    """Which of backward's arguments it takes (a leading ``_`` in the name: it does not)."""

    inputs: tuple[bool, ...]
    outputs: tuple[bool, ...]
    output_gradients: tuple[bool, ...]
    memory: bool

    @classmethod
    def of(cls, layer_cls, n_in: int, n_out: int, takes_state: bool) -> Kept:
        signature = positional(layer_cls.backward)
        if signature.variadic:
            return cls((True,) * n_in, (True,) * n_out, (True,) * n_out, True)
        used = [not name.startswith("_") for name in signature.names]
        k = len(layer_cls._state_fields) if takes_state else 0
        return cls(
            tuple(used[:n_in]),
            tuple(used[n_in : n_in + n_out]),
            tuple(used[n_in + n_out : n_in + 2 * n_out]),
            used[n_in + 2 * n_out + k],
        )


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
    kept = Kept.of(cls, layer.num_inputs, layer.num_outputs, takes_state)
    method = "forward" if training and has_method(cls, "forward") else "predict"

    def assemble(ws, ss, cs):
        values = dict(zip(cls._learnable_fields, ws))
        values.update(zip(cls._state_fields, ss))
        values.update(zip(const_fields, cs))
        return treedef.unflatten([values[n] for n in leaf_fields])

    def run_full(ws, ss, cs, xs, k):
        outputs, new_state, memory = run_user(assemble(ws, ss, cs), xs, training, k)
        mem_static, mem_arrays = ct.split_memory(memory, who(layer, method))
        return tuple(outputs), tuple(new_state), mem_static, mem_arrays

    def fwd(inner, run_inner, ws, ss, cs, xs, k):
        is_primal = lambda x: hasattr(x, "perturbed")  # noqa: E731
        values = jax.tree.map(lambda p: p.value, (ws, ss, cs, xs, k), is_leaf=is_primal)
        flags = jax.tree.map(lambda p: bool(p.perturbed), (ws, ss, xs), is_leaf=is_primal)
        ws_, ss_, cs_, xs_, k_ = values
        # The operation itself: an outer derivative of its outputs uses this backward again.
        outputs, new_state, mem_static, mem_arrays = run_inner(ws_, ss_, cs_, xs_, k_)
        specs = ct.Static(
            (
                tuple(any(jax.tree.leaves(f)) for f in flags[0]),
                tuple(any(jax.tree.leaves(f)) for f in flags[1]),
                tuple(any(jax.tree.leaves(f)) for f in flags[2]),
                tuple(_spec(y) for y in outputs),
                tuple(_spec(s) for s in new_state),
                tuple((_spec(x), dims(x) if isinstance(x, FormattedArray) else None) for x in xs_),
                tuple(dims(y) if isinstance(y, FormattedArray) else None for y in outputs),
                mem_static,
                tuple(ct.Spec.of(m) for m in mem_arrays),
            )
        )
        # Only the inner twin (under an outer derivative) keeps what the memory's derivative
        # needs: every input and the key.
        for_memory = (xs_, k_) if inner and mem_arrays else ((), None)
        residuals = (
            ws_,
            ss_,
            cs_,
            tuple(x if keep else None for x, keep in zip(xs_, kept.inputs)),
            tuple(y if keep else None for y, keep in zip(outputs, kept.outputs)),
            mem_arrays if kept.memory else (),
            for_memory,
            specs,
        )
        return (outputs, new_state, mem_static, mem_arrays), residuals

    def bwd(inner, residuals, cotangents):
        ws, ss, cs, xs, outputs, mem_arrays, for_memory, specs = residuals
        x_specs, mem_static, mem_specs = specs.value[5], specs.value[7], specs.value[8]
        dys, dss = cotangents[0], cotangents[1]
        mem_cts = tuple(cotangents[3]) if inner else ()
        nothing = (
            tuple(None for _ in ws),
            tuple(None for _ in ss),
            _none_like(cs),
            tuple(None for _ in x_specs),
            None,
        )
        leaves = jax.tree.leaves((dys, dss), is_leaf=ct.is_symbolic_zero)
        user_part = not all(ct.is_symbolic_zero(c) for c in leaves)
        memory_part = any(not ct.is_symbolic_zero(c) for c in mem_cts)
        grads = nothing
        if user_part:
            memory = ct.join_memory(mem_static, mem_arrays) if kept.memory else None
            grads = user_backward(ws, ss, cs, xs, outputs, dys, dss, memory, specs.value)
        if memory_part:
            xs_all, k = for_memory
            extra = memory_vjp(ws, ss, cs, xs_all, k, mem_cts, mem_specs)
            grads = jax.tree.map(_add, grads, extra, is_leaf=_is_none_or_formatted)
        return grads

    def user_backward(ws, ss, cs, xs, outputs, dys, dss, memory, static):
        w_req, s_req, x_req, y_specs, s_out_specs, x_specs, y_formats, _, _ = static
        dys = tuple(
            _instantiate(c, fmt, spec) if keep else None
            for c, fmt, spec, keep in zip(dys, y_formats, y_specs, kept.output_gradients)
        )
        args = [*xs, *outputs, *dys]
        if takes_state:
            args += [_instantiate(c, None, spec) for c, spec in zip(dss, s_out_specs)]
        args.append(memory)
        try:
            result = assemble(ws, ss, cs).backward(*args)
        except Exception as error:
            if memory is None and kept.memory and not training and has_method(cls, "forward"):
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
                spec,
                fmt,
                required,
                name,
                f"the gradient of input {layer.input_names[i]!r} ({i + 1} of {total})",
            )
            for i, (g, (spec, fmt), required) in enumerate(zip(grads[:n_in], x_specs, x_req))
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
            dss_in = tuple(None for _ in ss)
        return dws, dss_in, _none_like(cs), dxs, None

    def memory_vjp(ws, ss, cs, xs, k, mem_cts, mem_specs):
        """Autodiff of the user's method's memory value (second order and above only)."""

        def memory_of(ws, ss, xs):
            return run_full(ws, ss, cs, xs, k)[3]

        _, vjp = jax.vjp(memory_of, ws, ss, xs)
        dws, dss, dxs = vjp(tuple(ct.instantiate(c, s) for c, s in zip(mem_cts, mem_specs)))
        return dws, dss, _none_like(cs), dxs, None

    # Forward over reverse (jax.hessian, jax.jvp of a gradient): the outputs fwd computes get
    # their tangents by autodiff of the user's method, as a jax.custom_vjp fwd's body would.
    inner_jvp = autodiff_jvp(
        run_full,
        who=who(layer, method),
        fix=(
            f"make {method} differentiable JAX code, or take the second derivative in reverse "
            "mode (jax.grad or jax.jacrev of a gradient), which uses backward again."
        ),
    )
    run_with_backward = twin_custom_vjp(
        run_full,
        fwd,
        bwd,
        inner_jvp=inner_jvp,
        name=f"{cls.__name__}.backward",
        error=LayerError,
    ).outer
    outputs, new_state = run_with_backward(learnables, states, consts, tuple(inputs), key)
    return outputs, new_state


def _spec(value):
    data = stripdims(value)
    return ct.Spec.of(data) if data is not None else None


def _none_like(tree):
    return jax.tree.map(lambda _: None, tree)


def _is_none_or_formatted(value) -> bool:
    return value is None or isinstance(value, FormattedArray)


def _add(a, b):
    """Sum of two cotangents where either may be ``None`` (zero) or float0 (no gradient)."""
    a, b = (None if _is_float0(v) else v for v in (a, b))
    if a is None:
        return b
    return a if b is None else a + b


def _is_float0(value) -> bool:
    data = value.data if isinstance(value, FormattedArray) else value
    return getattr(data, "dtype", None) == jax.dtypes.float0


def _instantiate(cotangent, fmt, spec):
    """A real array for a (possibly symbolic-zero) cotangent, formatted like its primal."""
    if isinstance(cotangent, FormattedArray):
        data = ct.instantiate(cotangent.data, spec)
        return dlarray(data, cotangent.format)
    data = ct.instantiate(cotangent, spec)
    return dlarray(data, fmt) if fmt is not None else data


def _check_input_gradient(grad, spec, fmt, required, owner, what):
    checked = ct.check_gradient(
        stripdims(grad) if grad is not None else None,
        spec,
        who=owner,
        what=what,
        required=required,
    )
    if checked is not None and fmt is not None:
        return dlarray(checked, fmt)
    return checked


def _check_state_gradient(grad, s, required, owner, what):
    if s is None:
        return None
    return ct.check_gradient(grad, ct.Spec.of(s), who=owner, what=what, required=required)
