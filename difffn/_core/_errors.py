"""The difffn exception family.

Every error difffn raises for a user's mistake is a subclass of [`Error`][difffn.Error]. Each also
derives
from the built-in exception a Python user would expect (``ValueError`` for a bad value,
``TypeError`` for a bad type), so ``except ValueError`` keeps working.

Messages follow one shape: *who* (the user's class, method, argument or parameter path), *what*
was expected and what was got, and *how to fix it*.
"""

from __future__ import annotations

import types

# The built-in descriptor of ``__cause__`` (the same object as ``BaseException.__cause__``),
# which the property below wraps.
_CAUSE: types.GetSetDescriptorType = BaseException.__dict__["__cause__"]
_JAX_FORWARD_TRACE = "JaxStackTraceBeforeTransformation"


def _get_cause(self: BaseException) -> BaseException | None:
    return _CAUSE.__get__(self)


def _set_cause(self: BaseException, value: BaseException | None) -> None:
    if value is not None and type(value).__name__ == _JAX_FORWARD_TRACE:
        # JAX moves the error's own chain onto its record of the forward pass: take it back.
        _CAUSE.__set__(self, value.__cause__)
        self.__context__ = value.__context__
        self.__suppress_context__ = value.__suppress_context__
        return
    _CAUSE.__set__(self, value)


class Error(Exception):
    """Base class of every error difffn raises for a user's mistake.

    An error raised while JAX transforms an operation (a backward rule running inside
    ``jax.grad``) would get, as its ``__cause__``, JAX's record of the forward call's stack
    (``JaxStackTraceBeforeTransformation``), printed as a second traceback of JAX's frames above
    the error. difffn's messages name the user's class, method and line instead, so an ``Error``
    declines that record and keeps its own chain: one traceback. ``raise ... from`` is unchanged.
    """

    __cause__: BaseException | None = property(_get_cause, _set_cause)  # type: ignore[assignment]


class FormatError(Error, ValueError):
    """A format string or a formatted array is not valid for the operation."""


class DifferentiableFunctionError(Error, TypeError):
    """A [`DifferentiableFunction`][difffn.DifferentiableFunction] subclass is defined or called
    incorrectly."""


class ForwardError(Error, ValueError):
    """A user ``forward``/``predict`` returned the wrong number or kind of values."""


class BackwardError(Error, ValueError):
    """A user ``backward`` returned the wrong number, shape or dtype of gradients."""


class ForwardModeError(Error, TypeError):
    """Forward-mode differentiation (``jax.jvp``, ``jax.jacfwd``) of an op that has no ``jvp``."""


class HigherOrderError(DifferentiableFunctionError):
    """The backward of a ``once_differentiable`` function was differentiated (second order)."""


class LayerError(Error, TypeError):
    """A [`Layer`][difffn.Layer] subclass is defined or used incorrectly."""


class AccelerationError(Error, TypeError):
    """A layer cannot be traced (compiled) because of Python control flow on values."""


class NetworkError(Error, ValueError):
    """A [`Network`][difffn.Network] is built or called incorrectly."""


class OptionsError(Error, ValueError):
    """A training option has an unknown name or a bad value."""


class SerializationError(Error, ValueError):
    """A file could not be saved or loaded safely."""


class OpError(Error, ValueError):
    """A ``df.ops`` function got an argument it cannot use (a size, a shape, an option)."""


class CheckError(Error, ValueError):
    """``check_layer``/``check_function`` was called with arguments it cannot use."""


class ONNXImportError(Error, ValueError):
    """An ONNX model cannot be imported (``df.import_onnx``).

    One error lists every problem found in the model: each unsupported node with its operator
    type and name, each input size difffn needs but the file leaves open, and how to fix it.
    """


class ONNXExportError(Error, ValueError):
    """A network cannot be written as ONNX (``df.export_onnx``): the message names the layer and
    the operation that has no ONNX lowering."""


class MissingDependencyError(Error, ImportError):
    """An optional dependency that a feature needs is not installed (the message says which)."""


def type_name(obj: object) -> str:
    """The name of ``obj``'s class, for messages (``'SReLUFunction'``)."""
    return type(obj).__name__


# Tracebacks, reprs and pickles name the errors as users import them (``difffn.FormatError``),
# not by this private module; each is exported by ``difffn/__init__.py``.
def _name_as_exported() -> None:
    for error in [
        v for v in list(globals().values()) if isinstance(v, type) and issubclass(v, Error)
    ]:
        error.__module__ = "difffn"


_name_as_exported()
