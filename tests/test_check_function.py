"""check_function: forward, backward, gradients per input, compute_gradients, jit and vmap."""

from __future__ import annotations

import re

import jax.numpy as jnp
import layers_for_checks as L
import numpy as np
import pytest

import difffn as df
from difffn.testing import assert_function_valid


def failed(report) -> set[str]:
    return {r.name for r in report.results if r.status == "Failed"}


@pytest.mark.parametrize("seed", range(5))
def test_srelu_function_written_correctly_passes(seed, key):
    import jax

    inputs = L.srelu_function_inputs(jax.random.fold_in(key, seed))
    report = df.check_function(L.SReLUFunction(), *inputs, key=seed)
    assert report.ok, str(report)
    assert [r.name for r in report.results] == [
        "forward_runs",
        "forward_returns_declared_outputs",
        "backward_runs",
        "backward_returns_valid_gradients",
        "gradients_are_correct[x]",
        "gradients_are_correct[tl]",
        "gradients_are_correct[al]",
        "gradients_are_correct[tr]",
        "gradients_are_correct[ar]",
        "compute_gradients_is_respected",
        "jit_agrees_with_eager",
        "vmap_agrees_with_eager",
    ]


def test_swapped_gradient_order_names_both_inputs(key):
    report = df.check_function(L.SReLUFunctionSwapped(), *L.srelu_function_inputs(key))
    assert failed(report) == {"gradients_are_correct[tr]", "gradients_are_correct[ar]"}, str(report)
    diagnostic = report["gradients_are_correct[tr]"].diagnostic
    assert "input 'tr'" in diagnostic and "SReLUFunctionSwapped.backward" in diagnostic
    assert re.search(r"largest absolute error \S+ at \(0, 0, 0, \d\)", diagnostic)
    assert "expected gradient of input 'ar'" in diagnostic


def test_two_outputs_and_a_memory_value_pass():
    report = df.check_function(L.SinCosFunction(), jnp.linspace(-2.0, 2.0, 7))
    assert report.ok, str(report)


def test_ignoring_compute_gradients_passes_with_a_note(key):
    report = df.check_function(L.IgnoresComputeGradients(), *L.srelu_function_inputs(key))
    result = report["compute_gradients_is_respected"]
    assert result.status == "Passed"
    assert "nobody asked for" in result.diagnostic


class NeedsAllFlags(L.SReLUFunction):
    """Crashes unless every gradient is asked for."""

    def backward(self, dy, compute_gradients, x, tl, al, tr, ar):
        assert all(compute_gradients), "expects every flag"
        return self.gradients(dy, x, tl, al, tr, ar)


def test_a_backward_that_breaks_with_false_flags_fails(key):
    report = df.check_function(NeedsAllFlags(), *L.srelu_function_inputs(key))
    assert failed(report) == {"compute_gradients_is_respected"}, str(report)
    assert "expects every flag" in report["compute_gradients_is_respected"].diagnostic


class WrongShape(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, x, w):
        return x * w

    def backward(self, dy, compute_gradients, x, w):
        return dy * w, dy * x  # dw not summed over the broadcast axis


def test_a_misshapen_gradient_fails_its_test_and_the_gradient_test_is_incomplete():
    report = df.check_function(WrongShape(), jnp.ones((4, 3)), jnp.ones((1, 3)))
    result = report["backward_returns_valid_gradients"]
    assert result.status == "Failed"
    assert "the gradient of 'w' has shape (4, 3); expected (1, 3)" in result.diagnostic
    assert report["gradients_are_correct[w]"].status == "Incomplete"
    assert report["gradients_are_correct[x]"].status == "Passed"


class IntegerIndex(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, x, i):
        return x * (i + 1)

    def backward(self, dy, compute_gradients, x, i):
        return dy * (i + 1), None


def test_an_integer_input_has_no_gradient_test():
    report = df.check_function(IntegerIndex(), jnp.ones(3), jnp.arange(3))
    assert report["gradients_are_correct[i]"].status == "Skipped"
    assert report.ok, str(report)


class NumpyInside(df.DifferentiableFunction):
    """Converts to NumPy in forward: fine eagerly, impossible under jit or vmap."""

    save_inputs_for_backward = True

    def forward(self, x):
        return jnp.asarray(np.sin(np.asarray(x)))

    def backward(self, dy, compute_gradients, x):
        return dy * jnp.cos(x)


def test_a_function_that_cannot_be_traced_fails_jit_and_vmap():
    report = df.check_function(NumpyInside(), jnp.linspace(-1.0, 1.0, 5))
    assert failed(report) == {"jit_agrees_with_eager", "vmap_agrees_with_eager"}, str(report)
    assert report["gradients_are_correct[x]"].status == "Passed"


def test_assert_function_valid(key):
    assert assert_function_valid(L.SReLUFunction(), *L.srelu_function_inputs(key)).ok
    with pytest.raises(AssertionError, match=r"(?s)gradients_are_correct\[tr\].*Test Summary"):
        assert_function_valid(L.SReLUFunctionSwapped(), *L.srelu_function_inputs(key))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((L.SReLUFunction, jnp.ones(3)), r"got the class SReLUFunction, not an instance"),
        ((L.SReLULayer(), jnp.ones(3)), r"expected a df.DifferentiableFunction instance"),
        ((L.SReLUFunction(), jnp.ones(3)), r"forward takes 5 input\(s\) \(x, tl, al, tr, ar\)"),
        ((L.SinCosFunction(), "x"), r"example input 1 of SinCosFunction is a str"),
    ],
    ids=["class", "layer", "count", "not-an-array"],
)
def test_misuse_is_a_check_error(args, match):
    with pytest.raises(df.CheckError, match=match):
        df.check_function(*args)
