r"""How a ``DifferentiableFunction`` becomes one JAX operation: primal, fwd, bwd, jvp and vmap.

One ``Operation`` per (configuration, input structure), built by ``_twin.twin_custom_vjp`` over
the flat leaves of the inputs (so user pytree types never see JAX's perturbation records):

* the **primal** runs ``forward`` and returns the outputs' leaves, with their structure carried
  as static pytree structure (``Static``), plus the memory values (array leaves as values, other
  leaves — a Python ``int``, a string — as static structure);
* **fwd calls the operation itself** (JAX's recommended pattern), so the outputs an outer
  derivative sees carry the user's rules: ``jax.grad`` of a ``value_and_grad`` value, or
  grad-of-grad, uses ``backward`` (or ``jvp``) again instead of differentiating ``forward``'s
  body. The memory values, like the residuals a ``jax.custom_vjp`` fwd computes, are
  differentiated by autodiff of ``forward``: an operation that returns memory has an *inner*
  twin that also returns its memory values, whose backward adds that derivative (it keeps the
  inputs for it, but only exists under an outer derivative, so first-order residuals stay
  exactly what the class saves);
* the residuals are exactly the saved inputs, saved outputs and memory values, and the
  ``compute_gradients`` flags are JAX's perturbed flags per leaf (``symbolic_zeros=True``:
  ``optimize_remat`` cannot be combined with it, and under ``jax.checkpoint`` the forward
  already runs no more often than a ``jax.custom_vjp(..., optimize_remat=True)``, as the tests
  count, because ``forward`` is both the primal and the fwd);
* **bwd** hands ``backward`` real arrays (zeros where an output's gradient is symbolically zero,
  or ``None`` when ``materialize_zero_gradients = False``), Python scalar cotangents converted,
  and checks every gradient leaf against its input (structure, shape, dtype, with the pytree
  path); ``None`` is zero, as in JAX;
* ``once_differentiable`` runs ``backward`` on stopped values behind a guard whose derivative
  raises ``HigherOrderError``;
* an optional ``jvp`` method gives forward mode and ``jax.linearize``; an optional ``vmap``
  method becomes a ``jax.custom_batching.custom_vmap`` rule of the primal (inside the
  ``custom_vjp``, as JAX requires), so batching uses it while gradients still use ``backward``.
"""

from __future__ import annotations

import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .._core import (
    BackwardError,
    DifferentiableFunctionError,
    FormattedArray,
    ForwardError,
    ForwardModeError,
    is_array,
)
from .._core import user_code as _user_code
from . import _cotangents as ct
from ._primitive import once_differentiable_guard
from ._twin import twin_custom_vjp

_MAX_OPERATIONS_PER_CLASS = 256


@dataclasses.dataclass(frozen=True)
class Flags:
    """The class flags of one instance (class attributes, or per-instance values)."""

    num_outputs: int
    save_inputs: bool
    save_outputs: bool
    num_memory: int
    materialize_zero_gradients: bool
    once_differentiable: bool
    jvp_from_forward: bool = False


_FLAG_ATTRIBUTES = {
    "num_outputs": "a positive int",
    "num_memory_values": "a non-negative int",
    "save_inputs_for_backward": "True or False",
    "save_outputs_for_backward": "True or False",
    "materialize_zero_gradients": "True or False",
    "once_differentiable": "True or False",
    "jvp_from_forward": "True or False",
}


def check_flag(owner: str, attr: str, value, default) -> None:
    """Raise ``DifferentiableFunctionError`` if ``value`` is not valid for class flag ``attr``."""
    if attr in ("num_outputs", "num_memory_values"):
        low = 1 if attr == "num_outputs" else 0
        valid = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        valid = valid and value >= low
    else:
        valid = isinstance(value, (bool, np.bool_))
    if not valid:
        raise DifferentiableFunctionError(
            f"{owner}.{attr} is {value!r}; expected {_FLAG_ATTRIBUTES[attr]}. Fix: set it as a "
            f"class attribute (or in __init__), e.g. `{attr} = {default!r}`."
        )


def flags_of(fcn) -> Flags:
    """The validated flags of ``fcn`` (instance attributes override class attributes)."""
    own = vars(fcn)
    for attr in _FLAG_ATTRIBUTES:
        if attr in own:
            check_flag(type(fcn).__name__, attr, own[attr], getattr(type(fcn), attr))
    return flags_of_class(fcn)


def flags_of_class(owner) -> Flags:
    """The flags as ``owner`` (a class, or an instance) has them."""
    return Flags(
        int(owner.num_outputs),
        bool(owner.save_inputs_for_backward),
        bool(owner.save_outputs_for_backward),
        int(owner.num_memory_values),
        bool(owner.materialize_zero_gradients),
        bool(owner.once_differentiable),
        bool(owner.jvp_from_forward),
    )


# -- values -----------------------------------------------------------------------------------


def _is_formatted(value) -> bool:
    return isinstance(value, FormattedArray)


def _as_array(value):
    """A jax array for an array-like leaf, or ``None`` if it is not one."""
    if isinstance(value, FormattedArray):
        value = value.data  # MATLAB semantics: formats are stripped
    if isinstance(value, jax.Array):
        return value  # tracers and typed PRNG keys included
    if is_array(value) or isinstance(value, (bool, int, float, complex)):
        return jnp.asarray(value)
    return None


def prepare_input(cls_name: str, name: str, index: int, count: int, value):
    """One input with formats stripped and array-like leaves as jax arrays; raises otherwise."""
    leaves, tree = jax.tree_util.tree_flatten_with_path(value, is_leaf=_is_formatted)
    arrays = []
    for path, leaf in leaves:
        array = _as_array(leaf)
        if array is None:
            where = ct.path_text(path) or ""
            raise DifferentiableFunctionError(
                f"{cls_name} input {name!r} ({index + 1} of {count}){where} is a "
                f"{type(leaf).__name__}; expected an array (jax/numpy array, df.FormattedArray "
                "or Python scalar) or a pytree of them (tuple, list, dict, NamedTuple, "
                "registered dataclass; None for an absent optional input). Fix: put non-array "
                "configuration in the constructor."
            )
        arrays.append(array)
    return jax.tree.unflatten(tree, arrays)


def differentiable(value) -> bool:
    return bool(jnp.issubdtype(jax.typeof(value).dtype, jnp.inexact))


# -- forward ----------------------------------------------------------------------------------


def split_forward_result(fcn, flags: Flags, result, who: str):
    """``forward``'s (or ``vmap``'s) return value as (outputs tuple, memory tuple)."""
    n_out, n_mem = flags.num_outputs, flags.num_memory
    total = n_out + n_mem
    if result is None:
        raise ForwardError(
            f"{who} returned None; expected {total} value(s) (num_outputs={n_out} outputs, then "
            f"num_memory_values={n_mem} memory values). Fix: add the missing `return`."
        )
    if total == 1:
        # One value: it is the output, whatever its structure; a bare 1-tuple is unwrapped
        # (as before pytree outputs existed).
        single = type(result) in (tuple, list) and len(result) == 1
        return ((result[0] if single else result),), ()
    if type(result) not in (tuple, list) or len(result) != total:
        if isinstance(result, (tuple, list)):
            got = f"{len(result)} values"
        elif is_array(result):
            got = "a single array"
        else:
            got = f"a single {type(result).__name__}"
        raise ForwardError(
            f"{who} returned {got}; expected {total} values (num_outputs={n_out} outputs, then "
            f"num_memory_values={n_mem} memory values). Fix: return exactly that many, or "
            "change the class attributes."
        )
    return tuple(result[:n_out]), tuple(result[n_out:])


def check_outputs(outputs, who: str) -> tuple:
    """Each output as a pytree of jax arrays (formats stripped); raises for a non-array leaf."""
    checked = []
    for i, y in enumerate(outputs):
        leaves, tree = jax.tree_util.tree_flatten_with_path(y, is_leaf=_is_formatted)
        arrays = []
        for path, leaf in leaves:
            array = _as_array(leaf)
            if array is None:
                raise ForwardError(
                    f"{who} output {i + 1}{ct.path_text(path)} is a {type(leaf).__name__}; "
                    "expected an array (or a pytree of arrays). Fix: return arrays (outputs come "
                    "back as plain arrays)."
                )
            arrays.append(array)
        checked.append(jax.tree.unflatten(tree, arrays))
    return tuple(checked)


def run_forward(fcn, xs):
    """Call the user's forward on ``xs`` and split its result into (outputs, memory values)."""
    flags = flags_of(fcn)
    who = f"{type(fcn).__name__}.forward"
    outputs, memory = split_forward_result(fcn, flags, user_call(fcn, "forward", *xs), who)
    return check_outputs(outputs, who), memory


def user_call(fcn, method: str, *args):
    """``fcn.method(*args)``: Python control flow on traced values in it is named, with the fix
    (``_user_code``)."""
    return _user_code.call(
        getattr(fcn, method),
        *args,
        what=f"{type(fcn).__name__}.{method}",
        fix=(
            f"{_user_code.TRACEABLE_FIX} (a DifferentiableFunction is traced under jax.jit, "
            "inside networks and trainnet: its methods must be traceable)"
        ),
    )


# -- the operation ----------------------------------------------------------------------------


def operation(
    fcn, flags: Flags, in_tree, names: tuple[str, ...], given: tuple[bool, ...] | None = None
) -> Operation:
    """The shared ``Operation`` for this configuration and input structure (cached on the class,
    so it goes away with the class)."""
    cache = type(fcn).__dict__["_difffn_operations"]
    given = (True,) * len(names) if given is None else given
    config = fcn._config()
    key = (config, in_tree, given)
    op = cache.get(key)
    if op is None:
        if len(cache) >= _MAX_OPERATIONS_PER_CLASS:
            cache.pop(next(iter(cache)))
        constants = None
        if config[2]:  # array attributes: the operation keeps a template without them
            names_ = tuple(name for name, _, _ in config[2])
            template = copy.copy(fcn)
            for name in names_:
                vars(template)[name] = None
            values = tuple(vars(fcn)[n] for n in names_)
            labels = tuple(
                f"{names_[path[0].idx]!r}{ct.path_text(path[1:])}"
                for path, _ in jax.tree_util.tree_flatten_with_path(values)[0]
            )
            constants = (names_, jax.tree.structure(values), labels)
            fcn = template
        op = cache[key] = Operation(fcn, flags, in_tree, names, given, constants)
    return op


class Operation:
    """``outer(*leaves)`` computes the outputs; see the module docstring for the rules."""

    def __init__(self, fcn, flags: Flags, in_tree, names, given=None, constants=None):
        self.fcn, self.flags, self.in_tree, self.names = fcn, flags, in_tree, names
        # Array-valued attributes: (names, pytree structure) of the constants that follow the
        # inputs' leaves; ``fcn`` is then a template without them (see ``instance``).
        self.constants = constants
        self.n_x = in_tree.num_leaves
        self.given = (True,) * len(names) if given is None else tuple(given)
        cls = type(fcn)
        self.cls_name = cls.__name__
        self.n_in = len(names)
        primal = self._primal
        if callable(getattr(cls, "vmap", None)):
            primal = jax.custom_batching.custom_vmap(self._primal)
            primal.def_vmap(self._vmap_rule)
        self.primal = primal
        has_jvp = callable(getattr(cls, "jvp", None))
        if has_jvp and flags.jvp_from_forward:
            raise DifferentiableFunctionError(
                f"{self.cls_name} defines jvp and sets jvp_from_forward = True; forward mode "
                "takes one rule. Fix: remove jvp (forward is then differentiated by autodiff in "
                "forward mode) or set jvp_from_forward = False (jvp is used)."
            )
        jvp = self._jvp if has_jvp else (self._autodiff_jvp if flags.jvp_from_forward else None)
        twin = twin_custom_vjp(
            self.primal,
            lambda inner, call_inner, *p: self._fwd(inner, call_inner, p),
            self._bwd,
            memory=bool(flags.num_memory),
            jvp=jvp,
            inner_jvp=jvp or self._autodiff_jvp,
            name=self.cls_name,
            forward_mode_message=forward_mode_message(self.cls_name),
        )
        self.outer, self.inner = twin

    # -- primal --

    def inputs(self, leaves):
        return jax.tree.unflatten(self.in_tree, list(leaves[: self.n_x]))

    def instance(self, leaves):
        """The user's object, with its array attributes from the constants among ``leaves``."""
        if self.constants is None:
            return self.fcn
        names, tree, _ = self.constants
        fcn = copy.copy(self.fcn)
        vars(fcn).update(zip(names, jax.tree.unflatten(tree, list(leaves[self.n_x :]))))
        return fcn

    def _check_constants(self, perturbed, what: str) -> None:
        """A differentiated array attribute is an error, as JAX's custom_vjp refuses a
        derivative with respect to a closed-over value."""
        if self.constants is None or not any(perturbed[self.n_x :]):
            return
        labels = self.constants[2]
        k = [i for i, p in enumerate(perturbed[self.n_x :]) if p][0]
        raise DifferentiableFunctionError(
            f"{self.cls_name} attribute {labels[k]} was differentiated ({what}); an "
            "array attribute is a constant of the operation, never differentiated, as a value "
            "a jax.custom_vjp closes over is. Fix: pass it as an input of the call, so that "
            "backward returns its gradient."
        )

    def _primal(self, *leaves):
        who = f"{self.cls_name}.forward"
        fcn = self.instance(leaves)
        result = user_call(fcn, "forward", *self.inputs(leaves))
        outputs, memory = split_forward_result(fcn, self.flags, result, who)
        return self._pack(check_outputs(outputs, who), memory, who)

    def _pack(self, outputs, memory, who):
        out_leaves, out_tree = jax.tree.flatten(outputs)
        mem_static, mem_arrays = ct.split_memory(memory, who)
        return ct.Static(out_tree), tuple(out_leaves), mem_static, mem_arrays

    def _vmap_rule(self, axis_size, in_batched, *leaves):
        who = f"{self.cls_name}.vmap"
        batched = self.inputs(in_batched)
        result = user_call(self.instance(leaves), "vmap", axis_size, batched, *self.inputs(leaves))
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise ForwardError(
                f"{who} returned a {type(result).__name__}; expected a pair (outputs, "
                "out_batched), like a jax.custom_batching.custom_vmap rule: what forward "
                "returns, for the whole batch, and a bool (or a pytree of bools) per output "
                "saying whether it has the batch axis in front."
            )
        values, out_batched = result
        outputs, memory = split_forward_result(self.fcn, self.flags, values, who)
        flags_out, flags_mem = split_forward_result(self.fcn, self.flags, out_batched, who)
        packed = self._pack(check_outputs(outputs, who), memory, who)
        batched_outputs = [
            leaf
            for flag, y in zip(flags_out, outputs)
            for leaf in _broadcast_flag(flag, y, who, "output")
        ]
        batched_memory = [
            leaf
            for flag, m in zip(flags_mem, memory)
            for leaf in _broadcast_flag(flag, ct.split_memory(m, who)[1], who, "memory value")
        ]
        return packed, (packed[0], tuple(batched_outputs), packed[2], tuple(batched_memory))

    # -- reverse mode --

    def _fwd(self, inner: bool, call_inner, primals):
        leaves = tuple(p.value for p in primals)
        perturbed = tuple(bool(p.perturbed) and differentiable(x) for p, x in zip(primals, leaves))
        self._check_constants(perturbed, "reverse mode")
        packed = call_inner(*leaves)  # the operation itself: outer derivatives see its rules
        out_tree, out_leaves = packed[0], packed[1]
        mem_static, mem_arrays = (packed[2], packed[3]) if self.flags.num_memory else (None, ())
        flags = self.flags
        saved_inputs = leaves if flags.save_inputs else ()
        # Only the inner twin (which exists only under an outer derivative) keeps the inputs for
        # the autodiff derivative of the memory values.
        extra_inputs = leaves if inner and mem_arrays and not flags.save_inputs else ()
        static = ct.Static(
            (
                perturbed,
                tuple(ct.Spec.of(x) for x in leaves),
                tuple(ct.Spec.of(y) for y in out_leaves),
                out_tree.value,
                mem_static,
            )
        )
        residuals = (
            saved_inputs,
            tuple(out_leaves) if flags.save_outputs else (),
            mem_arrays,
            extra_inputs,
            static,
            leaves[self.n_x :],
        )
        return packed, residuals

    def _bwd(self, inner: bool, residuals, cotangents):
        saved_inputs, saved_outputs, mem_arrays, extra_inputs, static, _ = residuals
        perturbed, in_specs, out_specs, out_tree, mem_static = static.value
        grads = [None] * len(in_specs)
        if not any(perturbed):
            return tuple(grads)
        out_cts = [
            c if spec.differentiable else None
            for c, spec in zip(cotangents[1], out_specs, strict=True)
        ]
        if any(c is not None and not ct.is_symbolic_zero(c) for c in out_cts):
            grads = self._user_backward(
                residuals, out_cts, perturbed, in_specs, out_specs, out_tree, mem_static
            )
        if inner and mem_arrays:
            mem_cts = list(cotangents[3])
            if any(not ct.is_symbolic_zero(c) for c in mem_cts):
                leaves = saved_inputs or extra_inputs
                extra = self._memory_vjp(leaves, mem_arrays, mem_cts, perturbed)
                grads = [
                    e if g is None else (g if e is None else g + e) for g, e in zip(grads, extra)
                ]
        return tuple(grads)

    def _user_backward(self, residuals, out_cts, perturbed, in_specs, out_specs, out_tree, mem):
        saved_inputs, saved_outputs, mem_arrays, _, _, constants = residuals
        flags = self.flags
        fcn = self.instance((None,) * self.n_x + tuple(constants))
        dys = [
            _cotangent(c, spec, flags.materialize_zero_gradients)
            for c, spec in zip(out_cts, out_specs)
        ]
        depends_on = [d for d in dys if d is not None] + list(saved_inputs) + list(saved_outputs)
        depends_on += list(mem_arrays)
        if flags.once_differentiable:
            stop = jax.lax.stop_gradient
            dys = [None if d is None else stop(d) for d in dys]
            saved_inputs, saved_outputs, mem_arrays = (
                tuple(map(stop, v)) for v in (saved_inputs, saved_outputs, mem_arrays)
            )
        outputs_ct = jax.tree.unflatten(out_tree, dys)
        if not flags.materialize_zero_gradients:
            outputs_ct = tuple(
                None if all(v is None for v in jax.tree.leaves(y, is_leaf=_is_none)) else y
                for y in outputs_ct
            )
        compute_gradients = self.inputs(perturbed)
        args = [*outputs_ct, compute_gradients]
        if flags.save_inputs:
            args += self.inputs(saved_inputs)
        if flags.save_outputs:
            args += jax.tree.unflatten(out_tree, list(saved_outputs))
        if flags.num_memory:
            args += ct.join_memory(mem, mem_arrays)
        result = user_call(fcn, "backward", *args)
        grads = self._check_gradients(result, perturbed, in_specs)
        grads += [None] * (len(in_specs) - len(grads))  # the constants' (never differentiated)
        if flags.once_differentiable:
            present = [g for g in grads if g is not None]
            guarded = iter(once_differentiable_guard(present, depends_on, self._once_message()))
            grads = [None if g is None else next(guarded) for g in grads]
        return grads

    def _check_gradients(self, result, perturbed, in_specs) -> list:
        who = f"{self.cls_name}.backward"
        templates = self.inputs(in_specs)
        if self.n_in == 1 and _is_wrapped_single(result, templates[0]):
            result = (result[0],)
        elif self.n_in == 1:
            result = (result,)
        grads = self._per_parameter(result, who)
        flat_required = iter(perturbed)
        checked = []
        for i, (g, template) in enumerate(zip(grads, templates)):
            what = describe_input(self.names, i)
            aligned = ct.align_leaves(g, template, who=who, what=f"the gradient of {what}")
            paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(template)[0]]
            for path, leaf, spec in zip(paths, aligned, jax.tree.leaves(template)):
                checked.append(
                    ct.check_gradient(
                        leaf,
                        spec,
                        who=who,
                        what=f"the gradient of {what}{ct.path_text(path)}",
                        required=next(flat_required),
                        none_means_zero=True,
                    )
                )
        return checked

    def _per_parameter(self, result, who: str) -> tuple:
        """One gradient per parameter of ``forward``: with optional inputs left out, a backward
        may also return one per input given (PyTorch's rule); ``None`` fills the others."""
        given = [n for n, g in zip(self.names, self.given) if g]
        if all(self.given) or not isinstance(result, (tuple, list)):
            return ct.normalize_returns(result, self.n_in, who=who, names=self.names)
        if len(result) == len(given) and len(result) != self.n_in:
            it = iter(result)
            return tuple(next(it) if g else None for g in self.given)
        if len(result) == self.n_in:
            return tuple(result)
        raise BackwardError(
            f"{who} returned {len(result)} gradients; expected either {self.n_in}, one per "
            f"parameter of forward ({', '.join(self.names)}; None for the left-out "
            f"{', '.join(n for n, g in zip(self.names, self.given) if not g)}), or "
            f"{len(given)}, one per input given ({', '.join(given)}). Fix: return one of "
            "these forms, None where a gradient is not needed."
        )

    def _memory_of(self, leaves, chosen):
        """The memory values' arrays as a function of the leaves at positions ``chosen``."""

        def memory_of(*values):
            full = list(leaves)
            for i, v in zip(chosen, values):
                full[i] = v
            who = f"{self.cls_name}.forward"
            fcn = self.instance(full)
            result = user_call(fcn, "forward", *self.inputs(full))
            return ct.split_memory(split_forward_result(fcn, self.flags, result, who)[1], who)[1]

        return memory_of

    def _memory_vjp(self, leaves, mem_arrays, mem_cts, perturbed) -> list:
        """Autodiff of ``forward``'s memory values (needed only at second order and above)."""
        chosen = [i for i, p in enumerate(perturbed) if p]
        _, vjp = jax.vjp(self._memory_of(leaves, chosen), *(leaves[i] for i in chosen))
        cts = tuple(ct.instantiate(c, ct.Spec.of(m)) for c, m in zip(mem_cts, mem_arrays))
        grads = [None] * len(leaves)
        for i, g in zip(chosen, vjp(cts)):
            grads[i] = g
        return grads

    def _once_message(self) -> str:
        return (
            f"{self.cls_name} is once_differentiable, but its backward was differentiated (a "
            "second-order derivative: grad of grad, jax.hessian, jvp of grad, ...). Fix: set "
            f"once_differentiable = False in {self.cls_name} if its backward is differentiable "
            "JAX code, or differentiate only once."
        )

    # -- forward mode --

    def _jvp(self, inner: bool, primals, tangents, out_avals):
        who = f"{self.cls_name}.jvp"
        ts = [
            None if not differentiable(x) else ct.instantiate(t, ct.Spec.of(x))
            for x, t in zip(primals, tangents)
        ]
        self._check_constants(_nonzero(primals, tangents), "forward mode")
        result = user_call(self.instance(primals), "jvp", self.inputs(primals), self.inputs(ts))
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise DifferentiableFunctionError(
                f"{who} returned {type(result).__name__}; expected a pair (outputs, "
                "output_tangents), like a jax.custom_jvp rule."
            )
        _, out_tangents = result
        if self.flags.num_outputs == 1:
            out_tangents = (out_tangents,)
        names = [f"output{i + 1}" for i in range(self.flags.num_outputs)]
        out_tangents = ct.normalize_returns(out_tangents, len(names), who=who, names=names)
        out_tree = out_avals[0].value
        templates = jax.tree.unflatten(out_tree, list(out_avals[1]))
        leaves = []
        for i, (t, template) in enumerate(zip(out_tangents, templates)):
            aligned = ct.align_leaves(t, template, who=who, what=f"the tangent of output {i + 1}")
            paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(template)[0]]
            for path, leaf, aval in zip(paths, aligned, jax.tree.leaves(template)):
                leaves.append(_tangent(leaf, aval, who, f"the tangent of output {i + 1}", path))
        if not inner or not self.flags.num_memory:
            return out_avals[0], tuple(leaves)
        mem_tangents = self._memory_jvp(primals, ts)
        return out_avals[0], tuple(leaves), out_avals[2], mem_tangents

    def _autodiff_jvp(self, inner: bool, primals, tangents, out_avals):
        """Forward mode by autodiff of ``forward`` (``jvp_from_forward``; and, for the outputs a
        fwd rule computes, under an outer forward mode: as a ``jax.custom_vjp`` fwd's body)."""
        self._check_constants(_nonzero(primals, tangents), "forward mode")
        ts = [
            None if not differentiable(x) else ct.instantiate(t, ct.Spec.of(x))
            for x, t in zip(primals, tangents)
        ]
        chosen = [i for i, t in enumerate(ts[: self.n_x]) if t is not None]

        def outputs_of(*values):
            full = list(primals)
            for i, v in zip(chosen, values):
                full[i] = v
            packed = self._primal(*full)
            return packed[1], packed[3]

        try:
            _, (out_t, mem_t) = jax.jvp(
                outputs_of, [primals[i] for i in chosen], [ts[i] for i in chosen]
            )
        except DifferentiableFunctionError:
            raise
        except Exception as error:  # JAX's own error about forward's body
            needs = (
                "jvp_from_forward = True"
                if self.flags.jvp_from_forward
                else ("forward-over-reverse (jax.hessian, jax.jvp of a gradient)")
            )
            raise ForwardModeError(
                f"{self.cls_name}.forward could not be differentiated in forward mode, which "
                f"{needs} "
                f"needs: {type(error).__name__}: {error}. Fix: define "
                f"{self.cls_name}.jvp(self, primals, tangents), or make forward differentiable "
                "JAX code."
            ) from error
        leaves = tuple(
            _tangent(t, aval, f"{self.cls_name}.forward", "the tangent of an output", ())
            for t, aval in zip(out_t, out_avals[1])
        )
        if not inner or not self.flags.num_memory:
            return out_avals[0], leaves
        return out_avals[0], leaves, out_avals[2], tuple(mem_t)

    def _memory_jvp(self, primals, tangents):
        chosen = [i for i, t in enumerate(tangents) if t is not None]
        memory_of = self._memory_of(primals, chosen)
        return jax.jvp(memory_of, [primals[i] for i in chosen], [tangents[i] for i in chosen])[1]


def _nonzero(primals, tangents) -> list[bool]:
    return [
        differentiable(x) and t is not None and not ct.is_symbolic_zero(t)
        for x, t in zip(primals, tangents)
    ]


def _is_none(value) -> bool:
    return value is None


def _is_wrapped_single(result, template) -> bool:
    """A one-input backward returned ``(g,)`` (not a gradient that is itself a 1-sequence)."""
    if type(result) not in (tuple, list) or len(result) != 1:
        return False
    return not (isinstance(template, (tuple, list)) and len(template) == 1)


def _cotangent(c, spec: ct.Spec, materialize: bool):
    if c is None:
        return None
    if ct.is_symbolic_zero(c):
        return jnp.zeros(spec.shape, spec.dtype) if materialize else None
    if not isinstance(c, jax.Array):
        return jnp.asarray(c, spec.dtype)  # e.g. jax.vjp(f, x)[1](7.0): a Python float
    return c


def _tangent(t, aval, who: str, what: str, path):
    spec = ct.Spec(tuple(aval.shape), aval.dtype, ct.varying_axes(aval))
    if not spec.differentiable:
        return np.zeros(spec.shape, jax.dtypes.float0)
    if t is None:
        return jnp.zeros(spec.shape, spec.dtype)
    checked = ct.check_gradient(t, spec, who=who, what=f"{what}{ct.path_text(path)}", required=True)
    return checked


def _broadcast_flag(flag, value, who: str, kind: str) -> list[bool]:
    """A ``vmap`` rule's batched flag for one output: a bool, or a pytree of bools like it."""
    count = len(jax.tree.leaves(value))
    if isinstance(flag, (bool, np.bool_)):
        return [bool(flag)] * count
    flags = jax.tree.leaves(flag)
    if len(flags) != count or not all(isinstance(f, (bool, np.bool_)) for f in flags):
        raise ForwardError(
            f"{who} returned out_batched {flag!r} for a {kind} with {count} array leaves; "
            "expected a bool or a pytree of bools with the same structure."
        )
    return [bool(f) for f in flags]


def describe_input(names, index: int) -> str:
    """``"input 'tl' (2 of 5)"``, for messages."""
    return f"input {names[index]!r} ({index + 1} of {len(names)})"


def forward_mode_message(class_name: str) -> str:
    return (
        f"{class_name} was differentiated in forward mode (jax.jvp, jax.jacfwd, jax.linearize "
        "or jax.jacrev of jax.jacfwd), but it defines only a reverse-mode backward. Fix: define "
        f"{class_name}.jvp(self, primals, tangents) returning (outputs, output_tangents), set "
        f"jvp_from_forward = True in {class_name} to differentiate forward by autodiff there, or "
        "use reverse mode (jax.grad, jax.vjp, jax.jacrev, and jax.hessian, which differentiates "
        "backward in forward mode)."
    )
