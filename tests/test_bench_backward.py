"""The examples' hand-written backwards (benchmarks/bench_backward.py's subjects) against autodiff.

The benchmark times each custom backward against autodiff of the same forward; these tests hold
the two to the same numbers in float64 (every input's and parameter's gradient, jitted), at the
ties of SReLU's regions too, and run the checkers on the DifferentiableFunctions (the layers'
``check_layer`` runs in their example scripts). The formulations are shaped for XLA's CPU
backend; what they compute must not change with that.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from helpers import assert_tree_allclose

import difffn as df
from benchmarks import bench_backward
from benchmarks._examples import load

SHAPE = (3, 5, 4, 6)
SRELU = [name for name in bench_backward.NAMES if "SReLU" in name]


def _gradients(name, x, dy):
    params, custom, autodiff = bench_backward.subjects(x.shape, x.dtype)[name]
    got = bench_backward.gradient_step(custom)(params, x, dy)
    want = bench_backward.gradient_step(autodiff)(params, x, dy)
    return got, want


@pytest.mark.parametrize("name", bench_backward.NAMES)
def test_custom_backward_matches_autodiff_in_float64(name, key, x64):
    kx, kd = jax.random.split(key)
    x = 1.5 * jax.random.normal(kx, SHAPE, jnp.float64)  # every region of every subject
    dy = jax.random.normal(kd, SHAPE, jnp.float64)
    got, want = _gradients(name, x, dy)
    assert jax.tree.leaves(got)[0].dtype == jnp.float64
    assert_tree_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", SRELU)
def test_srelu_backward_at_the_thresholds_matches_autodiff(name, key, x64):
    """x exactly at tl or tr: the left/right branch owns the tie, in backward as in predict."""
    params, _, _ = bench_backward.subjects(SHAPE, jnp.float64)[name]
    leaves = jax.tree.leaves(params)
    tl, tr = leaves[0], leaves[2]  # (tl, al, tr, ar) in both the functions and the layers
    x = jax.random.normal(key, SHAPE, jnp.float64)
    x = (
        x.at[0]
        .set(jnp.broadcast_to(tl[0], SHAPE[1:]))
        .at[1]
        .set(jnp.broadcast_to(tr[0], SHAPE[1:]))
    )
    got, want = _gradients(name, x, jnp.ones(SHAPE, jnp.float64))
    assert_tree_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("stem", "make"),
    [
        ("01_srelu_function", lambda m: m.SReLUFunction("BSSC")),
        ("08_custom_loop_srelu", lambda m: m.SReLU()),
    ],
    ids=["01", "08"],
)
def test_check_function_passes_on_the_srelu_functions(stem, make, key):
    channel = (1, 1, 1, 3)
    x = 1.5 * jax.random.normal(key, (2, 3, 3, 3))
    params = (
        jnp.full(channel, -0.5),
        jnp.full(channel, 0.2),
        jnp.full(channel, 0.5),
        jnp.full(channel, 0.3),
    )
    report = df.check_function(make(load(stem)), x, *params)
    assert report.ok, str(report)
    assert report["gradients_are_correct[x]"].status == "Passed"


def test_srelu_layer_02_with_overlapping_thresholds_matches_autodiff(key, x64):
    """tl > tr: predict gives x <= tl to the left branch, and 02's backward (one compare for the
    right region, x >= max(tr, nextafter(tl, inf))) must agree, at the tie x == tl too."""
    layer, custom, autodiff = bench_backward.subjects(SHAPE, jnp.float64)["02 SReLU layer"]
    layer = layer.replace(
        left_threshold=layer.right_threshold, right_threshold=layer.left_threshold
    )
    x = jax.random.normal(key, SHAPE, jnp.float64)
    x = x.at[0].set(jnp.broadcast_to(layer.left_threshold[0], SHAPE[1:]))
    dy = jnp.ones(SHAPE, jnp.float64)
    got = bench_backward.gradient_step(custom)(layer, x, dy)
    want = bench_backward.gradient_step(autodiff)(layer, x, dy)
    assert_tree_allclose(got, want, rtol=1e-12, atol=1e-12)
