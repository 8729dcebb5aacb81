"""``trainnet``'s positional arguments: its two forms, a layer array as a network (the key is
checked by ``_keys``)."""

from __future__ import annotations

from .._core import OptionsError
from .._layer import Layer
from .._network import Network


def layer_arrays_as_networks(args: tuple) -> tuple:
    """A list of layers where the network goes becomes ``df.Network(list)``, as MATLAB's
    trainnet takes a layer array."""
    items = list(args)
    for k in (2, 1) if len(items) >= 5 else (1, 2):
        value = items[k] if k < len(items) else None
        if isinstance(value, (list, tuple)) and value and any(isinstance(v, Layer) for v in value):
            items[k] = Network(list(value))
            break
    return tuple(items)


def form_of(who: str, args: tuple) -> str:
    """Which form of trainnet the arguments are, ``"arrays"`` or ``"iterable"``; a clear error
    naming the form that was probably meant when they fit neither."""
    nets = [k for k, a in enumerate(args) if isinstance(a, Network)]
    if len(args) == 5 and nets == [2]:
        return "arrays"
    if len(args) == 4 and nets == [1]:
        return "iterable"
    got = ", ".join(type(a).__name__ for a in args)
    if nets == [2] and len(args) == 4:
        raise OptionsError(
            f"{who}(X, T, net, loss) is missing the options (got {got}). Fix: "
            f"{who}(X, T, net, loss, df.TrainingOptions(...))."
        )
    if nets == [1] and len(args) == 3:
        raise OptionsError(
            f"{who}(data, net, loss) is missing the options (got {got}). Fix: "
            f"{who}(data, net, loss, df.TrainingOptions(...))."
        )
    if len(args) in (4, 5) and not nets:
        net = args[2] if len(args) == 5 else args[1]
        raise OptionsError(
            f"{who}: net must be a df.Network or a list of layers; got {type(net).__name__}. "
            "Fix: pass df.Network(layers) (or the list of layers; a single layer: [layer])."
        )
    raise OptionsError(
        f"{who} takes (X, T, net, loss, options) or (data, net, loss, options); got "
        f"{len(args)} positional argument(s) ({got})."
    )
