"""What a user's class defines: which methods, and which parameters each method takes.

Layers and ``DifferentiableFunction``\\ s infer part of their contract from the user's method
signatures (MATLAB reads them too): how many inputs ``predict`` takes, whether ``forward`` takes a
``key``, whether ``backward`` takes the state gradients. Every such question is answered here,
from `positional`, so that the rules are written once.

Signatures are inspected once per function and remembered in a ``WeakKeyDictionary``: a class
that the user drops is not kept alive by the memo.
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref

from ._errors import LayerError

# The methods of the layer contract; a layer class records which of them it defines itself.
LAYER_METHODS = ("initialize", "predict", "forward", "backward", "reset_state")


@dataclasses.dataclass(frozen=True)
class Positional:
    """The positional parameters of a method, after ``self``."""

    names: tuple[str, ...]  # in order, with or without defaults
    required: tuple[str, ...]  # those without a default
    variadic: bool  # takes ``*args``
    keywords: frozenset[str]  # every parameter that can be passed by keyword
    var_keyword: bool  # takes ``**kwargs``


_POSITIONAL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def positional(fn) -> Positional:
    """The positional parameters of ``fn`` after its first one (``self``)."""
    try:
        return _POSITIONAL[fn]
    except (KeyError, TypeError):  # TypeError: not weakly referenceable; then not memoized
        pass
    params = list(inspect.signature(fn).parameters.values())[1:]
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    result = Positional(
        names=tuple(p.name for p in params if p.kind in kinds),
        required=tuple(p.name for p in params if p.kind in kinds and p.default is p.empty),
        variadic=any(p.kind is p.VAR_POSITIONAL for p in params),
        keywords=frozenset(p.name for p in params if p.kind is not p.POSITIONAL_ONLY),
        var_keyword=any(p.kind is p.VAR_KEYWORD for p in params),
    )
    try:
        _POSITIONAL[fn] = result
    except TypeError:
        pass
    return result


def has_method(layer_or_cls, method: str) -> bool:
    """Whether a layer class defines ``method`` of the layer contract itself (not the base's)."""
    cls = layer_or_cls if isinstance(layer_or_cls, type) else type(layer_or_cls)
    return method in cls._user_methods


def has_backward(layer_or_cls) -> bool:
    """Whether a layer class defines a custom ``backward``."""
    return has_method(layer_or_cls, "backward")


def predict_arity(cls) -> int | None:
    """Number of inputs ``predict`` takes, or None when it takes ``*inputs`` (or is not defined)."""
    if not has_method(cls, "predict"):
        return None
    signature = positional(cls.predict)
    return None if signature.variadic else len(signature.required)


def accepts_mask(cls, method: str = "predict") -> bool:
    """Whether a layer's ``method`` takes a padding mask (a parameter ``mask`` passed by
    keyword): networks then give it the mask of its first input (``_mask``)."""
    if not has_method(cls, method):
        return False
    signature = positional(getattr(cls, method))
    return "mask" in signature.keywords


def accepts_key(cls, method: str) -> bool:
    """Whether ``method`` can be passed ``key=...``."""
    signature = positional(getattr(cls, method))
    return "key" in signature.keywords or signature.var_keyword


def backward_takes_state(cls, n_in: int, n_out: int) -> bool:
    """Whether a layer's backward takes the state gradients (MATLAB: both or neither).

    Raises:
      LayerError: backward's positional parameters fit neither form (for a stateless layer:
        do not fit ``(X, Y, dLdY, memory)``).
    """
    k = len(cls._state_fields)
    signature = positional(cls.backward)
    if signature.variadic:
        return False
    count = len(signature.names)
    without, with_state = n_in + 2 * n_out + 1, n_in + 2 * n_out + k + 1
    if count == with_state and k:
        return True
    if count == without:
        return False
    inputs = [f"x{i + 1}" for i in range(n_in)] if n_in > 1 else ["x"]
    outputs = [f"y{j + 1}" for j in range(n_out)] if n_out > 1 else ["y"]
    example = ", ".join([*inputs, *outputs, *(f"dLd{y.upper()}" for y in outputs), "memory"])
    state_form = ""
    if k:
        state_form = (
            f" or {with_state} (adding dLdSout x{k} before memory, in which case it also "
            "returns dLdSin)"
        )
    raise LayerError(
        f"{cls.__name__}.backward takes {count} arguments after self; expected {without} "
        f"(X x{n_in}, Y x{n_out}, dLdY x{n_out}, memory){state_form}, e.g. "
        f"backward(self, {example}); it takes ({', '.join(signature.names)}). A parameter the "
        "backward does not need may be named with a leading underscore (e.g. _y, _memory): it "
        "receives None."
    )
