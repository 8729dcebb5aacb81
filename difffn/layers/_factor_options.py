"""Learn-rate and L2 factors as constructor options (MATLAB's ``WeightLearnRateFactor`` & co.).

A layer declares options such as ``weight_learn_rate_factor``, maps each to the kind of factor and
the learnables it sets (a class attribute ``_factor_options``), and calls `record` from
``__post_init__``. The options become the layer's per-parameter factors: the ones
``df.get_learn_rate_factor`` and training read. ``df.set_learn_rate_factor`` on a learnable that an
option alone sets also sets that option (``_factors.py``), so the two never disagree and
``layer.replace(...)`` keeps the factor.
"""

from __future__ import annotations

import dataclasses

from ._checks import real

LEARN_RATE, L2 = "learn_rate_factor", "l2_factor"


def conv_like(weights: str = "weights", bias: str = "bias") -> dict:
    """The four options of layers with weights and a bias (MATLAB's names, snake_case)."""
    return {
        "weight_learn_rate_factor": (LEARN_RATE, (weights,)),
        "weight_l2_factor": (L2, (weights,)),
        "bias_learn_rate_factor": (LEARN_RATE, (bias,)),
        "bias_l2_factor": (L2, (bias,)),
    }


def offset_scale() -> dict:
    """The four options of normalization layers (offset and scale)."""
    return {
        "offset_learn_rate_factor": (LEARN_RATE, ("offset",)),
        "offset_l2_factor": (L2, ("offset",)),
        "scale_learn_rate_factor": (LEARN_RATE, ("scale",)),
        "scale_l2_factor": (L2, ("scale",)),
    }


def record(layer, options: dict[str, tuple[str, tuple[str, ...]]]) -> None:
    """Validate factor options and store them for their learnables (call in ``__post_init__``).

    Args:
      layer: the layer being constructed (or replaced).
      options: option field name -> (``LEARN_RATE`` or ``L2``, the learnable fields it sets).
    """
    d = layer.__dict__
    declared = {f.name: f.metadata for f in dataclasses.fields(layer)}
    factors = {(name, kind): value for name, kind, value in d.get("_factors", ())}
    for option, (kind, fields) in options.items():
        what = "learn rate" if kind == LEARN_RATE else "L2 regularization"
        value = real(
            layer,
            option,
            getattr(layer, option),
            low=0.0,
            expected=f"a non-negative number (it multiplies the global {what})",
            fix=f"e.g. {option}=1 (0 "
            + ("freezes the parameters)." if kind == LEARN_RATE else "leaves them unregularized)."),
        )
        d[option] = value
        for field in fields:
            if value == declared[field].get(kind, 1.0):
                factors.pop((field, kind), None)
            else:
                factors[(field, kind)] = value
    d["_factors"] = tuple(sorted((name, kind, value) for (name, kind), value in factors.items()))
