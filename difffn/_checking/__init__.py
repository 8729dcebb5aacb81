"""The checkers: `check_layer`, `check_function`, finite differences and the report.

The declarative test list, what both checkers share, numerical gradients, second-order checks and
the `CheckReport`.

This file is the package's internal API: the floors above import these names from here, and
nothing else from the package's modules (tests/test_architecture.py holds it).
"""

from ._check_function import check_function as check_function
from ._check_layer import check_layer as check_layer
from ._check_report import CheckReport as CheckReport
from ._check_report import describe_exception as describe_exception

__all__ = ["CheckReport", "check_function", "check_layer", "describe_exception"]
