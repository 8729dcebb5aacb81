"""The numerical engine behind the gradient checks: kinks, noise, and what it reports."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from difffn._checking import _numerical as numerical


@dataclasses.dataclass(frozen=True)
class Elementwise:
    """outputs = [f(p)], gradient = [scale * f'(p)] (``scale`` != 1 makes it wrong)."""

    name: str
    scale: float = 1.0
    traceable: bool = True

    def function(self, p):
        return {"relu": jax.nn.relu, "abs": jnp.abs, "tanh": jnp.tanh}[self.name](p)

    def outputs(self, args, parts):
        return [self.function(parts[0])]

    def gradients(self, args, parts):
        (cotangent,) = args
        _, vjp = jax.vjp(self.function, parts[0])
        autodiff = vjp(cotangent)[0]
        return {"backward": self.scale * autodiff, "autodiff": autodiff}


def check(model, base, key=0):
    with jax.enable_x64(True):
        base = np.asarray(base, np.float64)
        cotangent = jnp.asarray(np.random.default_rng(key).standard_normal(base.shape))
        segment = numerical.Segment("p", 0, base.size)
        return numerical.check_gradients(
            model,
            (cotangent,),
            base,
            numerical.element_scale([base]),
            [cotangent],
            [segment],
            seed=[key],
        )["p"]


@pytest.mark.parametrize("size", [3, 50, 20000])
def test_a_correct_gradient_passes(size):
    base = np.random.default_rng(1).standard_normal(size)
    verdict = check(Elementwise("tanh"), base)
    assert verdict.status == "Passed"
    assert all(p.resolved for p in verdict.probes)


@pytest.mark.parametrize("size", [3, 50, 20000])
def test_a_small_relative_error_fails(size):
    base = np.random.default_rng(2).standard_normal(size)
    verdict = check(Elementwise("tanh", scale=1.001), base)
    assert verdict.status == "Failed"
    assert verdict.reference_ok  # autodiff agrees with finite differences


def test_points_on_a_kink_are_moved_not_failed():
    # every element sits exactly on abs's kink: central differences there are 0, the
    # autodiff gradient is 1 (JAX's choice), so without moving it would be a false alarm
    verdict = check(Elementwise("abs"), np.zeros(4))
    assert verdict.status == "Passed"
    assert verdict.moves >= 1
    assert all(p.moves >= 1 for p in verdict.probes)


def test_an_error_is_located_by_element():
    base = np.linspace(-1, 1, 7)
    verdict = check(Elementwise("tanh", scale=2.0), base)
    lines = numerical.describe_failure(verdict, lambda i: f"({i},)")
    assert lines[0].startswith("  largest absolute error")
    assert "expected values: JAX autodiff" in lines[2]


def test_low_precision_makes_the_check_incomplete_not_failed():
    @dataclasses.dataclass(frozen=True)
    class Float32Inside(Elementwise):
        def function(self, p):
            return jnp.tanh(p.astype(jnp.float32)).astype(jnp.float64)

    verdict = check(Float32Inside("tanh"), np.random.default_rng(3).standard_normal(5))
    assert verdict.status == "Incomplete"
    assert {p.reason for p in verdict.unresolved} == {
        "finite differences disagree across step sizes"
    }


def test_element_scale_is_relative_with_a_floor():
    scale = numerical.element_scale([np.array([0.0, 3.0, -4.0]), np.zeros(2)])
    np.testing.assert_allclose(scale, [np.sqrt(25 / 3), 3.0, 4.0, 1.0, 1.0])
