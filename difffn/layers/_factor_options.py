"""MATLAB's learn-rate and L2 factor options (``WeightLearnRateFactor``, ``BiasL2Factor``, ...).

A built-in layer names the constructor options that set its parameters' factors in a class
attribute, ``_factor_options = {"weight_learn_rate_factor": ("weights", "learn_rate_factor"),
...}``, and calls :func:`apply` from ``__post_init__``. The options become the layer's factors
(what ``df.get_learn_rate_factor`` reads and training uses), and ``df.set_learn_rate_factor`` on
such a parameter also sets the option (``_factors.py``), so the two never disagree.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from ._checks import bad_argument


def conv_like(weights: str = "weights", bias: str = "bias") -> dict[str, tuple[str, str]]:
    """The four options of layers with weights and a bias (MATLAB's names, snake_case)."""
    return {
        "weight_learn_rate_factor": (weights, "learn_rate_factor"),
        "weight_l2_factor": (weights, "l2_factor"),
        "bias_learn_rate_factor": (bias, "learn_rate_factor"),
        "bias_l2_factor": (bias, "l2_factor"),
    }


def offset_scale() -> dict[str, tuple[str, str]]:
    """The four options of normalization layers (offset and scale)."""
    return {
        "offset_learn_rate_factor": ("offset", "learn_rate_factor"),
        "offset_l2_factor": ("offset", "l2_factor"),
        "scale_learn_rate_factor": ("scale", "learn_rate_factor"),
        "scale_l2_factor": ("scale", "l2_factor"),
    }


def apply(layer) -> None:
    """Check the layer's factor options and store them as its factors (in ``__post_init__``)."""
    options = type(layer)._factor_options
    covered = set(options.values())
    declared = {f.name: f.metadata for f in dataclasses.fields(layer)}
    factors = [f for f in layer.__dict__.get("_factors", ()) if (f[0], f[1]) not in covered]
    for option, (field, kind) in options.items():
        value = getattr(layer, option)
        if not (
            isinstance(value, numbers.Real)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value >= 0
        ):
            raise bad_argument(
                layer,
                option,
                "a non-negative number (it multiplies the global "
                + ("learn rate" if kind == "learn_rate_factor" else "L2 regularization")
                + f" for {field})",
                value,
                f"e.g. {option}=1 (0 freezes {field})."
                if kind == "learn_rate_factor"
                else f"e.g. {option}=0 (no regularization of {field}).",
            )
        value = float(value)
        setattr(layer, option, value)
        if value != declared[field].get(kind, 1.0):
            factors.append((field, kind, value))
    layer._factors = tuple(sorted(factors))
