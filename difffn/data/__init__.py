"""Data sets for examples and tests (``df.data.digits()``)."""

from ._digits import digits as digits

__all__ = ["digits"]
