"""``check_layer``'s gradient tests: the layer as a numerical model, and the verdicts in words.

``gradients_are_correct[NAME]``, per input and learnable (and state, when backward takes
``dLdSout``): in float64, the loss ``sum(dLdY * Y)`` through ``forward`` (the function the custom
backward is paired with) is differenced along probes by ``_numerical``, against the custom
backward's gradient (or JAX autodiff's, for a layer without one), with JAX autodiff as a reference.
A name in the class's ``surrogate_gradients`` is Skipped with the declared reason; a forward that
computes in a narrower dtype inside is compared with JAX autodiff at that dtype's tolerance.

``second_order_gradients_are_correct``: ``_check_second_order`` around the same point.

`LayerModel` is the layer's forward as a function of the flat checked values (a
``_numerical.Model``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .._core import LayerError, stripdims
from . import _check_second_order as second_order
from . import _numerical as numerical
from ._check_common import (
    SURROGATE_HINT,
    CheckModel,
    Unusable,
    cast_floating,
    gradient_outcome,
    gradients_or_without_autodiff,
    index_text,
    is_array,
    is_floating,
    narrowest_float,
    record_gradient_tests,
    reference_outcome,
    surrogate_outcome,
)
from ._check_layer_backward import gradient_problem
from ._check_layer_subject import LayerSubject, call_layer, like, run_user, user_inputs
from ._check_report import describe_exception, incomplete, skipped

TEST = "gradients_are_correct"


@dataclass(frozen=True)
class Part:
    """A checked value: which backward gradient it is, and where its leaves sit."""

    key: str  # "input:in", "learnable:alpha", "state:s"
    name: str
    kind: str  # "input", "learnable", "state"
    gradient_index: int
    leaves: tuple[int, ...]  # indices into the flat leaves of (inputs, layer)
    shapes: tuple[tuple[int, ...], ...]
    paths: tuple[str, ...]

    @property
    def size(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


@dataclass(frozen=True)
class LayerModel(CheckModel):
    """The layer's forward as a function of the flat checked values (hashable, static).

    ``args``: ``(leaves of (inputs, layer), forward key, upstream gradients)``.
    """

    treedef: object
    formats: tuple[str, ...]
    parts: tuple[Part, ...]
    num_gradients: int
    takes_state: bool
    with_backward: bool
    with_autodiff: bool
    traceable: bool

    def rebuild(self, args, parts):
        leaves, _, _ = args
        leaves = list(leaves)
        for part, flat in zip(self.parts, parts, strict=True):
            offset = 0
            for leaf, shape in zip(part.leaves, part.shapes, strict=True):
                size = math.prod(shape)
                leaves[leaf] = flat[offset : offset + size].reshape(shape)
                offset += size
        inputs, layer = jax.tree.unflatten(self.treedef, leaves)
        return layer, user_inputs(layer, inputs, self.formats)

    def forward(self, args, parts):
        layer, xs = self.rebuild(args, parts)
        return layer, xs, run_user(layer, xs, True, args[1])

    def outputs(self, args, parts):
        _, _, (outs, state, _) = self.forward(args, parts)
        values = [stripdims(y) for y in outs]
        if self.takes_state:
            values += [stripdims(s) for s in state]
        return values

    def runtime_outputs(self, args, parts):
        """The outputs of the layer called as users call it (custom backward wired in)."""
        layer, xs = self.rebuild(args, parts)
        outs, state = call_layer(layer, xs, training=True, key=args[1])
        values = [stripdims(y) for y in outs]
        if self.takes_state:
            values += [stripdims(s) for s in state]
        return values

    def cotangents(self, args):
        return args[2]

    def backward_gradient(self, args, parts):
        layer, xs, (outs, state, memory) = self.forward(args, parts)
        cotangents = list(args[2])
        dys = [
            like(jnp.asarray(c, stripdims(y).dtype), y)
            for c, y in zip(cotangents, outs, strict=False)
        ]
        extra = []
        if self.takes_state:
            extra = [jnp.asarray(c) for c in cotangents[len(outs) :]]
        grads = layer.backward(*xs, *outs, *dys, *extra, memory)
        if self.num_gradients == 1 and not isinstance(grads, (tuple, list)):
            grads = (grads,)
        pieces = [_part_gradient(part, grads, self.num_gradients) for part in self.parts]
        return jnp.concatenate(pieces) if pieces else jnp.zeros((0,), jnp.float64)


def _part_gradient(part: Part, grads, count: int):
    """The flat gradient of one checked value, or NaNs when the backward's is unusable."""
    bad = jnp.full((part.size,), jnp.nan, jnp.float64)
    if not isinstance(grads, (tuple, list)) or len(grads) != count:
        return bad
    grad = stripdims(grads[part.gradient_index])
    if grad is None:
        return bad
    leaves = [stripdims(g) for g in jax.tree.leaves(grad)]
    if len(leaves) != len(part.shapes):
        return bad
    flat = []
    for g, shape in zip(leaves, part.shapes, strict=True):
        if not is_array(g) or tuple(g.shape) != shape:
            return bad
        flat.append(jnp.ravel(g).astype(jnp.float64))
    return jnp.concatenate(flat) if flat else jnp.zeros((0,), jnp.float64)


def gradients_are_correct(s: LayerSubject) -> None:
    """Record ``gradients_are_correct[NAME]`` for every input and learnable (and state)."""
    rec = s.rec
    names = [("input", n) for n in s.names["inputs"]]
    names += [("learnable", n) for n in s.names["learnables"]]
    declared = {n: surrogate_outcome(s.surrogates[n]) for _, n in names if n in s.surrogates}
    if s.forwarded is None:
        for _, n in names:
            rec.add(f"{TEST}[{n}]", declared.get(n, incomplete("forward did not run")))
        return
    custom = s.custom_backward
    takes_state = False
    if custom:
        try:
            takes_state = s.takes_state()
        except LayerError as error:
            for _, n in names:
                rec.add(f"{TEST}[{n}]", declared.get(n, incomplete(str(error))))
            return
        if takes_state:
            names += [("state", n) for n in s.names["states"]]

    def compute():
        with jax.enable_x64(True):
            outcomes = _outcomes(s, custom, takes_state)
        return {
            n: outcomes.get(f"{kind}:{n}", skipped(f"{kind} {n!r} holds no floating-point values"))
            for kind, n in names
        }

    record_gradient_tests(rec, TEST, [n for _, n in names], compute, fixed=declared)


def checked_parts(s: LayerSubject, xs, layer, takes_state: bool):
    """The flat leaves of ``(xs, layer)`` with their tree, and a `Part` per checked value."""
    path_leaves, treedef = jax.tree_util.tree_flatten_with_path((xs, layer))
    n_in = len(xs)
    learnables, states = s.names["learnables"], s.names["states"]
    groups = [("input", n, i, (0, i)) for i, n in enumerate(s.names["inputs"])]
    groups += [("learnable", n, n_in + j, n) for j, n in enumerate(learnables)]
    if takes_state:
        groups += [("state", n, n_in + len(learnables) + k, n) for k, n in enumerate(states)]
    parts = []
    for kind, name, gradient_index, where in groups:
        indices, shapes, paths = [], [], []
        for index, (path, leaf) in enumerate(path_leaves):
            if not _belongs(path, where) or not is_floating(leaf):
                continue
            indices.append(index)
            shapes.append(tuple(leaf.shape))
            paths.append(jax.tree_util.keystr(path[1:] if kind != "input" else path[2:]))
        if indices:
            parts.append(
                Part(
                    f"{kind}:{name}",
                    name,
                    kind,
                    gradient_index,
                    tuple(indices),
                    tuple(shapes),
                    tuple(paths),
                )
            )
    return [leaf for _, leaf in path_leaves], treedef, tuple(parts)


@dataclass(frozen=True)
class _Point:
    model: LayerModel
    args: tuple
    segments: tuple
    base: np.ndarray
    scale: np.ndarray
    base_parts: tuple
    cotangents: tuple


def _point(s: LayerSubject, custom: bool, takes_state: bool, *, exclude=(), xs=None) -> _Point:
    """The float64 point of the check: the model over the checked values not in ``exclude``
    (keys like ``"input:in"``), its arguments, segments and upstream gradients; at the test
    inputs, or at ``xs``."""
    layer = cast_floating(s.layer, "float64")
    xs = tuple(jnp.asarray(x, jnp.float64) for x in (s.xs if xs is None else xs))
    leaves, treedef, parts = checked_parts(s, xs, layer, takes_state)
    parts = tuple(p for p in parts if p.key not in exclude)
    num_gradients = len(xs) + len(s.names["learnables"])
    num_gradients += len(s.names["states"]) if takes_state else 0
    model = LayerModel(
        treedef,
        s.formats,
        parts,
        num_gradients,
        takes_state,
        with_backward=custom,
        with_autodiff=True,
        traceable=s.cls.acceleratable,
    )
    flat = {i: np.ravel(np.asarray(leaves[i], np.float64)) for p in parts for i in p.leaves}
    segments, base, scale, base_parts = numerical.lay_out(
        [part.key for part in parts],
        [np.concatenate([flat[i] for i in p.leaves]) for p in parts],
        scale_leaves=[flat[i] for p in parts for i in p.leaves],
    )
    evaluate = jax.eval_shape if model.traceable else (lambda f, p: f(p))
    outputs = evaluate(lambda p: model.outputs((tuple(leaves), s.forward_key, ()), p), base_parts)
    cotangents = tuple(
        s.data.normal(60 + i, tuple(y.shape), jnp.float64) for i, y in enumerate(outputs)
    )
    args = (tuple(leaves), s.forward_key, cotangents)
    return _Point(model, args, tuple(segments), base, scale, base_parts, cotangents)


def _outcomes(s: LayerSubject, custom: bool, takes_state: bool) -> dict:
    declared = {
        f"{kind}:{name}"
        for kind in ("input", "learnable")
        for name in s.names[f"{kind}s"]
        if name in s.surrogates
    }
    invalid = _invalid_gradients(s, custom)
    outcomes = {}
    point = _point(s, custom, takes_state, exclude=declared)
    model, args, parts = point.model, point.args, point.model.parts
    if not parts:
        return outcomes
    required = (
        ""
        if custom
        else "JAX autodiff cannot differentiate the layer's forward (see autodiff_works[forward])"
    )
    model, grads, note = gradients_or_without_autodiff(
        model, args, point.base_parts, required=required
    )
    dtype = None
    if custom and model.traceable and "autodiff" in grads:
        dtype = narrowest_float(lambda p: model.outputs(args, p), point.base_parts)
    verdicts = None
    if dtype is None:
        verdicts = numerical.check_gradients(
            model,
            args,
            point.base,
            point.scale,
            point.cotangents,
            point.segments,
            seed=s.data.seq(7),
            gradients=grads,
        )
    by_key = {p.key: p for p in parts}
    for part, segment in zip(parts, point.segments, strict=True):
        if part.key in invalid:
            outcomes[part.key] = incomplete(
                f"the backward's gradient for {part.kind} {part.name!r} is unusable "
                f"({invalid[part.key]}); see backward_returns_valid_gradients"
            )
        elif verdicts is None:
            outcomes[part.key] = reference_outcome(
                f"{part.kind} {part.name!r}",
                grads["backward"][segment.start : segment.stop],
                grads["autodiff"][segment.start : segment.stop],
                dtype=dtype,
                size=_size_text(part),
                locate=_locator(s, part),
                who="the custom backward",
                fix=_fix(s, part, custom),
            )
        else:
            outcomes[part.key] = _outcome(s, part, verdicts, by_key, custom, note)
    return outcomes


def _invalid_gradients(s: LayerSubject, custom: bool) -> dict:
    """Checked values whose backward gradient is missing or misshapen, with the reason."""
    if not custom:
        return {}
    try:
        pairs, _ = s.gradients(s.layer, s.xs)
    except Exception as error:  # noqa: BLE001
        raise Unusable(
            f"backward did not return usable gradients (see backward_runs and "
            f"backward_returns_valid_gradients): {str(error).splitlines()[0]}"
        ) from None
    invalid = {}
    for (kind, name, value), grad in pairs:
        problem = gradient_problem(grad, value)
        if problem:
            invalid[f"{kind}:{name}"] = f"it {problem}"
    return invalid


def _size_text(part: Part) -> str:
    if len(part.shapes) == 1:
        return " x ".join(str(n) for n in part.shapes[0]) or "a scalar"
    return f"{part.size} values"


def _locator(s: LayerSubject, part: Part):
    """Element index -> ``"(B=0, C=3)"`` (an input), ``"(0, 3)"``, or a pytree path and index."""
    shape = part.shapes[0] if len(part.shapes) == 1 else None
    fmt = s.formats[s.names["inputs"].index(part.name)] if part.kind == "input" else ""

    def locate(i):
        if shape is not None:
            return index_text(i, shape, fmt)
        offset = 0
        for path, leaf_shape in zip(part.paths, part.shapes, strict=True):
            if i < offset + math.prod(leaf_shape):
                return f"{path}{index_text(i - offset, leaf_shape)}"
            offset += math.prod(leaf_shape)
        return str(i)

    return locate


def _fix(s: LayerSubject, part: Part, custom: bool) -> str:
    names = s.names
    if custom:
        order = ", ".join(
            [f"dLd{n}" for n in names["inputs"]] + [f"dLd{n}" for n in names["learnables"]]
        )
        return (
            f"Fix: check backward's formula for dLd{part.name}: by the chain rule it is the "
            f"sum over outputs of dLdY * dY/d{part.name} (multiply by the upstream gradient, "
            "use the memory value forward returned, and for a parameter broadcast in forward "
            f"sum over exactly the broadcast axes); backward returns {order}, in that order. "
            + SURROGATE_HINT.format(name=part.name)
        )
    return (
        "Fix: an operation inside forward has a wrong derivative (a "
        "DifferentiableFunction's backward, a jax.custom_vjp/custom_jvp rule) or blocks "
        "it (jax.lax.stop_gradient); check it with df.check_function."
    )


def _outcome(s: LayerSubject, part: Part, verdicts, parts_by_key, custom, autodiff_note):
    labels = {k: f"{p.kind} {p.name!r}" for k, p in parts_by_key.items()}
    return gradient_outcome(
        part.key,
        verdicts,
        labels,
        shape=part.shapes[0] if len(part.shapes) == 1 else None,
        locate=_locator(s, part),
        who="the custom backward" if custom else "JAX autodiff of forward",
        fix=_fix(s, part, custom),
        note=autodiff_note,
    )


SECOND_ORDER_ELEMENTS = 4096
"""The second-order test keeps the observations needed for about this many elements per input
(at least 2): differentiability is a property of the code, and its cost grows with the data."""


def _fewer_observations(s: LayerSubject):
    """The test inputs, cut along ``B`` to the observations the second-order test needs (the
    same number for every input with a ``B`` axis)."""
    axes = [fmt.find("B") for fmt in s.formats]
    sizes = [x.size // x.shape[a] for x, a in zip(s.xs, axes, strict=True) if a >= 0 and x.size]
    if not sizes:
        return s.xs
    keep = max(2, -(-SECOND_ORDER_ELEMENTS // max(sizes)))
    return tuple(
        jax.lax.slice_in_dim(x, 0, min(keep, x.shape[a]), axis=a) if a >= 0 else x
        for x, a in zip(s.xs, axes, strict=True)
    )


def second_order_gradients_are_correct(s: LayerSubject):
    reason = second_order.skip_reason(s.cls)
    if reason:
        return skipped(reason)
    if not s.cls.acceleratable:
        return skipped(
            f"{s.cls.__name__} sets acceleratable = False: it runs eagerly, and JAX traces what "
            "it differentiates a second time, so its second derivative cannot be taken"
        )
    s.require("forwarded")
    blocked = second_order.blocked_by_first_order(s.rec)
    if blocked is not None:
        return blocked
    custom = s.custom_backward
    takes_state = False
    if custom:
        try:
            takes_state = s.takes_state()
        except LayerError as error:
            return incomplete(str(error))
        try:
            invalid = _invalid_gradients(s, custom)
        except Unusable as reason:
            return incomplete(str(reason))
        if invalid:
            return incomplete(
                "backward returns unusable gradients (see backward_returns_valid_gradients)"
            )
    with jax.enable_x64(True):
        try:
            point = _point(s, custom, takes_state, xs=_fewer_observations(s))
        except Exception as error:  # noqa: BLE001 - the user's forward raised
            return incomplete(f"forward could not run in float64:\n{describe_exception(error)}")
        parts = point.model.parts
        if not parts:
            return skipped("no input or learnable holds floating-point values")
        by_key = {p.key: p for p in parts}
        first = second_order.Point(
            point.model,
            point.args,
            point.base,
            point.scale,
            point.base_parts,
            point.segments,
            {k: f"{p.kind} {p.name!r}" for k, p in by_key.items()},
            {k: _locator(s, p) for k, p in by_key.items()},
        )
        who = "the custom backward" if custom else "JAX autodiff of forward"
        note = "" if custom else "The layer has no custom backward: this is JAX's own derivative."
        return second_order.second_order_outcome(
            first, s.data, who=who, trust_reference=not s.surrogates, note=note
        )


def _belongs(path, where) -> bool:
    if isinstance(where, tuple):  # an input: (0, i)
        return (
            len(path) >= 2
            and getattr(path[0], "idx", None) == 0
            and getattr(path[1], "idx", None) == where[1]
        )
    return (
        len(path) >= 2
        and getattr(path[0], "idx", None) == 1
        and getattr(path[1], "name", None) == where
    )
