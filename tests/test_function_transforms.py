"""DifferentiableFunction's batching rule, rematerialization and memory lifetime.

The batching rule is compared with JAX's default batching of the same math; the remat counts
with a hand-written ``jax.custom_vjp(..., optimize_remat=True)`` around the same counted kernel.
"""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose

import difffn as df

# --------------------------------------------------------------------------------------------
# the vmap method: a jax.custom_batching.custom_vmap rule that gradients still go around


class RowScale(df.DifferentiableFunction):
    """x * w per row; its batching rule records what it was given."""

    save_inputs_for_backward = True
    log: list = []

    def forward(self, x, w):
        return x * w

    def backward(self, dy, compute_gradients, x, w):
        RowScale.log.append("backward")
        dx = dy * w if compute_gradients[0] else None
        dw = jnp.sum(dy * x) if compute_gradients[1] else None
        return dx, dw

    def vmap(self, axis_size, in_batched, x, w):
        RowScale.log.append(("vmap", axis_size, tuple(in_batched)))
        x_batched, w_batched = in_batched
        if not x_batched:
            x = jnp.broadcast_to(x, (axis_size, *x.shape))
        w = w if w_batched else jnp.broadcast_to(w, (axis_size,))
        return x * w.reshape((axis_size,) + (1,) * (x.ndim - 1)), True


def row_scale(x, w):
    return x * w


VMAP = {
    "vmap": lambda f, x, w: jax.vmap(f, (0, None))(x, w),
    "vmap over w": lambda f, x, w: jax.vmap(f, (None, 0))(x[0], jnp.stack([w, 2 * w])),
    "jit(vmap)": lambda f, x, w: jax.jit(jax.vmap(f, (0, 0)))(x, jnp.stack([w, -w])),
    "grad(vmap)": lambda f, x, w: jax.grad(
        lambda x, w: jnp.sum(jnp.sin(jax.vmap(f, (0, None))(x, w))), (0, 1)
    )(x, w),
    "vmap(grad)": lambda f, x, w: jax.vmap(
        jax.grad(lambda x, w: jnp.sum(jnp.sin(f(x, w))), (0, 1)), (0, None)
    )(x, w),
    "vmap(grad(vmap))": lambda f, x, w: jax.vmap(
        jax.grad(lambda x: jnp.sum(jnp.sin(jax.vmap(f, (0, None))(x, w))))
    )(jnp.stack([x, 2 * x])),
    "vmap(vmap)": lambda f, x, w: jax.vmap(jax.vmap(f, (0, None)), (0, None))(
        jnp.stack([x, -x]), w
    ),
}


@pytest.mark.parametrize("name", list(VMAP))
def test_vmap_rule_matches_default_batching(name, x64):
    x, w = jnp.arange(6.0).reshape(2, 3) / 3, jnp.array(1.5)
    RowScale.log.clear()
    got = VMAP[name](RowScale(), x, w)
    assert_tree_allclose(got, VMAP[name](row_scale, x, w), rtol=1e-12)
    assert any(isinstance(entry, tuple) for entry in RowScale.log), "the rule was not used"
    if "grad" in name:
        assert "backward" in RowScale.log  # gradients still use the user's backward


def test_vmap_rule_receives_axis_size_and_batched_flags():
    x, w = jnp.ones((4, 3)), jnp.array(2.0)
    RowScale.log.clear()
    jax.vmap(RowScale(), (0, None))(x, w)
    assert RowScale.log and set(RowScale.log) == {("vmap", 4, (True, False))}


def test_vmap_rule_with_pytree_inputs_and_memory(x64):
    class Normalize(df.DifferentiableFunction):
        """x / |x| per row; the rule sees the whole batch (e.g. one kernel launch)."""

        num_memory_values = 1
        batch_sizes: list = []

        def forward(self, inputs):
            norm = jnp.linalg.norm(inputs["x"])
            return inputs["x"] / norm, norm

        def backward(self, dy, compute_gradients, norm):
            raise AssertionError("not differentiated in this test")

        def vmap(self, axis_size, in_batched, inputs):
            Normalize.batch_sizes.append(axis_size)
            assert in_batched == ({"x": True},)
            norm = jnp.linalg.norm(inputs["x"], axis=1, keepdims=True)
            return (inputs["x"] / norm, norm[:, 0]), (True, True)

    x = jnp.arange(1.0, 7.0).reshape(2, 3)
    got = jax.vmap(lambda x: Normalize()({"x": x}))(x)
    np.testing.assert_allclose(got, x / jnp.linalg.norm(x, axis=1, keepdims=True))
    assert Normalize.batch_sizes and set(Normalize.batch_sizes) == {2}


# --------------------------------------------------------------------------------------------
# remat: an opaque kernel, counted, runs no more often than under a hand-written custom_vjp
# with optimize_remat=True

CALLS = [0]


def kernel(x):
    """sin(x) on the host: opaque to XLA, so every run is counted."""

    def host(x):
        CALLS[0] += 1
        return np.sin(x)

    return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


class Kernel(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, x, w):
        return kernel(x) * w

    def backward(self, dy, compute_gradients, x, w):
        return dy * jnp.cos(x) * w, jnp.sum(dy * jnp.sin(x))


class KernelMemory(df.DifferentiableFunction):
    """The kernel's output is also the backward's memory (a residual from the kernel)."""

    save_inputs_for_backward = True
    num_memory_values = 1

    def forward(self, x, w):
        s = kernel(x)
        return s * w, s

    def backward(self, dy, compute_gradients, x, w, s):
        return dy * jnp.cos(x) * w, jnp.sum(dy * s)


def hand_written(with_memory: bool):
    @jax.custom_vjp
    def f(x, w):
        return kernel(x) * w

    def fwd(x, w):
        if with_memory:
            s = kernel(x)
            return s * w, (x, w, s)
        return f(x, w), (x, w, None)

    def bwd(residuals, dy):
        x, w, s = residuals
        return dy * jnp.cos(x) * w, jnp.sum(dy * (jnp.sin(x) if s is None else s))

    f.defvjp(fwd, bwd, optimize_remat=True)
    return f


POLICIES = {
    "no checkpoint": None,
    "checkpoint": "default",
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "everything_saveable": jax.checkpoint_policies.everything_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "remat": "remat",
}


def count_kernel_runs(fn, policy, jit, loss):
    def objective(x, w):
        return loss(fn(x, w))

    if policy == "default":
        objective = jax.checkpoint(objective)
    elif policy == "remat":
        objective = jax.remat(objective)
    elif policy is not None:
        objective = jax.checkpoint(objective, policy=policy)
    grad = jax.grad(objective, (0, 1))
    grad = jax.jit(grad) if jit else grad
    CALLS[0] = 0
    jax.block_until_ready(grad(jnp.linspace(0.0, 1.0, 4), jnp.array(2.0)))
    return CALLS[0]


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("loss", [jnp.sum, lambda y: jnp.sum(jnp.tanh(y))], ids=["linear", "tanh"])
@pytest.mark.parametrize("memory", [False, True], ids=["inputs saved", "kernel memory"])
def test_remat_runs_the_forward_no_more_than_optimize_remat(policy, jit, loss, memory):
    fcn = KernelMemory() if memory else Kernel()
    ours = count_kernel_runs(fcn, POLICIES[policy], jit, loss)
    theirs = count_kernel_runs(hand_written(memory), POLICIES[policy], jit, loss)
    assert ours <= theirs, f"difffn ran the kernel {ours} times, custom_vjp {theirs}"


def test_remat_counts_are_real():
    """The counter sees recomputation: checkpoint without saved residuals runs the kernel twice."""
    assert (
        count_kernel_runs(
            KernelMemory(),
            jax.checkpoint_policies.nothing_saveable,
            False,
            lambda y: jnp.sum(jnp.tanh(y)),
        )
        == 2
    )
    assert count_kernel_runs(KernelMemory(), None, False, lambda y: jnp.sum(jnp.tanh(y))) == 1


# --------------------------------------------------------------------------------------------
# memory lifetime: nothing keeps a dropped class or what it captured alive


def _local_class_used_under_jit(transform):
    captured = jnp.ones(1000)

    class Local(df.DifferentiableFunction):
        num_memory_values = 1

        def forward(self, x):
            return jnp.sin(x) * captured, jnp.cos(x) * captured

        def backward(self, dy, compute_gradients, memory):
            return jnp.sum(dy * memory)

    transform(lambda x: jnp.sum(Local()(x)))(1.0)
    return weakref.ref(Local), weakref.ref(captured)


@pytest.mark.parametrize(
    "transform",
    [jax.grad, lambda f: jax.jit(jax.grad(f)), lambda f: jax.grad(jax.grad(f)), jax.jacrev],
    ids=["grad", "jit(grad)", "grad(grad)", "jacrev"],
)
def test_a_dropped_class_and_its_captured_arrays_are_freed(transform):
    cls, captured = _local_class_used_under_jit(transform)
    gc.collect()
    assert cls() is None and captured() is None


def test_module_level_classes_are_static_jit_arguments():
    apply = jax.jit(lambda fcn, x, w: fcn(x, w))
    apply(RowScale(), jnp.ones(3), jnp.array(2.0))
    apply(RowScale(), jnp.ones(3), jnp.array(3.0))
    assert apply._cache_size() == 1
