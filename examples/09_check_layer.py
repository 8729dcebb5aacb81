"""09: check a custom layer like MATLAB's checkLayer, and watch it catch a wrong backward.

SReLU (S-shaped rectified linear unit) has, per channel, a left threshold ``tl`` and slope
``al`` and a right threshold ``tr`` and slope ``ar``:

    f(x) = tl + al (x - tl)   if x <= tl
           x                  if tl < x < tr
           tr + ar (x - tr)   if x >= tr

This script
1. writes SReLU as a ``df.Layer`` with learnables left_threshold, left_slope, right_threshold,
   right_slope and a backward that follows the derivatives of that formula;
2. checks it with ``df.check_layer`` on the layout of MATLAB's example (a batch of 128
   24x24 images with 20 channels, "BSSC") and prints the report: every test passes;
3. checks a version whose backward forgets the chain rule in dL/dX (it returns dY/dX instead of
   dL/dY * dY/dX, a mistake that looks plausible) and shows the report naming input 'in';
4. checks a version that returns the gradients of left_threshold and left_slope in each other's
   place, and shows both named, with a hint that they are swapped.

The same check runs from the command line:
``difffn check my_module:make_layer --layout "128,24,24,20:BSSC"``.

Run: ``python examples/09_check_layer.py [--small]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
from srelu_sums import srelu_parameter_gradients  # this folder's one-pass sums

import difffn as df


class SReLULayer(df.Layer):
    """SReLU with per-channel thresholds and slopes (size 1 on every axis but C)."""

    left_threshold: jax.Array = df.learnable(default=None)
    left_slope: jax.Array = df.learnable(default=None)
    right_threshold: jax.Array = df.learnable(default=None)
    right_slope: jax.Array = df.learnable(default=None)

    def initialize(self, layout, *, key):
        shape = [1] * layout.ndim
        shape[layout.finddim("C")[0]] = layout.size("C")
        keys = jax.random.split(key, 4)
        ranges = {
            "left_threshold": (-0.6, -0.1),
            "left_slope": (0.0, 0.5),
            "right_threshold": (0.1, 0.6),
            "right_slope": (0.0, 0.5),
        }
        new = {}
        for k, (name, (low, high)) in zip(keys, ranges.items(), strict=True):
            if getattr(self, name) is None:  # fill only what is still empty
                new[name] = jax.random.uniform(k, shape, minval=low, maxval=high)
        return self.replace(**new)

    def predict(self, x):
        tl, al = self.left_threshold, self.left_slope
        tr, ar = self.right_threshold, self.right_slope
        return jnp.where(x <= tl, tl + al * (x - tl), jnp.where(x >= tr, tr + ar * (x - tr), x))

    def gradients(self, x, dy):
        """dL/dX and the four parameter gradients, from the derivatives of the formula."""
        tl, al = self.left_threshold, self.left_slope
        tr, ar = self.right_threshold, self.right_slope
        left, right = x <= tl, x >= tr

        axes = tuple(i for i, n in enumerate(tl.shape) if n == 1)  # all but C
        dx = dy * jnp.where(left, al, jnp.where(right, ar, 1.0))
        # sums of masked dy and of the same times x, in one pass (srelu_sums.py)
        return dx, *srelu_parameter_gradients(axes, x, dy, left, right, tl, al, tr, ar)

    def backward(self, x, y, dy, memory):
        # input gradient, then the learnables in declaration order
        return self.gradients(x, dy)


class SReLUForgetsChainRule(SReLULayer):
    """dL/dX = dY/dX: the upstream gradient dL/dY is never multiplied in."""

    def backward(self, x, y, dy, memory):
        _, dtl, dal, dtr, dar = self.gradients(x, dy)
        tl, al = self.left_threshold, self.left_slope
        tr, ar = self.right_threshold, self.right_slope
        return jnp.where(x <= tl, al, jnp.where(x >= tr, ar, 1.0)), dtl, dal, dtr, dar


class SReLUSwapsGradients(SReLULayer):
    """The gradients of left_threshold and left_slope come back in each other's place."""

    def backward(self, x, y, dy, memory):
        dx, dtl, dal, dtr, dar = self.gradients(x, dy)
        return dx, dal, dtl, dtr, dar


def failed_names(report) -> set[str]:
    return {r.name for r in report.results if r.status == "Failed"}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a small layout (the test suite)")
    args = parser.parse_args(argv)
    shape = (8, 12, 12, 6) if args.small else (128, 24, 24, 20)
    layout = df.Layout(shape, "BSSC")

    start = time.perf_counter()
    report = df.check_layer(SReLULayer(name="srelu"), layout)
    print(report)
    print(f"(check_layer of the correct layer took {time.perf_counter() - start:.2f} s)\n")
    assert report.ok, "the correct SReLU layer should pass every test"

    print("=" * 72)
    print("A backward that forgets the chain rule in dL/dX:\n")
    report = df.check_layer(SReLUForgetsChainRule(name="srelu"), layout)
    print(report)
    assert failed_names(report) == {"gradients_are_correct[in]"}, failed_names(report)

    print("\n" + "=" * 72)
    print("A backward that swaps the gradients of two learnables:\n")
    report = df.check_layer(SReLUSwapsGradients(name="srelu"), layout)
    for result in report.failures:
        print(f"{result.status}: {result.name}\n{result.diagnostic}\n")
    assert failed_names(report) == {
        "gradients_are_correct[left_threshold]",
        "gradients_are_correct[left_slope]",
    }, failed_names(report)
    print(report.summary())


if __name__ == "__main__":
    main()
