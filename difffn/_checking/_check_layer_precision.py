"""``check_layer(..., precision=...)``: the layer at the compute dtype of mixed-precision training.

``trainnet`` with ``TrainingOptions(precision="bfloat16"|"float16")`` runs every layer on
inputs and learnables cast to the compute dtype (the network state stays float32) and casts the
outputs back to float32 for the loss (``_precision``). These two tests run the layer exactly so,
on the checker's data rounded to the compute dtype, against the same rounded values computed in
float32:

* ``forward_agrees_at_precision``: ``forward``'s outputs;
* ``gradients_agree_at_precision``: the gradients of ``sum(dLdY * Y)`` with respect to every
  input and learnable, through the layer as training calls it (its custom backward, or JAX
  autodiff), against JAX autodiff of the float32 forward. A backward that is wrong in float32
  is wrong here too, and a backward that loses precision (or overflows) only here is caught.

Finite differences cannot judge a 8- or 11-bit computation, hence the float32 reference on the
same rounded values: what is left is the rounding of the computation itself. Agreement is
normwise, ``||low - ref|| <= tol * ||ref||`` per output or gradient, with ``tol`` eight times the
dtype's machine epsilon (``TOLERANCES``): each operation rounds its result (one epsilon), a
reduction of ``n`` terms adds about ``sqrt(n)`` of them in the norm, and a layer chains a few
operations, while a wrong formula errs by order one. A value that is finite in float32 but inf
or NaN at the compute dtype (float16's largest value is 65504) fails, named.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._core import stripdims
from .._training import DTYPES
from ._check_common import cast_floating
from ._check_layer_subject import LayerSubject, call_layer, run_user, user_inputs
from ._check_report import failed, incomplete, skipped

# eight machine epsilons: bfloat16 keeps 8 significant bits (eps 2**-7), float16 11 (2**-10)
TOLERANCES = {"bfloat16": 8 * 2.0**-7, "float16": 8 * 2.0**-10, "float32": 8 * 2.0**-23}
FIX_OVERFLOW = (
    "Fix: compute the part that overflows in float32 inside the layer (x.astype(jnp.float32), "
    "then cast the result back), rescale it, or train with precision='bfloat16' (float32's range)."
)


def _asked(s: LayerSubject) -> str:
    """The precision asked for (the checks that call this ran only when one was)."""
    assert s.precision is not None
    return s.precision


def _dtype(s: LayerSubject) -> Any:
    """The compute dtype asked for."""
    return DTYPES[_asked(s)]


def _rounded(s: LayerSubject):
    """The layer and inputs rounded to the compute dtype (learnables and inputs; the state
    stays float32, as in training), as float32 values."""
    dtype = _dtype(s)
    layer = s.layer
    learnables = {n: getattr(layer, n) for n in layer.learnable_names}
    rounded = cast_floating(cast_floating(learnables, dtype), jnp.float32)
    xs = cast_floating(cast_floating(s.xs, dtype), jnp.float32)
    return layer.replace(**rounded), xs


def _not_asked(s: LayerSubject):
    if s.precision is None:
        return skipped("no precision given; check_layer(..., precision='bfloat16') runs it")
    s.require("forwarded")
    return None


def _compare(what: str, low, ref, s: LayerSubject) -> str | None:
    """A problem with ``low`` (at the compute dtype) against ``ref`` (float32), in words."""
    low = np.asarray(jnp.asarray(low, jnp.float32), np.float64)
    ref = np.asarray(ref, np.float64)
    if not np.all(np.isfinite(ref)):
        raise incomplete(f"{what} is not finite in float32 either; nothing to compare")
    bad = ~np.isfinite(low)
    if bad.any():
        return (
            f"{what} overflows in {s.precision}: {int(bad.sum())} of {bad.size} values are inf or "
            f"NaN (finite in float32, largest magnitude {np.max(np.abs(ref)):.4g})."
        )
    scale = float(np.linalg.norm(ref))
    error = float(np.linalg.norm(low - ref))
    tol = TOLERANCES[_asked(s)]
    if error > tol * max(scale, np.finfo(np.float32).tiny):
        worst = np.unravel_index(int(np.argmax(np.abs(low - ref))), ref.shape)
        return (
            f"{what} differs from float32 on the same rounded values by {error / scale:.3g} "
            f"(normwise, relative; the {s.precision} tolerance is {tol:.3g}); largest at "
            f"{tuple(int(i) for i in worst)}: got {low[worst]:.6g}, float32 {ref[worst]:.6g}."
        )
    return None


def _verdict(s: LayerSubject, problems: list[str], fix: str):
    if not problems:
        return None
    overflow = any("overflows" in p for p in problems)
    name = type(s.layer).__name__ + (f" (layer {s.layer.name!r})" if s.layer.name else "")
    return failed(
        f"{name} at precision={s.precision!r}:\n  "
        + "\n  ".join(problems)
        + "\n"
        + (FIX_OVERFLOW if overflow else fix)
    )


def forward_agrees_at_precision(s: LayerSubject):
    """``forward_agrees_at_precision``: the outputs at the compute dtype agree with float32."""
    if (outcome := _not_asked(s)) is not None:
        return outcome
    layer, xs = _rounded(s)
    dtype = _dtype(s)
    ref = s.run(layer, xs, True)[0]
    low = s.run(_learnables_in(layer, dtype), cast_floating(xs, dtype), True)[0]
    problems = [
        p
        for name, a, b in zip(s.names["outputs"], low, ref, strict=True)
        if (p := _compare(f"forward output {name!r}", stripdims(a), stripdims(b), s))
    ]
    return _verdict(
        s,
        problems,
        "Fix: look for a step that loses precision in the compute dtype (a large sum, a "
        "difference of close values) and compute it in float32 inside the layer.",
    )


def gradients_agree_at_precision(s: LayerSubject):
    """``gradients_agree_at_precision``: the gradients at the compute dtype agree with float32
    autodiff of the forward."""
    if (outcome := _not_asked(s)) is not None:
        return outcome
    layer, xs = _rounded(s)
    outs = s.forwarded[0]
    dys = tuple(
        jnp.asarray(s.data.normal(50 + i, stripdims(y).shape, _dtype(s)), jnp.float32)
        for i, y in enumerate(outs)
    )
    names = tuple(layer.learnable_names)
    values = tuple(getattr(layer, n) for n in names)
    common = (layer, names, values, xs, dys, s.forward_key)
    static = {"formats": s.formats}
    jit = s.cls.acceleratable
    ref = (_gradients_jit if jit else _gradients)(*common, **static, dtype=None, custom=False)
    low = (_gradients_jit if jit else _gradients)(*common, **static, dtype=s.precision, custom=True)
    what = [f"dLd{n} (input)" for n in s.names["inputs"]]
    what += [f"dLd{n} (learnable)" for n in names]
    problems = []
    for label, a, b in zip(what, [*low[0], *low[1]], [*ref[0], *ref[1]], strict=True):
        for leaf_a, leaf_b in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            if (p := _compare(f"gradient {label}", leaf_a, leaf_b, s)) is not None:
                problems.append(p)
                break
    source = "the custom backward" if s.custom_backward else "JAX autodiff of forward"
    return _verdict(
        s,
        problems,
        f"Fix: the gradients come from {source}; if it is right in float32 "
        "(gradients_are_correct), compute the step that loses precision in float32.",
    )


def _learnables_in(layer, dtype):
    return layer.replace(
        **cast_floating({n: getattr(layer, n) for n in layer.learnable_names}, dtype)
    )


def _gradients(layer, names, values, xs, dys, key, *, formats, dtype, custom):
    """Gradients of ``sum(dLdY * Y)`` (float32 outputs) w.r.t. ``(xs, values)``; the layer runs
    on them cast to ``dtype`` (None: float32) through its custom backward (``custom``) or as
    plain JAX (autodiff)."""

    def loss(xs, values):
        low = dict(zip(names, values, strict=True))
        if dtype is not None:
            xs, low = cast_floating(xs, DTYPES[dtype]), cast_floating(low, DTYPES[dtype])
        this = layer.replace(**low)
        inputs = user_inputs(this, xs, formats)
        if custom:
            outs, _ = call_layer(this, inputs, training=True, key=key)
        else:
            outs = run_user(this, inputs, True, key)[0]
        return sum(
            jnp.sum(jnp.asarray(stripdims(y), jnp.float32) * dy)
            for y, dy in zip(outs, dys, strict=False)
        )

    return jax.grad(loss, argnums=(0, 1))(xs, values)


_gradients_jit = functools.partial(
    jax.jit, static_argnames=("names", "formats", "dtype", "custom")
)(_gradients)
