"""Assertions for your own test suites: a custom layer or function either checks out or fails.

Use them in pytest (or unittest) to keep a layer valid as it changes::

    import difffn as df
    from difffn.testing import assert_layer_valid

    def test_my_layer_is_valid():
        assert_layer_valid(MyLayer(), df.Layout((None, 24, 24, 20), "BSSC"))

On failure the ``AssertionError`` carries the whole report: every test, the summary, and the
diagnostic of each failure (which gradient is wrong, by how much, and where).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ._checking import CheckReport, check_function, check_layer
from ._core import Layout

__all__ = ["assert_function_valid", "assert_layer_valid"]


def assert_layer_valid(
    layer: Any, *layouts: Layout, check_export: bool = False, key: jax.Array | None = None
) -> CheckReport:
    """Run [`df.check_layer`][difffn.check_layer] and raise if any test failed or was left
    incomplete.

    Args: as [`df.check_layer`][difffn.check_layer].

    Returns:
      The report, when the layer is valid.

    Raises:
      AssertionError: a test failed or was incomplete; the message is the printed report.
      CheckError: the arguments cannot be used (not a layer, wrong layouts).

    Examples:
      >>> import jax.numpy as jnp
      >>> import difffn as df
      >>> from difffn.testing import assert_layer_valid
      >>> class Double(df.Layer):
      ...     def predict(self, x):
      ...         return 2 * x
      >>> assert_layer_valid(Double(), df.Layout((None, 3), "BC")).failed
      0
    """
    report = check_layer(layer, *layouts, check_export=check_export, key=key)
    if not report.ok:
        raise AssertionError(f"{type(layer).__name__} is not a valid layer:\n{report}")
    return report


def assert_function_valid(
    fcn: Callable[..., Any], *example_inputs: Any, key: jax.Array | None = None
) -> CheckReport:
    """Run [`df.check_function`][difffn.check_function] and raise if any test failed or was left
    incomplete.

    Args: as [`df.check_function`][difffn.check_function].

    Returns:
      The report, when the function is valid.

    Raises:
      AssertionError: a test failed or was incomplete; the message is the printed report.
      CheckError: the arguments cannot be used.
    """
    report = check_function(fcn, *example_inputs, key=key)
    if not report.ok:
        raise AssertionError(f"{type(fcn).__name__} is not a valid function:\n{report}")
    return report
