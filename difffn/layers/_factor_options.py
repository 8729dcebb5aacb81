"""Learn-rate and L2 factors as constructor options (MATLAB's ``WeightLearnRateFactor`` & co.).

A layer declares options such as ``weight_learn_rate_factor`` and maps each to the learnables it
sets; :func:`record` validates them and stores them as the layers' per-parameter factors, the
ones ``df.set_learn_rate_factor`` sets and ``df.get_learn_rate_factor`` and ``trainnet`` read.
The options are the layer's configuration: ``layer.replace(...)`` of any option applies them
again, so a factor set afterwards with ``df.set_learn_rate_factor`` lasts until the layer's
options next change.
"""

from __future__ import annotations

import dataclasses

from ._checks import real

LEARN_RATE, L2 = "learn_rate_factor", "l2_factor"


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
        value = real(
            layer,
            option,
            getattr(layer, option),
            low=0.0,
            expected="a non-negative number",
            fix=f"e.g. {option}=1 (0 freezes the parameters"
            + (" for training)." if kind == LEARN_RATE else " out of L2 regularization)."),
        )
        d[option] = value
        for field in fields:
            if value == declared[field].get(kind, 1.0):
                factors.pop((field, kind), None)
            else:
                factors[(field, kind)] = value
    d["_factors"] = tuple(sorted((name, kind, value) for (name, kind), value in factors.items()))
