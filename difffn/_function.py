r"""``DifferentiableFunction``: a custom operation with its own backward, on ``jax.custom_vjp``.

The class mirrors MATLAB's ``deep.DifferentiableFunction``: class attributes say how many outputs
there are and what the backward needs (inputs, outputs, memory values), ``forward`` computes the
outputs (and memory values), ``backward`` receives the output gradients, the
``compute_gradients`` flags, and whatever was saved, and returns one gradient per input.

How it maps onto JAX:

* one ``jax.custom_vjp(..., symbolic_zeros=True)`` per distinct configuration (instance
  attributes are static, hashable configuration; equal configurations share it);
* ``compute_gradients`` is the tuple of JAX's ``perturbed`` flags, known at trace time, so a
  gradient that no transformation asks for is never computed;
* the residuals are exactly the saved inputs, saved outputs and memory values;
* the gradients are checked at trace time (count, shape, dtype), and inside ``shard_map`` the
  cotangents of replicated inputs are summed over the mesh axes they were broadcast along;
* a class that defines ``jvp`` also supports forward mode (see ``_primitive.py``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from . import _cotangents as ct
from ._errors import DifferentiableFunctionError, ForwardError, ForwardModeError
from ._format import FormattedArray
from ._primitive import custom_vjp

_FORWARD_MODE_MESSAGES = ("forward-mode", "jvp")


class DifferentiableFunction:
    r"""Base class for a custom deep-learning operation with a hand-written backward.

    Subclasses set the class attributes below and define ``forward`` and ``backward``; an
    optional ``jvp`` adds forward-mode differentiation. Instances are static configuration:
    attributes set in ``__init__`` must be hashable, and two instances with equal attributes
    share compiled code.

    Attributes:
      num_outputs: number of primary outputs (memory values not counted).
      save_inputs_for_backward: pass the inputs to ``backward``.
      save_outputs_for_backward: pass the outputs to ``backward``.
      num_memory_values: number of extra values ``forward`` returns for ``backward`` only.

    ``forward(self, *X)`` returns ``Y`` (one output, no memory) or the tuple
    ``(Y1, ..., YM, mem1, ..., memK)``.

    ``backward(self, *dLdY, compute_gradients, *X, *Y, *memory)`` receives the output gradients,
    the tuple of ``compute_gradients`` flags (one Python bool per input), then the inputs if
    saved, the outputs if saved, and the memory values; it returns one gradient per input (a
    single array when there is one input), ``None`` where ``compute_gradients`` is ``False``.

    ``jvp(self, primals, tangents)`` (optional) returns ``(Y, dY)`` like a ``jax.custom_jvp``
    rule: the outputs and their tangents (tuples when ``num_outputs > 1``).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> class Scale(df.DifferentiableFunction):
      ...     save_inputs_for_backward = True
      ...     def forward(self, x, w):
      ...         return x * w
      ...     def backward(self, dy, compute_gradients, x, w):
      ...         dx = dy * w if compute_gradients[0] else None
      ...         dw = jnp.sum(dy * x) if compute_gradients[1] else None
      ...         return dx, dw
      >>> x, w = jnp.arange(3.0), jnp.array(2.0)
      >>> Scale()(x, w)
      Array([0., 2., 4.], dtype=float32)
      >>> jax.grad(lambda w: Scale()(x, w).sum())(w)   # dx is never computed here
      Array(3., dtype=float32)
    """

    num_outputs: ClassVar[int] = 1
    save_inputs_for_backward: ClassVar[bool] = False
    save_outputs_for_backward: ClassVar[bool] = False
    num_memory_values: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _check_class_attributes(cls)
        # Passing an instance through jit/tree utilities treats it as static configuration.
        jax.tree_util.register_static(cls)

    def forward(self, *inputs):
        raise NotImplementedError

    def backward(self, *args):
        raise NotImplementedError

    # -- configuration identity -------------------------------------------------------------

    def _config(self) -> tuple:
        items = []
        for name, value in sorted(vars(self).items()):
            try:
                hash(value)
            except TypeError:
                raise DifferentiableFunctionError(
                    f"{type(self).__name__} attribute {name!r} holds an unhashable "
                    f"{type(value).__name__}; instance attributes of a DifferentiableFunction "
                    "are static configuration and must be hashable so equal configurations can "
                    "share compiled code. Fix: use a tuple instead of a list, a string or number "
                    "instead of an array, or pass arrays as inputs to the call."
                ) from None
            items.append((name, type(value), value))
        return (type(self), tuple(items))

    def __hash__(self):
        return hash(self._config())

    def __eq__(self, other):
        if type(self) is not type(other):
            return NotImplemented
        return self._config() == other._config()

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()))
        return f"{type(self).__name__}({args})"

    # -- calling ---------------------------------------------------------------------------

    def __call__(self, *inputs, **kwargs):
        cls = type(self)
        if kwargs:
            raise DifferentiableFunctionError(
                f"{cls.__name__} was called with keyword arguments {sorted(kwargs)}; a "
                "DifferentiableFunction takes its inputs positionally, in forward's order "
                f"({', '.join(_input_names(cls, len(inputs)))}). Fix: pass them positionally and "
                "put configuration in the constructor."
            )
        _check_methods(cls)
        _check_arity(cls, len(inputs))
        arrays = tuple(_as_array(cls, i, x) for i, x in enumerate(inputs))
        implementation = _implementation(self, len(arrays))
        try:
            outputs = implementation(*arrays)
        except (TypeError, NotImplementedError) as error:
            message = str(error)
            if isinstance(error, ForwardModeError) or not all(
                m in message for m in _FORWARD_MODE_MESSAGES
            ):
                raise
            raise ForwardModeError(forward_mode_message(cls.__name__)) from error
        return outputs[0] if cls.num_outputs == 1 else tuple(outputs)


def forward_mode_message(class_name: str) -> str:
    return (
        f"{class_name} was differentiated in forward mode (jax.jvp, jax.jacfwd, jax.linearize "
        "or jax.hessian), but it defines only a reverse-mode backward. Fix: define "
        f"{class_name}.jvp(self, primals, tangents) returning (outputs, output_tangents), or use "
        "reverse mode (jax.grad, jax.vjp, jax.jacrev)."
    )


# -- class checks -----------------------------------------------------------------------------


def _check_class_attributes(cls) -> None:
    def bad(attr, expected):
        value = getattr(cls, attr)
        raise DifferentiableFunctionError(
            f"{cls.__name__}.{attr} is {value!r}; expected {expected}. Fix: set it as a class "
            f"attribute, e.g. `{attr} = {getattr(DifferentiableFunction, attr)!r}`."
        )

    n_out = cls.num_outputs
    if not isinstance(n_out, int) or isinstance(n_out, bool) or n_out < 1:
        bad("num_outputs", "a positive int")
    n_mem = cls.num_memory_values
    if not isinstance(n_mem, int) or isinstance(n_mem, bool) or n_mem < 0:
        bad("num_memory_values", "a non-negative int")
    for attr in ("save_inputs_for_backward", "save_outputs_for_backward"):
        if not isinstance(getattr(cls, attr), (bool, np.bool_)):
            bad(attr, "True or False")


@functools.cache
def _check_methods(cls) -> None:
    for method in ("forward", "backward"):
        if getattr(cls, method) is getattr(DifferentiableFunction, method):
            raise DifferentiableFunctionError(
                f"{cls.__name__} does not define {method}; a DifferentiableFunction needs both "
                f"forward and backward. Fix: add `def {method}(self, ...)` to {cls.__name__} "
                "(for automatic differentiation, use a plain function instead)."
            )


@functools.cache
def _forward_parameters(cls) -> tuple[tuple[str, ...], bool]:
    """Names of forward's positional inputs, and whether it takes ``*args``."""
    parameters = list(inspect.signature(cls.forward).parameters.values())[1:]
    names, variadic = [], False
    for p in parameters:
        if p.kind is p.VAR_POSITIONAL:
            variadic = True
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            names.append(p.name)
    return tuple(names), variadic


def _input_names(cls, count: int) -> tuple[str, ...]:
    names, _ = _forward_parameters(cls)
    return tuple(names[i] if i < len(names) else f"input{i + 1}" for i in range(count))


def _check_arity(cls, count: int) -> None:
    names, variadic = _forward_parameters(cls)
    if count == 0:
        raise DifferentiableFunctionError(
            f"{cls.__name__} was called with no inputs; expected at least one array."
        )
    if (count < len(names)) or (count > len(names) and not variadic):
        raise DifferentiableFunctionError(
            f"{cls.__name__} was called with {count} inputs; its forward takes {len(names)} "
            f"({', '.join(names)}). Fix: pass one array per forward input."
        )


def _as_array(cls, index: int, x) -> jax.Array:
    if isinstance(x, FormattedArray):
        return x.data  # MATLAB semantics: formats are stripped before forward.
    try:
        return jnp.asarray(x)
    except TypeError:
        raise DifferentiableFunctionError(
            f"{cls.__name__} input {index + 1} is a {type(x).__name__}; expected an array "
            "(jax/numpy array, df.FormattedArray or Python scalar). Fix: pass each input as one "
            "array; put non-array configuration in the constructor."
        ) from None


def what(cls, index: int, count: int) -> str:
    """``"the gradient of input 'tl' (2 of 5)"``, for messages."""
    return f"the gradient of input {_input_names(cls, count)[index]!r} ({index + 1} of {count})"


# -- forward / backward glue ------------------------------------------------------------------


def run_forward(fcn: DifferentiableFunction, xs: Sequence[jax.Array]):
    """Call the user's forward and split its result into (outputs, memory values)."""
    cls = type(fcn)
    n_out, n_mem = cls.num_outputs, cls.num_memory_values
    total = n_out + n_mem
    result = fcn.forward(*xs)
    if total == 1 and not isinstance(result, (tuple, list)):
        result = (result,)
    if not isinstance(result, (tuple, list)) or len(result) != total:
        if isinstance(result, (tuple, list)):
            got = f"{len(result)} values"
        elif isinstance(result, (jax.Array, np.ndarray)):
            got = "a single array"
        else:
            got = f"a single {type(result).__name__}"
        raise ForwardError(
            f"{cls.__name__}.forward returned {got}; expected {total} values "
            f"(num_outputs={n_out} outputs, then num_memory_values={n_mem} memory values). "
            "Fix: return exactly that many, or change the class attributes."
        )
    outputs = []
    for i, y in enumerate(result[:n_out]):
        if isinstance(y, FormattedArray):
            y = y.data
        if not isinstance(y, (jax.Array, np.ndarray, np.generic, int, float, complex)):
            raise ForwardError(
                f"{cls.__name__}.forward output {i + 1} is a {type(y).__name__}; expected an "
                "array. Fix: return arrays (outputs come back as plain arrays)."
            )
        outputs.append(jnp.asarray(y))
    memory = tuple(result[n_out:])
    for i, m in enumerate(memory):
        for leaf in jax.tree.leaves(m):
            if not isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
                raise ForwardError(
                    f"{cls.__name__}.forward memory value {i + 1} contains a "
                    f"{type(leaf).__name__}; memory values must be arrays (or pytrees of "
                    "arrays) because they become JAX residuals. Fix: keep Python values as "
                    "attributes set in the constructor."
                )
    return tuple(outputs), memory


def make_residuals(fcn, xs, outputs, memory, compute_gradients):
    """Exactly what the class asks to save, plus static bookkeeping (no arrays)."""
    cls = type(fcn)
    saved_inputs = tuple(xs) if cls.save_inputs_for_backward else ()
    saved_outputs = tuple(outputs) if cls.save_outputs_for_backward else ()
    static = ct.Static(
        (
            tuple(compute_gradients),
            tuple(ct.Spec.of(x) for x in xs),
            tuple(ct.Spec.of(y) for y in outputs),
        )
    )
    return saved_inputs, saved_outputs, memory, static


def run_backward(fcn, residuals, output_cotangents):
    """Call the user's backward with MATLAB's argument order and check what it returns."""
    cls = type(fcn)
    saved_inputs, saved_outputs, memory, static = residuals
    compute_gradients, in_specs, out_specs = static.value
    n_in = len(in_specs)
    if all(ct.is_symbolic_zero(c) for c in output_cotangents) or not any(compute_gradients):
        return (None,) * n_in
    cotangents = tuple(ct.instantiate(c, s) for c, s in zip(output_cotangents, out_specs))
    result = fcn.backward(*cotangents, compute_gradients, *saved_inputs, *saved_outputs, *memory)
    who = f"{cls.__name__}.backward"
    grads = ct.normalize_returns(result, n_in, who=who, names=_input_names(cls, n_in))
    return tuple(
        ct.check_gradient(g, spec, who=who, what=what(cls, i, n_in), required=required)
        for i, (g, spec, required) in enumerate(zip(grads, in_specs, compute_gradients))
    )


# -- the custom_vjp per configuration -----------------------------------------------------------


def _has_jvp(cls) -> bool:
    return callable(getattr(cls, "jvp", None))


@functools.lru_cache(maxsize=512)
def _implementation(fcn: DifferentiableFunction, num_inputs: int):
    """One differentiable callable per (configuration, input count), shared by equal instances."""
    del num_inputs  # part of the cache key: a variadic forward gets one rule per arity

    def call(*xs):
        return run_forward(fcn, xs)[0]

    def fwd(*primals):
        xs = tuple(p.value for p in primals)
        compute_gradients = tuple(bool(p.perturbed) for p in primals)
        outputs, memory = run_forward(fcn, xs)
        return outputs, make_residuals(fcn, xs, outputs, memory, compute_gradients)

    def bwd(residuals, output_cotangents):
        return run_backward(fcn, residuals, tuple(output_cotangents))

    jvp = functools.partial(run_jvp, fcn) if _has_jvp(type(fcn)) else None
    return custom_vjp(call, fwd, bwd, jvp=jvp, name=type(fcn).__name__)


def run_jvp(fcn: DifferentiableFunction, primals, tangents):
    """Call the user's ``jvp`` (tangents of unperturbed inputs are zeros) and check it."""
    cls = type(fcn)
    specs = [ct.Spec.of(x) for x in primals]
    tangents = tuple(
        None if not spec.differentiable else ct.instantiate(t, spec)
        for t, spec in zip(tangents, specs)
    )
    result = fcn.jvp(tuple(primals), tangents)
    who = f"{cls.__name__}.jvp"
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise DifferentiableFunctionError(
            f"{who} returned {type(result).__name__}; expected a pair (outputs, "
            "output_tangents), like a jax.custom_jvp rule."
        )
    outputs, out_tangents = result
    n_out = cls.num_outputs
    if n_out == 1:
        outputs, out_tangents = (outputs,), (out_tangents,)
    names = [f"output{i + 1}" for i in range(n_out)]
    outputs = tuple(
        jnp.asarray(y) for y in ct.normalize_returns(outputs, n_out, who=who, names=names)
    )
    out_tangents = ct.normalize_returns(out_tangents, n_out, who=who, names=names)
    checked = []
    for i, (t, y) in enumerate(zip(out_tangents, outputs)):
        spec = ct.Spec.of(y)
        t = jnp.zeros(spec.shape, spec.dtype) if t is None else t
        checked.append(
            ct.check_gradient(
                t, spec, who=who, what=f"the tangent of output {i + 1}", required=True
            )
        )
    return outputs, tuple(checked)
