"""Layers and functions for the checker's tests: the seeds' layers written correctly, and bugs.

Written from the formulas (not from any document's code):

* SReLU, per channel: ``tl + al (x - tl)`` for ``x <= tl``, ``x`` between, ``tr + ar (x - tr)``
  for ``x >= tr``; its derivatives: ``dY/dX`` is ``al``, 1 or ``ar``; ``dY/dtl = 1 - al`` and
  ``dY/dal = x - tl`` on the left; ``dY/dtr = 1 - ar`` and ``dY/dar = x - tr`` on the right.
* PReLU: ``max(x, 0) + alpha min(x, 0)``; ``dY/dX`` is 1 or ``alpha``, ``dY/dalpha = min(x, 0)``.
* ELU: ``x`` for ``x > 0``, ``alpha (exp(x) - 1)`` otherwise; ``dY/dX = alpha exp(x)`` and
  ``dY/dalpha = exp(x) - 1`` on the left.

Each per-channel parameter has size 1 on every axis but the channel axis, so its gradient is the
sum over the axes where it was broadcast. The buggy variants each carry one realistic mistake:
(a) the chain rule missing in dLdX, (b) two learnable gradients swapped, (c) the ELU blog's
``exp(min(x, 0) - 1)`` typo, (d) a gradient summed over the wrong axes, (e) a backward that
ignores the memory value it needs; plus layers with a wrong dtype, forward/predict sizes that
disagree, invalid state, and an initialize that overwrites set parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import difffn as df


def channel_shape(layout: df.Layout) -> tuple[int, ...]:
    """Size 1 on every axis but C."""
    shape = [1] * layout.ndim
    shape[layout.finddim("C")[0]] = layout.size("C")
    return tuple(shape)


def broadcast_sum(v, like):
    """Sum ``v`` over the axes where ``like`` (a parameter) has size 1: its gradient's shape.

    Only the parameter's (static) sizes decide, so this also works for a symbolic batch size.
    """
    axes = tuple(i for i, n in enumerate(like.shape) if n == 1)
    return jnp.sum(v, axis=axes, keepdims=True)


# -- SReLU ---------------------------------------------------------------------------------------


class SReLULayer(df.Layer):
    """SReLU with per-channel thresholds and slopes, and a backward written from the formulas."""

    left_threshold: jax.Array | None = df.learnable()
    left_slope: jax.Array | None = df.learnable()
    right_threshold: jax.Array | None = df.learnable()
    right_slope: jax.Array | None = df.learnable()

    def initialize(self, layout, *, key):
        shape = channel_shape(layout)
        k = jax.random.split(key, 4)
        ranges = {
            "left_threshold": (-0.6, -0.1),
            "left_slope": (0.0, 0.5),
            "right_threshold": (0.1, 0.6),
            "right_slope": (0.0, 0.5),
        }
        new = {}
        for kk, (name, (lo, hi)) in zip(k, ranges.items(), strict=True):
            if getattr(self, name) is None:
                new[name] = jax.random.uniform(kk, shape, minval=lo, maxval=hi)
        return self.replace(**new)

    def predict(self, x):
        tl, al = self.left_threshold, self.left_slope
        tr, ar = self.right_threshold, self.right_slope
        return jnp.where(x <= tl, tl + al * (x - tl), jnp.where(x >= tr, tr + ar * (x - tr), x))

    def gradients(self, x, dy):
        tl, al = self.left_threshold, self.left_slope
        tr, ar = self.right_threshold, self.right_slope
        left, right = x <= tl, x >= tr
        dx = dy * jnp.where(left, al, jnp.where(right, ar, 1.0))
        dtl = broadcast_sum(jnp.where(left, dy * (1 - al), 0.0), tl)
        dal = broadcast_sum(jnp.where(left, dy * (x - tl), 0.0), al)
        dtr = broadcast_sum(jnp.where(right, dy * (1 - ar), 0.0), tr)
        dar = broadcast_sum(jnp.where(right, dy * (x - tr), 0.0), ar)
        return dx, dtl, dal, dtr, dar

    def backward(self, x, y, dy, memory):
        return self.gradients(x, dy)


class SReLUNoChainRule(SReLULayer):
    """(a) dLdX is dY/dX: the upstream gradient dLdY is never multiplied in."""

    def backward(self, x, y, dy, memory):
        _, dtl, dal, dtr, dar = self.gradients(x, dy)
        tl, al, tr, ar = (
            self.left_threshold,
            self.left_slope,
            self.right_threshold,
            self.right_slope,
        )
        dx = jnp.where(x <= tl, al, jnp.where(x >= tr, ar, 1.0))
        return dx, dtl, dal, dtr, dar


class SReLUSwapped(SReLULayer):
    """(b) The gradients of left_threshold and left_slope come back in each other's place."""

    def backward(self, x, y, dy, memory):
        dx, dtl, dal, dtr, dar = self.gradients(x, dy)
        return dx, dal, dtl, dtr, dar


# -- PReLU ---------------------------------------------------------------------------------------


class PReLULayer(df.Layer):
    """PReLU with a per-channel alpha."""

    alpha: jax.Array | None = df.learnable()

    def initialize(self, layout, *, key):
        if self.alpha is not None:
            return self
        return self.replace(alpha=jax.random.uniform(key, channel_shape(layout), maxval=0.5))

    def predict(self, x):
        return jnp.maximum(x, 0) + self.alpha * jnp.minimum(x, 0)

    def backward(self, x, y, dy, memory):
        dx = dy * jnp.where(x > 0, 1.0, self.alpha)
        dalpha = broadcast_sum(dy * jnp.minimum(x, 0), self.alpha)
        return dx, dalpha


class PReLUWrongAxes(PReLULayer):
    """(d) dLdalpha has the right shape but sums over the wrong elements: a reshape to (C, -1)
    of channel-last data groups consecutive elements, not channels (a column-major habit)."""

    def backward(self, x, y, dy, memory):
        dx = dy * jnp.where(x > 0, 1.0, self.alpha)
        channels = self.alpha.size
        dalpha = jnp.sum((dy * jnp.minimum(x, 0)).reshape(channels, -1), axis=1)
        return dx, dalpha.reshape(self.alpha.shape)


# -- ELU -----------------------------------------------------------------------------------------


class ELULayer(df.Layer):
    """ELU with a learnable per-channel alpha."""

    alpha: jax.Array | None = df.learnable()

    def initialize(self, layout, *, key):
        if self.alpha is not None:
            return self
        shape = channel_shape(layout)
        return self.replace(alpha=jax.random.uniform(key, shape, minval=0.5, maxval=1.5))

    def predict(self, x):
        return jnp.where(x > 0, x, self.alpha * (jnp.exp(jnp.minimum(x, 0)) - 1))

    def backward(self, x, y, dy, memory):
        negative = x <= 0
        dx = dy * jnp.where(negative, self.alpha + y, 1.0)  # alpha exp(x) = alpha + y there
        dalpha = broadcast_sum(dy * (jnp.exp(jnp.minimum(x, 0)) - 1), self.alpha)
        return dx, dalpha


class ELUTypo(ELULayer):
    """(c) The blog's typo: exp(min(x, 0) - 1) where exp(min(x, 0)) - 1 was meant."""

    def backward(self, x, y, dy, memory):
        negative = x <= 0
        dx = dy * jnp.where(negative, self.alpha + y, 1.0)
        dalpha = broadcast_sum(dy * jnp.exp(jnp.minimum(x, 0) - 1), self.alpha)
        return dx, dalpha


class ELUWithMemory(ELULayer):
    """ELU whose forward hands exp(min(x, 0)) to backward as its memory value."""

    def forward(self, x, key=None):
        e = jnp.exp(jnp.minimum(x, 0))
        return jnp.where(x > 0, x, self.alpha * (e - 1)), e

    def backward(self, x, y, dy, memory):
        dx = dy * jnp.where(x > 0, 1.0, self.alpha * memory)
        dalpha = broadcast_sum(dy * (memory - 1), self.alpha)
        return dx, dalpha


class ELUIgnoresMemory(ELUWithMemory):
    """(e) dLdX ignores the memory value exp(min(x, 0)) and uses 1 in its place."""

    def backward(self, x, y, dy, memory):
        dx = dy * jnp.where(x > 0, 1.0, self.alpha)
        dalpha = broadcast_sum(dy * (memory - 1), self.alpha)
        return dx, dalpha


# -- more layers: several inputs, state, formats, kinks, no backward ------------------------------


class WeightedSum(df.Layer):
    """Two inputs weighted by two learnable scalars, with a backward."""

    weights: jax.Array | None = df.learnable(default_factory=lambda: jnp.array([0.3, 0.7]))

    def predict(self, a, b):
        return self.weights[0] * a + self.weights[1] * b

    def backward(self, a, b, y, dy, memory):
        dw = jnp.stack([jnp.sum(dy * a), jnp.sum(dy * b)])
        return dy * self.weights[0], dy * self.weights[1], dw


class ScaleAndSine(df.Layer):
    """Two outputs, ``w x`` and ``sin(x)``, with a backward."""

    num_outputs = 2
    w: jax.Array | None = df.learnable(default_factory=lambda: jnp.array(2.0))

    def predict(self, x):
        return x * self.w, jnp.sin(x)

    def backward(self, x, y1, y2, dy1, dy2, memory):
        return dy1 * self.w + dy2 * jnp.cos(x), jnp.sum(dy1 * x)


class ScaleAndSineWrongOutput(ScaleAndSine):
    """dL/dw uses the upstream gradient of the wrong output."""

    def backward(self, x, y1, y2, dy1, dy2, memory):
        return dy1 * self.w + dy2 * jnp.cos(x), jnp.sum(dy2 * x)


class Accumulator(df.Layer):
    """A state that sums half the scaled input; backward takes dL/dSout and returns dL/dSin."""

    total: jax.Array | None = df.state(default_factory=lambda: jnp.zeros((1, 3)))
    scale: jax.Array | None = df.learnable(default_factory=lambda: jnp.ones((1, 3)))

    def predict(self, x):
        y = x * self.scale
        return y, self.total + 0.5 * jnp.sum(y, axis=0, keepdims=True)

    def backward(self, x, y, dy, dtotal, memory):
        dx = (dy + 0.5 * dtotal) * self.scale
        dscale = jnp.sum((dy + 0.5 * dtotal) * x, axis=0, keepdims=True)
        return dx, dscale, dtotal


class ShiftedReLU(df.Layer):
    """``x + relu(bias)`` with the bias at 0: every bias element sits on relu's kink."""

    bias: jax.Array | None = df.learnable()

    def initialize(self, layout, *, key):
        if self.bias is not None:
            return self
        return self.replace(bias=jnp.zeros(channel_shape(layout)))

    def predict(self, x):
        return x + jnp.maximum(self.bias, 0)

    def backward(self, x, y, dy, memory):
        return dy, broadcast_sum(jnp.where(self.bias > 0, dy, 0.0), self.bias)


class RunningMean(df.Layer):
    """Subtracts a running mean (state) that predict and forward update; autodiff only."""

    mean: jax.Array | None = df.state()
    scale: jax.Array | None = df.learnable()

    def initialize(self, layout, *, key):
        shape = channel_shape(layout)
        new = {}
        if self.mean is None:
            new["mean"] = jnp.zeros(shape)
        if self.scale is None:
            new["scale"] = jnp.ones(shape)
        return self.replace(**new)

    def predict(self, x):
        update = jnp.mean(x, axis=tuple(i for i, n in enumerate(self.mean.shape) if n == 1))
        new_mean = 0.9 * self.mean + 0.1 * update.reshape(self.mean.shape)
        return (x - self.mean) * self.scale, new_mean


class ChannelPool(df.Layer):
    """Formattable: averages the spatial axes, "BSSC" -> "BC"; autodiff only."""

    formattable = True
    weight: jax.Array | None = df.learnable()

    def initialize(self, layout, *, key):
        if self.weight is not None:
            return self
        return self.replace(weight=jax.random.normal(key, (layout.size("C"),)))

    def predict(self, x):
        spatial = df.finddim(x, "S")
        fmt = "".join(label for label in x.format if label != "S")
        pooled = jnp.mean(df.stripdims(x), axis=spatial)  # "BC": channels last
        return df.dlarray(pooled * self.weight[None, :], fmt)


class EagerTanh(df.Layer):
    """Python control flow on values (acceleratable = False), so JAX cannot trace or
    differentiate it: the custom backward is what makes it trainable."""

    acceleratable = False
    gain: jax.Array | None = df.learnable(default_factory=lambda: jnp.array(1.5))

    def predict(self, x):
        if float(jnp.max(jnp.abs(x))) > 1e6:  # a value-dependent Python branch
            x = jnp.clip(x, -1e6, 1e6)
        return jnp.tanh(x) * self.gain

    def backward(self, x, y, dy, memory):
        t = jnp.tanh(x)
        return dy * self.gain * (1 - t**2), jnp.sum(dy * t)


# -- layers with other defects --------------------------------------------------------------------


class DtypeChanging(PReLULayer):
    """predict always computes in float32 (a fixed-dtype cast)."""

    def predict(self, x):
        return (jnp.maximum(x, 0) + self.alpha * jnp.minimum(x, 0)).astype(jnp.float32)

    backward = None


class SizeMismatch(PReLULayer):
    """forward drops the last channel; predict does not."""

    def forward(self, x, key=None):
        return self.predict(x)[..., :-1]

    backward = None


class BadState(df.Layer):
    """predict returns a per-observation sum as the new state, not a value of the field's shape."""

    count: jax.Array | None = df.state(default_factory=lambda: jnp.zeros((3,)))

    def predict(self, x):
        return 2 * x, jnp.sum(x, axis=0)


class OverwritingInitialize(PReLULayer):
    """initialize draws alpha again even when it is already set."""

    def initialize(self, layout, *, key):
        return self.replace(alpha=jax.random.uniform(key, channel_shape(layout), maxval=0.5))


# -- DifferentiableFunction versions --------------------------------------------------------------


class SReLUFunction(df.DifferentiableFunction):
    """SReLU as a DifferentiableFunction (inputs x, tl, al, tr, ar)."""

    save_inputs_for_backward = True

    def forward(self, x, tl, al, tr, ar):
        return jnp.where(x <= tl, tl + al * (x - tl), jnp.where(x >= tr, tr + ar * (x - tr), x))

    def gradients(self, dy, x, tl, al, tr, ar):
        left, right = x <= tl, x >= tr
        dx = dy * jnp.where(left, al, jnp.where(right, ar, 1.0))
        dtl = broadcast_sum(jnp.where(left, dy * (1 - al), 0.0), tl)
        dal = broadcast_sum(jnp.where(left, dy * (x - tl), 0.0), al)
        dtr = broadcast_sum(jnp.where(right, dy * (1 - ar), 0.0), tr)
        dar = broadcast_sum(jnp.where(right, dy * (x - tr), 0.0), ar)
        return dx, dtl, dal, dtr, dar

    def backward(self, dy, compute_gradients, x, tl, al, tr, ar):
        grads = self.gradients(dy, x, tl, al, tr, ar)
        return tuple(
            g if wanted else None for g, wanted in zip(grads, compute_gradients, strict=True)
        )


class SReLUFunctionSwapped(SReLUFunction):
    """The gradients of the right threshold and right slope come back swapped."""

    def backward(self, dy, compute_gradients, x, tl, al, tr, ar):
        dx, dtl, dal, dtr, dar = self.gradients(dy, x, tl, al, tr, ar)
        return dx, dtl, dal, dar, dtr


class SinCosFunction(df.DifferentiableFunction):
    """Two outputs and a memory value (cos and sin of x, for the backward)."""

    num_outputs = 2
    num_memory_values = 1

    def forward(self, x):
        s, c = jnp.sin(x), jnp.cos(x)
        return s, c, (c, s)

    def backward(self, dsin, dcos, compute_gradients, memory):
        cos_x, sin_x = memory
        return dsin * cos_x - dcos * sin_x


class IgnoresComputeGradients(SReLUFunction):
    """Computes every gradient whatever compute_gradients says (valid, but wasteful)."""

    def backward(self, dy, compute_gradients, x, tl, al, tr, ar):
        return self.gradients(dy, x, tl, al, tr, ar)


def srelu_function_inputs(key, shape=(2, 4, 4, 3), dtype=jnp.float32):
    """(x, tl, al, tr, ar) for the SReLU function."""
    k = jax.random.split(key, 5)
    channels = (1,) * (len(shape) - 1) + (shape[-1],)
    return (
        jax.random.normal(k[0], shape, dtype),
        jax.random.uniform(k[1], channels, dtype, -0.6, -0.1),
        jax.random.uniform(k[2], channels, dtype, 0.0, 0.5),
        jax.random.uniform(k[3], channels, dtype, 0.1, 0.6),
        jax.random.uniform(k[4], channels, dtype, 0.0, 0.5),
    )


# -- factories for the command line (``difffn check tests.layers_for_checks:make_srelu``) ----------


def make_srelu():
    return SReLULayer(name="srelu")


def make_srelu_swapped():
    return SReLUSwapped(name="srelu_swapped")
