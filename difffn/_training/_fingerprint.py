"""What a training run's numbers depend on, as strings: written into checkpoints, checked on resume.

A fingerprint is ``{name: description}``: the options that change the numbers (the rows of
``_options.OPTIONS`` marked ``numbers``), the loss, the training data (shape, dtype and a hash of
each array; an iterable by its type and length) and every learnable's learn-rate and L2 factor.
Resuming with a fingerprint that differs is a clear error naming the first difference, rather
than a silently different run. Descriptions are plain strings, so a checkpoint stores them as
they are and they compare across processes (callables by their qualified name, never by id).
"""

from __future__ import annotations

import numbers

import jax
import numpy as np

from .._batching import describe_array
from .._core import SerializationError, former_path
from .._layer import learnable_mask
from .._network import L2, LEARN_RATE, leaf_factors


def describe(value) -> str:
    """A stable description of an option value (callables by their qualified name)."""
    if isinstance(value, (str, bool, numbers.Number)) or value is None:
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(describe(v) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted((str(k), describe(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in items) + "}"
    name = getattr(value, "name", None)
    if isinstance(name, str):  # a metric object
        return f"{type(value).__name__}({name!r})"
    if callable(value):
        module = getattr(value, "__module__", None) or type(value).__module__
        qualname = getattr(value, "__qualname__", None) or type(value).__qualname__
        return former_path(f"{module}.{qualname}")
    return type(value).__qualname__


def describe_solver(solver) -> str:
    """A solver's name, or a custom optax transformation by what it is made of.

    A transformation is a pair of functions whose settings (learning rate, decay factors, ...)
    live in their closures: it is described by the functions' qualified names and the plain
    values (numbers, strings, flags, arrays by their hash) found in those closures, followed
    into the functions and transformations they hold. Equal settings give equal descriptions
    in any process; values kept in other objects are described by their type only.
    """
    if isinstance(solver, str):
        return repr(solver)
    return "optax transformation " + _value(solver, depth=8, seen=set())


def _value(value, *, depth: int, seen: set) -> str:
    if isinstance(value, (str, bool, numbers.Number)) or value is None:
        return repr(value)
    if isinstance(value, (np.ndarray, jax.Array, np.generic)):
        return describe_array(np.asarray(value))
    if id(value) in seen or depth == 0:
        return "..."
    seen = seen | {id(value)}
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_value(v, depth=depth - 1, seen=seen) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted((str(k), _value(v, depth=depth - 1, seen=seen)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if callable(value) and hasattr(value, "__code__"):
        cells = []
        for cell in value.__closure__ or ():
            try:
                cells.append(_value(cell.cell_contents, depth=depth - 1, seen=seen))
            except ValueError:  # an empty cell
                cells.append("<empty>")
        name = former_path(f"{value.__module__}.{value.__qualname__}")
        return name + (f"({', '.join(cells)})" if cells else "")
    return describe(value)


def factors(net) -> dict[str, str]:
    """The learn-rate and L2 factor of every learnable leaf, by its path."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(net)[0]]
    mask = jax.tree.leaves(learnable_mask(net))
    lr, l2 = leaf_factors(net, LEARN_RATE), leaf_factors(net, L2)
    return {
        f"factors of {path}": f"learn rate {a!r}, L2 {b!r}"
        for path, m, a, b in zip(paths, mask, lr, l2, strict=True)
        if m
    }


def run_fingerprint(options: dict[str, str], *, loss, data: dict[str, str], net) -> dict[str, str]:
    """A run's fingerprint from its options' entries, loss, data entries and network factors."""
    out = dict(options)
    out["loss"] = describe(loss)
    out.update(data)
    out.update(factors(net))
    return out


LOAD_NETWORK = "net = df.load(path, like=net)"


def check(
    saved: dict[str, str],
    current: dict[str, str],
    source: str,
    *,
    defaults: dict[str, str],
    load_network: str = LOAD_NETWORK,
) -> None:
    """Raise a clear error naming the first thing that differs between two fingerprints.

    ``defaults`` gives, per option entry, the description of its default: a checkpoint written
    before that option existed lacks the entry, and it then counts as having had the default.
    """
    for name in list(current) + [n for n in saved if n not in current]:
        was = saved.get(name, defaults.get(name, "(absent)"))
        now = current.get(name, "(absent)")
        if was != now:
            raise SerializationError(
                f"trainnet(resume_from={source!r}): the run that wrote the checkpoint differs "
                f"in {name}: it had {was}; this call has {now}. Resuming continues "
                "that run exactly, so the options that change the numbers, the loss, the data "
                "and the network's factors must be the same. Fix: pass the same ones, or start "
                f"a new run from the checkpoint's network ({load_network})."
            )
