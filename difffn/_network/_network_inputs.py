"""The network's inputs checked against the layouts it knows, and plain arrays labelled.

``Network.prepare_inputs`` (the package-internal API) runs this inside ``Network.run`` when the
call's input signature was not seen before: the count of inputs, numbers only (strings, ragged
lists and complex data into a real network are named errors), then rank, format and fixed sizes
against each input layer's layout.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

from .._core import FormattedArray, NetworkError, as_numbers, asarray, check_numbers


def prepare(net, inputs) -> tuple:
    """``inputs`` checked and labelled for ``net``: a tuple, one entry per network input."""
    g = net.graph
    if len(inputs) != len(g.inputs):
        raise NetworkError(
            f"the network takes {len(g.inputs)} input(s) {list(g.input_names)}; got "
            f"{len(inputs)}. Fix: pass one array per input, in the order of "
            "net.input_names."
        )
    known = net.input_layouts
    prepared = []
    for k, x in enumerate(inputs):
        layout, name = known[k], g.input_names[k]
        x = as_numbers(x, what=f"network input {name!r}", error=NetworkError, real=False)
        if _is_complex(x) and not _complex_learnables(net):
            check_numbers(x, what=f"network input {name!r}", error=NetworkError)
        if not isinstance(x, (FormattedArray, jax.Array)):
            x = asarray(x)
        if layout is None:
            prepared.append(x)
            continue
        if not isinstance(x, FormattedArray):
            if x.ndim != layout.ndim:
                raise NetworkError(
                    f"network input {name!r} expects {layout.ndim}-D data with format "
                    f"{layout.format!r} ({layout}); got a plain array of shape {x.shape}. "
                    f"Fix: pass an array with one axis per label of {layout.format!r} (a "
                    "single observation keeps its batch axis, of size 1)."
                )
            x = FormattedArray._wrap(x, layout.format)  # the rank was just checked
        elif x.format != layout.format:
            raise NetworkError(
                f"network input {name!r} expects format {layout.format!r}; got "
                f"{x.format!r}. Fix: df.permute(x, {layout.format!r}) or relabel with "
                "df.dlarray."
            )
        for axis, (want, got) in enumerate(zip(layout.shape, x.shape)):
            if want is not None and want != got:
                raise NetworkError(
                    f"network input {name!r} expects size {want} on axis {axis} "
                    f"({layout.format[axis]!r}) of {layout}; got shape {x.shape}. Fix: "
                    "pass data of the size the network was built for (its input layer's)."
                    + _transposed(layout, x.shape)
                )
        prepared.append(x)
    return tuple(prepared)


def _transposed(layout, shape) -> str:
    """How to reorder data whose sizes fit the layout in another axis order (channels first,
    as PyTorch and ONNX store images and signals)."""
    if len(shape) > 6:
        return ""
    for perm in itertools.permutations(range(len(shape))):
        if perm != tuple(range(len(shape))) and all(
            n is None or n == shape[p] for n, p in zip(layout.shape, perm)
        ):
            if "B" in layout.format and perm[layout.format.index("B")] != 0:
                continue  # keep the batch first
            return (
                f" Its sizes fit {layout.format!r} in another order (channels first, as "
                f"ONNX and PyTorch store them?): np.transpose(x, {perm}); a network from "
                "df.import_onnx takes ONNX's order with input_data_formats='onnx'."
            )
    return ""


def _complex_learnables(net) -> bool:
    """Whether some parameter is complex (complex inputs are then the user's design)."""
    cached = net.__dict__.get("_complex")
    if cached is None:
        cached = net.__dict__["_complex"] = any(map(_is_complex, jax.tree.leaves(net)))
    return cached


def _is_complex(x) -> bool:
    return jnp.iscomplexobj(x.data if isinstance(x, FormattedArray) else x)
