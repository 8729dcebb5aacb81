"""check_function: forward, backward, gradients per input, compute_gradients, jit and vmap."""

from __future__ import annotations

import re
from typing import NamedTuple

import jax
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
        "second_order_gradients_are_correct",
        "forward_mode_is_correct",
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
    second = report["second_order_gradients_are_correct"]
    assert second.status == "Incomplete", str(report)
    assert re.search(
        r"first-order gradients are wrong \(gradients_are_correct\[tr\], "
        r"gradients_are_correct\[ar\]\); fix those first",
        second.diagnostic,
    ), second.diagnostic


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


# -- surrogate gradients --------------------------------------------------------------------------


class StraightThroughRound(df.DifferentiableFunction):
    """round(x) * w, with the gradient of x passed straight through round (not its derivative,
    which is 0 almost everywhere)."""

    save_inputs_for_backward = True

    def forward(self, x, w):
        return jnp.round(x) * w

    def backward(self, dy, compute_gradients, x, w):
        return dy * w, jnp.sum(dy * jnp.round(x))


class DeclaredStraightThroughRound(StraightThroughRound):
    surrogate_gradients = {"x": "straight-through estimator"}


STE_INPUTS = (jnp.linspace(-1.3, 2.2, 8), jnp.array(1.5))


def test_the_straight_through_estimator_is_jaxs_idiom():
    x, w = STE_INPUTS
    idiom = jax.grad(lambda x: jnp.sum((x + jax.lax.stop_gradient(jnp.round(x) - x)) * w))(x)
    np.testing.assert_allclose(jax.grad(lambda x: StraightThroughRound()(x, w).sum())(x), idiom)


def test_an_undeclared_surrogate_gradient_fails_and_says_how_to_declare_it():
    report = df.check_function(StraightThroughRound(), *STE_INPUTS)
    assert failed(report) == {"gradients_are_correct[x]"}, str(report)
    diagnostic = report["gradients_are_correct[x]"].diagnostic
    assert "surrogate_gradients = {'x': 'the reason'}" in diagnostic
    assert report["gradients_are_correct[w]"].status == "Passed"


def test_a_declared_surrogate_gradient_is_skipped_with_its_reason_and_the_rest_runs():
    report = df.check_function(DeclaredStraightThroughRound(), *STE_INPUTS)
    assert report.ok, str(report)
    result = report["gradients_are_correct[x]"]
    assert result.status == "Skipped"
    assert result.diagnostic == (
        "declared a surrogate gradient: straight-through estimator (surrogate_gradients)"
    )
    undeclared = df.check_function(StraightThroughRound(), *STE_INPUTS)
    assert [r.name for r in report.results] == [r.name for r in undeclared.results]
    assert {r.name for r in report.results if r.status == "Skipped"} == {
        "gradients_are_correct[x]",
        "forward_mode_is_correct",  # no jvp: forward mode is not checked
    }


class MisnamedSurrogate(StraightThroughRound):
    surrogate_gradients = {"y": "straight-through estimator"}


class SurrogateNotADict(StraightThroughRound):
    surrogate_gradients = ("x",)


@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (
            MisnamedSurrogate,
            r"MisnamedSurrogate.surrogate_gradients names 'y', which is not an input or "
            r"learnable of MisnamedSurrogate; its inputs \['x', 'w'\]\. Fix: .*\{'x': ",
        ),
        (SurrogateNotADict, r"surrogate_gradients is a tuple; expected a dict mapping"),
    ],
    ids=["unknown-name", "not-a-dict"],
)
def test_a_bad_surrogate_declaration_is_a_check_error(cls, match):
    with pytest.raises(df.CheckError, match=match):
        df.check_function(cls(), *STE_INPUTS)


# -- second order ---------------------------------------------------------------------------------


class ScaledSquare(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, x, w):
        return x**2 * w

    def backward(self, dy, compute_gradients, x, w):
        return 2 * x * w * dy, jnp.sum(x**2 * dy)


class ScaledSquareStopGradient(ScaledSquare):
    """Right first derivatives; the second derivative through x is silently 0."""

    def backward(self, dy, compute_gradients, x, w):
        return 2 * jax.lax.stop_gradient(x) * w * dy, jnp.sum(x**2 * dy)


class FirstOrderOnly(ScaledSquareStopGradient):
    once_differentiable = True


SQUARE_INPUTS = (jnp.linspace(-1.0, 2.0, 6), jnp.array(1.5))


def test_the_stop_gradient_backward_has_a_wrong_second_derivative_in_jax_too(x64):
    # What the test catches is real: JAX's own custom_vjp with the same rule.
    @jax.custom_vjp
    def f(x):
        return x**2

    f.defvjp(lambda x: (x**2, x), lambda x, dy: (2 * jax.lax.stop_gradient(x) * dy,))
    assert float(jax.grad(jax.grad(f))(1.5)) == 0.0
    assert float(jax.grad(jax.grad(lambda x: x**2))(1.5)) == 2.0


def test_a_differentiable_backward_passes_the_second_order_test():
    report = df.check_function(ScaledSquare(), *SQUARE_INPUTS)
    assert report.ok, str(report)
    result = report["second_order_gradients_are_correct"]
    assert result.status == "Passed"
    assert "agrees with finite differences of the gradient for input 'x', input 'w'" in (
        result.diagnostic
    )


def test_a_stop_gradient_in_backward_fails_the_second_order_test_naming_the_input():
    report = df.check_function(ScaledSquareStopGradient(), *SQUARE_INPUTS)
    assert failed(report) == {"second_order_gradients_are_correct"}, str(report)
    diagnostic = report["second_order_gradients_are_correct"].diagnostic
    assert "wrong with respect to input 'x' (the largest error)" in diagnostic
    assert re.search(r"largest absolute error \S+ at \(\d,\): got \S+, expected", diagnostic)
    assert "jax.lax.stop_gradient" in diagnostic and "once_differentiable = True" in diagnostic


def test_once_differentiable_skips_the_second_order_test_with_the_reason():
    report = df.check_function(FirstOrderOnly(), *SQUARE_INPUTS)
    result = report["second_order_gradients_are_correct"]
    assert result.status == "Skipped"
    assert "FirstOrderOnly sets once_differentiable = True" in result.diagnostic
    assert report.ok, str(report)


class HostCosine(df.DifferentiableFunction):
    """sin, with a backward that computes cos on the host: right, but not differentiable."""

    save_inputs_for_backward = True

    def forward(self, x):
        return jnp.sin(x)

    def backward(self, dy, compute_gradients, x):
        like = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return dy * jax.pure_callback(np.cos, like, x, vmap_method="sequential")


def test_a_backward_jax_cannot_differentiate_fails_the_second_order_test():
    report = df.check_function(HostCosine(), jnp.linspace(-1.0, 1.0, 5))
    assert failed(report) == {"second_order_gradients_are_correct"}, str(report)
    diagnostic = report["second_order_gradients_are_correct"].diagnostic
    assert diagnostic.startswith("JAX cannot differentiate the gradient from HostCosine.backward:")
    assert "once_differentiable = True" in diagnostic


# -- the vmap test stays in the examples' domain --------------------------------------------------


class Sqrt(df.DifferentiableFunction):
    save_outputs_for_backward = True

    def forward(self, x):
        return jnp.sqrt(x)

    def backward(self, dy, compute_gradients, y):
        return dy / (2 * y)


def test_the_vmap_test_keeps_positive_examples_positive():
    report = df.check_function(Sqrt(), jnp.linspace(0.05, 2.0, 9))
    assert report.ok, str(report)
    assert report["vmap_agrees_with_eager"].status == "Passed"


def test_nan_where_both_give_nan_is_agreement():
    report = df.check_function(Sqrt(), jnp.array([-1.0, 0.5, 2.0]))
    assert report["vmap_agrees_with_eager"].status == "Passed", str(report)
    assert report["jit_agrees_with_eager"].status == "Passed", str(report)


# -- mixed precision ------------------------------------------------------------------------------


class Float32Tanh(df.DifferentiableFunction):
    """Computes in float32 whatever the input's dtype (mixed precision); returns that dtype."""

    save_inputs_for_backward = True

    def forward(self, x):
        return jnp.tanh(x.astype(jnp.float32)).astype(x.dtype)

    def backward(self, dy, compute_gradients, x):
        return dy * (1 - jnp.tanh(x) ** 2)


class Float32TanhWrong(Float32Tanh):
    def backward(self, dy, compute_gradients, x):
        return 1.05 * dy * (1 - jnp.tanh(x) ** 2)


def test_a_float32_forward_is_checked_against_autodiff_at_float32_tolerance():
    report = df.check_function(Float32Tanh(), jnp.linspace(-2.0, 2.0, 9))
    assert report.ok, str(report)
    diagnostic = report["gradients_are_correct[x]"].diagnostic
    assert "forward computes in float32 inside" in diagnostic
    assert "compared with JAX autodiff of forward at float32 tolerance" in diagnostic


def test_a_wrong_backward_of_a_float32_forward_fails():
    report = df.check_function(Float32TanhWrong(), jnp.linspace(-2.0, 2.0, 9))
    assert failed(report) == {"gradients_are_correct[x]"}, str(report)
    diagnostic = report["gradients_are_correct[x]"].diagnostic
    assert "from Float32TanhWrong.backward disagrees with JAX autodiff of forward" in diagnostic
    assert re.search(r"largest relative error 0\.04\d* at \(\d,\)", diagnostic), diagnostic


# -- pytree inputs --------------------------------------------------------------------------------


class Affine(NamedTuple):
    w: jax.Array
    b: jax.Array


class TanhLayerFunction(df.DifferentiableFunction):
    """tanh(x @ p.w + p.b) * scale["s"], with a NamedTuple and a dict input (per-leaf flags)."""

    save_inputs_for_backward = True
    save_outputs_for_backward = True

    def forward(self, x, p, scale):
        return jnp.tanh(x @ p.w + p.b) * scale["s"]

    def backward(self, dy, compute_gradients, x, p, scale, y):
        needs_x, needs_p, needs_scale = compute_gradients
        t = y / scale["s"]
        dz = dy * scale["s"] * (1 - t**2)
        dx = dz @ p.w.T if needs_x else None
        dw = x.T @ dz if needs_p.w else None
        db = self.bias_gradient(dz) if needs_p.b else None
        ds = jnp.sum(dy * t, axis=0, keepdims=True) if needs_scale["s"] else None
        return dx, Affine(dw, db), {"s": ds, "n": None}

    def bias_gradient(self, dz):
        return jnp.sum(dz, axis=0, keepdims=True)


class TanhLayerFunctionWrongBias(TanhLayerFunction):
    def bias_gradient(self, dz):
        return jnp.mean(dz, axis=0, keepdims=True)  # should be the sum over the batch


def pytree_inputs(key):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (5, 3))
    p = Affine(0.5 * jax.random.normal(kw, (3, 2)), jax.random.normal(kb, (1, 2)))
    return x, p, {"s": jnp.array([[1.5, -0.5]]), "n": jnp.arange(2)}


def test_pytree_inputs_are_checked_leaf_by_leaf_named_by_path(key):
    report = df.check_function(TanhLayerFunction(), *pytree_inputs(key))
    assert report.ok, str(report)
    names = [r.name for r in report.results if r.name.startswith("gradients_are_correct")]
    assert names == [
        "gradients_are_correct[x]",
        "gradients_are_correct[p.w]",
        "gradients_are_correct[p.b]",
        "gradients_are_correct[scale['n']]",
        "gradients_are_correct[scale['s']]",
    ]
    assert report["gradients_are_correct[scale['n']]"].status == "Skipped"
    assert (
        "input 'scale' at ['n'] is int32" in report["gradients_are_correct[scale['n']]"].diagnostic
    )
    assert report["compute_gradients_is_respected"].status == "Passed"
    assert "dict of 2 arrays" in str(report)


def test_a_wrong_leaf_gradient_is_named_by_its_path(key):
    report = df.check_function(TanhLayerFunctionWrongBias(), *pytree_inputs(key))
    assert failed(report) == {"gradients_are_correct[p.b]"}, str(report)
    diagnostic = report["gradients_are_correct[p.b]"].diagnostic
    assert "with respect to input 'p' at .b (1 x 2)" in diagnostic
    assert "check backward's formula for dLdp.b" in diagnostic
    assert report["second_order_gradients_are_correct"].status == "Incomplete"


class WrongGradientStructure(TanhLayerFunction):
    def backward(self, dy, compute_gradients, x, p, scale, y):
        dx, dp, dscale = super().backward(dy, compute_gradients, x, p, scale, y)
        return dx, {"w": dp.w, "b": dp.b}, dscale  # a dict for a NamedTuple input


def test_a_gradient_of_the_wrong_structure_names_the_input(key):
    report = df.check_function(WrongGradientStructure(), *pytree_inputs(key))
    result = report["backward_returns_valid_gradients"]
    assert result.status == "Failed"
    assert re.search(
        r"the gradient of input 'p' with structure \{'w': \*, 'b': \*\}; expected "
        r"Affine\(w=\*, b=\*\)",
        result.diagnostic,
    ), result.diagnostic
    assert report["gradients_are_correct[p.w]"].status == "Incomplete"


def test_a_non_array_leaf_of_an_example_is_a_check_error(key):
    x, p, scale = pytree_inputs(key)
    with pytest.raises(
        df.CheckError, match=r"example input 3 of TanhLayerFunction at \['s'\] is a str"
    ):
        df.check_function(TanhLayerFunction(), x, p, {"s": "big", "n": scale["n"]})
