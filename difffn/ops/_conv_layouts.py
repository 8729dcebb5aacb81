"""An ungrouped convolution whose gradients XLA:CPU runs with its fast kernels, in loops too.

XLA:CPU runs a convolution with its fast (Eigen or YNNPACK) kernels only in the canonical
layout: data ``(batch, spatial..., channels)``, kernel ``(spatial..., in, out)``, output like the
data. Its ``ConvCanonicalization`` pass rewrites other convolutions into that layout with
transposes, but only the top-level ones (its header: "all top-level convolutions"): a
convolution inside a loop body (``lax.scan``, ``fori_loop``, ``while_loop``) keeps its layout
and is compiled as a naive loop nest. JAX's transposes of a convolution are never canonical (the
filter gradient swaps the data's batch and channel roles, ``f01b_i01o->01bf``; the input
gradient takes the kernel's out and in swapped, ``01oi``), so a training step run in a loop
(``trainnet``'s ``steps_per_execution``, a user's ``lax.scan`` over steps) spent 6-50 times
longer in them in our runs (``benchmarks/repro_cpu_kernels.py``: "the same, in a fori_loop").

``conv`` computes the same convolution under a ``jax.custom_jvp`` whose tangent is written on
operands transposed so that JAX's transpose of each term is canonical: the filter gradient
multiplies the data laid out ``(channels, spatial..., batch)`` by the output cotangent laid out
``(spatial..., batch, out)``, the input gradient the cotangent by the kernel laid out
``(spatial..., out, in)``. The transposes are the ones ``ConvCanonicalization`` inserts at the
top level, so a step outside a loop runs the same kinds of kernels (the benchmark ResNet's
hand-written step: 110 ms per step either way, the same first losses; one run each). Its
tangent rule takes symbolic zeros, so a term nobody differentiates (the data of a first layer)
is not computed. Forward mode gets the
transposed forms, which the top level canonicalizes back.

Written by hand because the layout is XLA:CPU's business and no library works around this; it
is a few transposes, and ``tests/test_ops_conv_layouts.py`` compares values, gradients,
second derivatives and forward mode with ``jax.lax.conv_general_dilated`` differentiated by JAX.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

Pads = tuple[tuple[int, int], ...]


def canonical_spec(letters: str) -> str:
    """The data layout XLA:CPU's convolution kernels take: ``"N" + letters + "C"``."""
    return "N" + letters + "C"


def _order(src: str, dst: str) -> list[int]:
    return [src.index(c) for c in dst]


def _lax(x, w, strides, pads, dilation, lhs: str, rhs: str, out: str):
    return lax.conv_general_dilated(
        x, w, strides, pads, rhs_dilation=dilation, dimension_numbers=(lhs, rhs, out)
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5))
def conv(x, w, strides: tuple[int, ...], pads: Pads, dilation: tuple[int, ...], spec: str):
    """``lax.conv_general_dilated(x, w, ...)`` with ``x`` and the output in ``spec`` (``N``,
    ``C`` and the window's letters, any order) and ``w`` in ``letters + "IO"``; one group."""
    letters = spec.replace("N", "").replace("C", "")
    kernel = letters + "IO"
    canonical = canonical_spec(letters)
    if spec == canonical:
        return _lax(x, w, strides, pads, dilation, spec, kernel, spec)
    y = _lax(x.transpose(_order(spec, canonical)), w, strides, pads, dilation, canonical, kernel,
             canonical)  # fmt: skip
    return y.transpose(_order(canonical, spec))


def _conv_jvp(strides, pads, dilation, spec, primals, tangents):
    x, w = primals
    x_dot, w_dot = tangents
    letters = spec.replace("N", "").replace("C", "")
    kernel, canonical = letters + "IO", canonical_spec(letters)
    y = conv(x, w, strides, pads, dilation, spec)
    terms = []
    if not isinstance(x_dot, SymbolicZero):
        # transposed: the cotangent (N...C) times the kernel read as (..., in=O, out=I)
        swapped = letters + "OI"
        t = _lax(x_dot.transpose(_order(spec, canonical)), w.transpose(_order(kernel, swapped)),
                 strides, pads, dilation, canonical, swapped, canonical)  # fmt: skip
        terms.append(t.transpose(_order(canonical, spec)))
    if not isinstance(w_dot, SymbolicZero):
        # transposed: the data as (C, ..., N) times the cotangent as (..., N, O) -> (I, ..., O)
        data, filt, out = "C" + letters + "N", "I" + letters + "O", letters + "NC"
        t = _lax(x.transpose(_order(spec, data)), w_dot.transpose(_order(kernel, filt)),
                 strides, pads, dilation, data, filt, out)  # fmt: skip
        terms.append(t.transpose(_order(out, spec)))
    if not terms:  # never: JAX calls the rule only with a nonzero tangent
        return y, jnp.zeros_like(y)
    return y, terms[0] if len(terms) == 1 else terms[0] + terms[1]


conv.defjvp(_conv_jvp, symbolic_zeros=True)


def fits(groups: int) -> bool:
    """Whether ``conv`` computes this convolution: one group, on XLA:CPU (other backends
    choose their layouts themselves; this leaves them the lax convolution as it is)."""
    return groups == 1 and jax.default_backend() == "cpu"
