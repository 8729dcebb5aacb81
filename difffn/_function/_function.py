r"""``DifferentiableFunction``: a custom operation with its own backward, on ``jax.custom_vjp``.

The class mirrors MATLAB's ``deep.DifferentiableFunction``: class attributes say how many outputs
there are and what the backward needs (inputs, outputs, memory values), ``forward`` computes the
outputs (and memory values), ``backward`` receives the output gradients, the
``compute_gradients`` flags, and whatever was saved, and returns one gradient per input.

This module is the user-facing class: its flags, its signature checks (a backward whose arity
does not fit the flags is named at class definition, or at the first call when flags are set
per instance) and the call. How a call becomes one JAX operation (``custom_vjp`` rules, second
order, ``jvp``, ``vmap``, pytrees) is ``_function_rules.py``.

Classes are static configuration: ``jax.tree_util.register_static`` makes an instance a jit
argument. JAX's pytree registry keeps what it registers forever, so a class defined inside a
function (``<locals>`` in its qualified name) is not registered: it is freed with its captured
values once dropped (pass such an instance by closure or as a static argument). Every other
per-class cache lives on the class itself, and signatures come from ``_signatures.py`` (a weak
memo).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from .._core import DifferentiableFunctionError, positional
from . import _function_rules as rules
from ._function_rules import forward_mode_message, run_forward

__all__ = ["DifferentiableFunction", "forward_mode_message", "run_forward"]


class DifferentiableFunction:
    r"""Base class for a custom deep-learning operation with a hand-written backward.

    Subclasses set the class attributes below and define ``forward`` and ``backward``; an
    optional ``jvp`` adds forward-mode differentiation and an optional ``vmap`` a batching rule.
    Instances are static configuration: hashable attributes set in ``__init__`` are
    configuration, and two instances with equal ones share compiled code; an attribute holding
    arrays (a pytree of them, traced values included) is a constant of the operation, never
    differentiated (like a value a ``jax.custom_vjp`` closes over).

    Attributes:
      num_outputs: number of primary outputs (memory values not counted).
      save_inputs_for_backward: pass the inputs to ``backward``.
      save_outputs_for_backward: pass the outputs to ``backward``.
      num_memory_values: number of extra values ``forward`` returns for ``backward`` only.
      materialize_zero_gradients: ``True`` (default): the gradient of an output that does not
        reach the loss arrives as zeros; ``False``: as ``None`` (skip that work).
      once_differentiable: ``True``: differentiating ``backward`` (a second-order derivative)
        raises ``df.HigherOrderError`` instead of differentiating it; ``backward`` may then use
        non-differentiable code, and ``df.check_function`` reports
        ``second_order_gradients_are_correct`` Skipped.
      jvp_from_forward: ``True``: forward mode (``jax.jvp``, ``jax.jacfwd``, ``jax.linearize``,
        ``jax.hessian``) differentiates ``forward`` by autodiff, for a class without ``jvp``;
        reverse mode still uses ``backward``. ``False`` (default): forward mode of the operation
        itself is a ``df.ForwardModeError`` (forward-over-reverse, as in ``jax.hessian`` of a
        loss, works either way, as with ``jax.custom_vjp``).
      surrogate_gradients: optional ``{forward input name: reason}`` for inputs whose backward
        is intentionally not the derivative (a straight-through estimator, gradient reversal):
        ``df.check_function`` reports their ``gradients_are_correct[name]`` Skipped with the
        reason (and runs every other test); a name that is not an input of ``forward`` is a
        ``df.CheckError``. Read by the checkers only; it changes nothing in a call.

    The flags (not ``surrogate_gradients``) may also be set per instance in ``__init__``.

    ``forward(self, *X)`` returns ``Y`` (one output, no memory) or the tuple
    ``(Y1, ..., YM, mem1, ..., memK)``. Inputs and outputs may be arrays or pytrees of arrays;
    trailing parameters with defaults (``b=None``) are optional inputs. A call passes the inputs
    positionally or by keyword, bound against ``forward``'s signature.

    ``backward(self, *dLdY, compute_gradients, *X, *Y, *memory)`` receives the output gradients,
    the ``compute_gradients`` flags (per input: a bool, or a pytree of bools for a pytree input),
    then the inputs if saved, the outputs if saved, and the memory values; it returns one
    gradient per input with that input's structure (a single value when there is one input);
    with optional inputs left out, either one per parameter of ``forward`` (``None`` for those)
    or one per input given (PyTorch's habit).
    ``None``, for a leaf or a subtree, means no gradient (zeros), as in JAX.

    ``jvp(self, primals, tangents)`` (optional) returns ``(Y, dY)`` like a ``jax.custom_jvp``
    rule: the outputs and their tangents (tuples when ``num_outputs > 1``).

    ``vmap(self, axis_size, in_batched, *X)`` (optional) returns ``(result, out_batched)`` like a
    ``jax.custom_batching.custom_vmap`` rule: what ``forward`` returns, for the whole batch, and
    whether each returned value has the batch axis in front.

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
    materialize_zero_gradients: ClassVar[bool] = True
    once_differentiable: ClassVar[bool] = False
    jvp_from_forward: ClassVar[bool] = False
    surrogate_gradients: ClassVar[dict[str, str] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for attr in rules._FLAG_ATTRIBUTES:
            rules.check_flag(
                cls.__name__, attr, getattr(cls, attr), getattr(DifferentiableFunction, attr)
            )
        # Per-class caches live on the class, so they go away with it (see the module doc).
        cls._difffn_operations = {}
        cls._difffn_arity_checked = set()
        if "<locals>" not in cls.__qualname__:
            jax.tree_util.register_static(cls)
        if (
            cls.__init__ is DifferentiableFunction.__init__
            and _defines(cls, "forward")
            and _defines(cls, "backward")
        ):
            # No __init__: the flags are the class's, so a wrong backward arity shows now.
            names, required, variadic = _signature(cls)
            if not variadic:
                _check_backward_arity(cls, rules.flags_of_class(cls), names)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:
            # MATLAB calls the object directly (``f = MyFunction(); y = f(x)``); giving the
            # inputs to the constructor is the mistake this names.
            cls = type(self).__name__
            raise DifferentiableFunctionError(
                f"{cls}(...) got {len(args) + len(kwargs)} argument(s), but {cls} defines no "
                f"__init__ to take configuration. A DifferentiableFunction is made, then called "
                f"on its inputs. Fix: {cls}()(x, ...), or define __init__(self, ...) for "
                "configuration."
            )

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """The outputs (then the memory values) from the inputs; every subclass defines it."""
        raise NotImplementedError

    def backward(self, *args: Any, **kwargs: Any) -> Any:
        """One gradient per input, from the output gradients, ``compute_gradients`` and what
        was saved; every subclass defines it."""
        raise NotImplementedError

    # -- configuration identity -------------------------------------------------------------

    def _attributes(self) -> tuple[tuple, dict]:
        """(static items, array attributes): hashable attributes are static configuration; an
        attribute holding arrays (a pytree of them, traced values included) is a constant of
        the operation, an input that is never differentiated."""
        items, arrays = [], {}
        for name, value in sorted(vars(self).items()):
            try:
                hash(value)
            except TypeError:
                leaves = jax.tree.leaves(value)
                if leaves and all(isinstance(v, (jax.Array, np.ndarray)) for v in leaves):
                    arrays[name] = value
                    continue
                raise DifferentiableFunctionError(
                    f"{type(self).__name__} attribute {name!r} holds an unhashable "
                    f"{type(value).__name__}; instance attributes of a DifferentiableFunction "
                    "are static configuration (hashable, so equal configurations share "
                    "compiled code) or arrays (constants of the operation, never "
                    "differentiated). Fix: use a tuple instead of a list, or arrays (a pytree "
                    "of arrays), or pass the value as an input of the call."
                ) from None
            items.append((name, type(value), value))
        return tuple(items), arrays

    def _config(self) -> tuple:
        items, arrays = self._attributes()
        shapes = tuple(
            (name, jax.tree.structure(value), tuple(map(jax.typeof, jax.tree.leaves(value))))
            for name, value in arrays.items()
        )
        return (type(self), items, shapes)

    # An instance holding arrays equals only itself: as a static jit argument (or pytree
    # structure) its arrays are baked into the trace, so another instance must not reuse it.
    # Calls still share one operation per configuration and array shapes (``_config``).

    def __hash__(self) -> int:
        config = self._config()
        return id(self) if config[2] else hash(config)

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return NotImplemented
        assert isinstance(other, DifferentiableFunction)  # the same class
        config = self._config()
        if config[2]:
            return self is other
        return config == other._config()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(self).items()))
        return f"{type(self).__name__}({args})"

    # -- calling ---------------------------------------------------------------------------

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        """Apply the operation: ``forward``'s outputs, with ``backward`` as their derivative.

        Args:
          *inputs: the inputs, positionally, in ``forward``'s order (arrays or pytrees of them;
            an optional input left out takes its default).

        Returns:
          The output (``num_outputs == 1``) or the tuple of outputs. Typed ``Any``: what
          ``forward`` returns (an array or a pytree) is the subclass's to say.

        Raises:
          DifferentiableFunctionError: keyword arguments, a wrong number of inputs, or a
            ``backward`` whose arity does not fit the class attributes.
        """
        cls = type(self)
        _check_methods(cls)
        names, required, variadic = _signature(cls)
        inputs, given = _bind(cls, inputs, kwargs, names, required, variadic)
        flags = rules.flags_of(self)
        all_names = _input_names(cls, len(inputs))
        key = (flags, len(inputs))
        if key not in cls._difffn_arity_checked:
            _check_backward_arity(cls, flags, all_names)
            cls._difffn_arity_checked.add(key)
        xs = tuple(
            rules.prepare_input(cls.__name__, all_names[i], i, len(inputs), x)
            for i, x in enumerate(inputs)
        )
        leaves, in_tree = jax.tree.flatten(xs)
        op = rules.operation(self, flags, in_tree, all_names, given)
        if op.constants is not None:
            values = tuple(vars(self)[name] for name in op.constants[0])
            leaves += [
                jnp.asarray(v) if isinstance(v, np.ndarray) else v for v in jax.tree.leaves(values)
            ]
        out_tree, out_leaves = op.outer(*leaves)
        outputs = jax.tree.unflatten(out_tree.value, list(out_leaves))
        return outputs[0] if flags.num_outputs == 1 else tuple(outputs)


# -- signatures ---------------------------------------------------------------------------------


def _defines(cls, method: str) -> bool:
    return getattr(cls, method) is not getattr(DifferentiableFunction, method)


def _check_methods(cls) -> None:
    for method in ("forward", "backward"):
        if not _defines(cls, method):
            raise DifferentiableFunctionError(
                f"{cls.__name__} does not define {method}; a DifferentiableFunction needs both "
                f"forward and backward. Fix: add `def {method}(self, ...)` to {cls.__name__} "
                "(for automatic differentiation, use a plain function instead)."
            )


def _signature(cls) -> tuple[tuple[str, ...], int, bool]:
    """forward's positional input names, how many are required, and whether it takes ``*args``."""
    forward = positional(cls.forward)
    return forward.names, len(forward.required), forward.variadic


def _forward_parameters(cls) -> tuple[tuple[str, ...], bool]:
    """Names of forward's required inputs, and whether it accepts more (``*args`` or optional)."""
    forward = positional(cls.forward)
    return forward.required, forward.variadic or len(forward.names) > len(forward.required)


def _input_names(cls, count: int) -> tuple[str, ...]:
    names, _, _ = _signature(cls)
    return tuple(names[i] if i < len(names) else f"input{i + 1}" for i in range(count))


def what(cls, index: int, count: int) -> str:
    """``"the gradient of input 'tl' (2 of 5)"``, for messages."""
    return f"the gradient of {rules.describe_input(_input_names(cls, count), index)}"


def _signature_text(names, required: int, variadic: bool) -> str:
    parts = [n if i < required else f"{n}=<default>" for i, n in enumerate(names)]
    return ", ".join(parts + (["*inputs"] if variadic else []))


def _bind(cls, inputs: tuple, kwargs: dict, names, required: int, variadic: bool):
    """The inputs in forward's order (keywords bound to forward's parameters, left-out optional
    ones filled with their defaults), and which of them the caller gave."""
    signature = _signature_text(names, required, variadic)
    for name in kwargs:
        if name not in names:
            raise DifferentiableFunctionError(
                f"{cls.__name__} was called with keyword argument {name!r}, which is not an "
                f"input of its forward: {cls.__name__}()({signature}). Fix: use one of forward's "
                "input names, or put configuration in the constructor."
            )
        if names.index(name) < len(inputs):
            raise DifferentiableFunctionError(
                f"{cls.__name__} got input {name!r} both positionally (input "
                f"{names.index(name) + 1}) and as a keyword: {cls.__name__}()({signature}). "
                "Fix: give it once."
            )
    if not kwargs:
        completed = _complete(cls, inputs, names, required, variadic)
        return completed, (True,) * len(inputs) + (False,) * (len(completed) - len(inputs))
    last = max(names.index(name) for name in kwargs)
    parameters = list(inspect.signature(cls.forward).parameters.values())[1:]
    bound, given = list(inputs), [True] * len(inputs)
    for i in range(len(inputs), last + 1):
        if names[i] in kwargs:
            bound.append(kwargs[names[i]])
            given.append(True)
        elif i < required:
            missing = [n for n in names[len(inputs) : required] if n not in kwargs]
            raise _missing(cls, missing, signature)
        else:
            bound.append(parameters[i].default)
            given.append(False)
    if len(bound) < required:
        raise _missing(cls, names[len(bound) : required], signature)
    inputs = _complete(cls, tuple(bound), names, required, variadic)
    return inputs, tuple(given) + (False,) * (len(inputs) - len(given))


def _missing(cls, missing, signature: str) -> DifferentiableFunctionError:
    return DifferentiableFunctionError(
        f"{cls.__name__} was called without its required input(s) "
        f"{', '.join(map(repr, missing))}: {cls.__name__}()({signature}). Fix: pass every "
        "required input, positionally or by name."
    )


def _complete(cls, inputs: tuple, names, required: int, variadic: bool) -> tuple:
    """The inputs with left-out optional ones filled with forward's defaults."""
    count = len(inputs)
    if count == 0 and not names:
        raise DifferentiableFunctionError(
            f"{cls.__name__} was called with no inputs; expected at least one array."
        )
    if count < required or (count > len(names) and not variadic):
        takes = f"{required}" if required == len(names) else f"{required} to {len(names)}"
        raise DifferentiableFunctionError(
            f"{cls.__name__} was called with {count} inputs; its forward takes {takes} "
            f"({_signature_text(names, required, variadic)}). Fix: pass one array (or pytree of "
            "arrays) per forward input, in order."
        )
    if count >= len(names):
        return inputs
    parameters = list(inspect.signature(cls.forward).parameters.values())[1:]
    return (*inputs, *(p.default for p in parameters[count : len(names)]))


def _backward_signature(flags: rules.Flags, input_names) -> list[str]:
    def numbered(stem, count):
        return [stem] if count == 1 else [f"{stem}{i + 1}" for i in range(count)]

    parts = numbered("dLdY", flags.num_outputs) + ["compute_gradients"]
    parts += list(input_names) if flags.save_inputs else []
    parts += numbered("Y", flags.num_outputs) if flags.save_outputs else []
    parts += numbered("memory", flags.num_memory) if flags.num_memory else []
    return parts


def _check_backward_arity(cls, flags: rules.Flags, input_names) -> None:
    """Raise if ``backward`` cannot take the arguments the flags say it gets."""
    if not _defines(cls, "backward"):
        return
    backward = positional(cls.backward)
    names, variadic = list(backward.names), backward.variadic
    expected = _backward_signature(flags, input_names)
    n = len(expected)
    if len(backward.required) <= n and (variadic or n <= len(names)):
        return
    got = ", ".join(names) + (", *args" if variadic else "")
    hint = ""
    if "compute_gradients" not in names and n == len(names) + 1:
        hint = (
            " It looks like backward leaves out compute_gradients (PyTorch's backward has no "
            "such argument; here it comes right after the output gradients)."
        )
    elif not flags.save_inputs and len(names) == n + len(input_names):
        hint = (
            " It looks like backward expects the inputs: set save_inputs_for_backward = True "
            "to receive them."
        )
    raise DifferentiableFunctionError(
        f"{cls.__name__}.backward takes {len(names)} arguments after self ({got}); "
        f"expected {n}: backward(self, {', '.join(expected)}). The order is MATLAB's: the "
        f"output gradients (num_outputs={flags.num_outputs}), compute_gradients, the inputs "
        f"(save_inputs_for_backward={flags.save_inputs}), the outputs "
        f"(save_outputs_for_backward={flags.save_outputs}), then the memory values "
        f"(num_memory_values={flags.num_memory}).{hint} Fix: change backward's parameters or "
        "the class flags to agree."
    )
