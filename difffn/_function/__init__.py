"""Custom operations: `DifferentiableFunction` and the one custom-derivative mechanism.

The class contract and flags of `DifferentiableFunction`, how it becomes one JAX operation (primal,
forward with residuals, backward, jvp, vmap rules), the `custom_vjp` builder (JAX's, or difffn's
primitive when a `jvp` rule is given), the twin builder that functions and layer backwards share
(`twin_custom_vjp`), and the checks of what a user backward returns (cotangents).

This file is the package's internal API: the floors above import these names from here, and
nothing else from the package's modules (tests/test_architecture.py holds it).
"""

from . import _cotangents as cotangents
from ._function import DifferentiableFunction as DifferentiableFunction
from ._function import _forward_parameters as forward_parameters
from ._function import _input_names as input_names
from ._function import run_forward as run_forward
from ._function_rules import _is_wrapped_single as is_wrapped_single
from ._primitive import custom_vjp as custom_vjp
from ._tangent_map import autodiff_jvp as autodiff_jvp
from ._twin import twin_custom_vjp as twin_custom_vjp

__all__ = [
    "DifferentiableFunction",
    "autodiff_jvp",
    "forward_parameters",
    "input_names",
    "is_wrapped_single",
    "cotangents",
    "custom_vjp",
    "run_forward",
    "twin_custom_vjp",
]
