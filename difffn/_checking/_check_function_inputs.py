"""``check_function``'s subject: the example inputs as leaves, and the backward called as the
runtime calls it.

A ``DifferentiableFunction`` takes arrays or pytrees of arrays (a parameter dict, a
NamedTuple). The checker works on the flat array leaves of all its inputs: each leaf gets its own
gradient test, named by its input and pytree path (``gradients_are_correct[params['w']]``), and
``compute_gradients`` is built per leaf exactly as a call builds it (a bool for an array input, a
pytree of bools for a pytree input).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._core import CheckError, FormattedArray, is_array, short, type_name
from .._function import cotangents as ct
from .._function import forward_parameters as _forward_parameters
from .._function import is_wrapped_single as _is_wrapped_single
from .._function import run_forward


def differentiable(x) -> bool:
    return bool(jnp.issubdtype(x.dtype, jnp.inexact))


def validate_inputs(cls, example_inputs) -> tuple:
    """The example inputs, each a jax array or a pytree of jax arrays (formats stripped).

    Raises:
      CheckError: not one example per forward input, or a leaf that is not an array.
    """
    names, variadic = _forward_parameters(cls)
    count = len(example_inputs)
    if count == 0 or count < len(names) or (count > len(names) and not variadic):
        raise CheckError(
            f"check_function: {cls.__name__}.forward takes {len(names)} input(s) "
            f"({', '.join(names)}) but got {count} example input(s). Fix: pass one example array "
            "(or pytree of arrays) per forward input, e.g. check_function(fcn, "
            + ", ".join(names or ["x"])
            + ")."
        )
    xs = []
    for i, x in enumerate(example_inputs):
        leaves, tree = jax.tree_util.tree_flatten_with_path(
            x, is_leaf=lambda v: isinstance(v, FormattedArray)
        )
        arrays = []
        for path, leaf in leaves:
            if isinstance(leaf, FormattedArray):
                leaf = leaf.data
            if not (is_array(leaf) or isinstance(leaf, (int, float))):
                raise CheckError(
                    f"check_function: example input {i + 1} of {cls.__name__}"
                    f"{ct.path_text(path)} is a {type_name(leaf)}; expected an array (or a "
                    "pytree of arrays). Fix: pass jax or numpy arrays."
                )
            arrays.append(jnp.asarray(leaf))
        xs.append(jax.tree.unflatten(tree, arrays))
    return tuple(xs)


def describe_input(x) -> str:
    """``"float32 array of shape (4, 3)"``, or for a pytree ``"dict of 2 arrays"``."""
    if is_array(x):
        return f"{x.dtype.name} array of shape {tuple(int(s) for s in x.shape)}"
    return short(x)


class ExampleInputs:
    """The example inputs, and their leaves (each array of each input) with names."""

    def __init__(self, xs: tuple, names):
        self.xs, self.names = xs, tuple(names)
        path_leaves, self.tree = jax.tree_util.tree_flatten_with_path(xs)
        self.leaves = tuple(leaf for _, leaf in path_leaves)
        self.owner = tuple(path[0].idx for path, _ in path_leaves)
        self.paths = tuple(path[1:] for path, _ in path_leaves)
        self.leaf_names = tuple(
            names[i] + jax.tree_util.keystr(p) for i, p in zip(self.owner, self.paths, strict=True)
        )
        self.shapes = tuple(tuple(x.shape) for x in self.leaves)

    def label(self, k: int) -> str:
        """``"input 'x'"``, or ``"input 'params' at ['w']"`` for a leaf of a pytree input."""
        return f"input {self.names[self.owner[k]]!r}{ct.path_text(self.paths[k])}"

    def differentiable(self) -> list[int]:
        """The leaves whose gradients are checked: the floating-point ones."""
        return [k for k, x in enumerate(self.leaves) if differentiable(x)]

    def flags(self, wanted) -> tuple:
        """``compute_gradients`` for per-leaf ``wanted`` bools, as a call builds it."""
        return jax.tree.unflatten(self.tree, [bool(w) for w in wanted])

    def all_flags(self) -> tuple:
        return self.flags([differentiable(x) for x in self.leaves])


def output_leaves(outputs) -> list:
    return jax.tree.leaves(tuple(outputs))


def call_backward(fcn, xs, cotangents, flags):
    """The user's backward, called as the runtime calls it (``cotangents``: one per output
    leaf); its result as a tuple with one gradient per input."""
    cls = type(fcn)
    outputs, memory = run_forward(fcn, xs)
    out_leaves, out_tree = jax.tree.flatten(tuple(outputs))
    cts = [jnp.asarray(c, y.dtype) for c, y in zip(cotangents, out_leaves, strict=True)]
    cotangent_trees = jax.tree.unflatten(out_tree, cts)
    saved_inputs = tuple(xs) if cls.save_inputs_for_backward else ()
    saved_outputs = tuple(outputs) if cls.save_outputs_for_backward else ()
    result = fcn.backward(*cotangent_trees, flags, *saved_inputs, *saved_outputs, *memory)
    if len(xs) == 1:
        wrapped = _is_wrapped_single(result, xs[0])
        return (result[0],) if wrapped else (result,)
    return tuple(result) if isinstance(result, (tuple, list)) else result


def leaf_gradients(fcn, inputs: ExampleInputs, grads) -> list:
    """One gradient (or ``None``) per leaf of the inputs, from backward's per-input ``grads``.

    Raises:
      BackwardError: a gradient's pytree structure is not its input's.
    """
    who = f"{type(fcn).__name__}.backward"
    found = []
    for i, (g, x) in enumerate(zip(grads, inputs.xs, strict=True)):
        what = f"the gradient of input {inputs.names[i]!r}"
        found += ct.align_leaves(g, x, who=who, what=what)
    return found


def second_example(rng: np.random.Generator, x):
    """Another example inside the domain of ``x``: its values mixed with each other (a random
    convex combination of ``x`` and a shuffle of it, so within ``x``'s range: a positive example
    stays positive), or scaled by 0.9 to 1.1 for a single value."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    values = np.asarray(x, np.float64)
    if values.size > 1:
        shuffled = values.ravel()[rng.permutation(values.size)].reshape(values.shape)
        mixed = values + rng.uniform(0.25, 0.75, values.shape) * (shuffled - values)
    else:
        mixed = values * rng.uniform(0.9, 1.1, values.shape)
    return jnp.asarray(mixed, x.dtype)
