"""``check_layer``: MATLAB's ``checkLayer`` for difffn layers.

``check_layer(layer, *layouts)`` runs the tests of ``_check_list`` that ``check_layer`` runs, in
that order, and returns a [`CheckReport`][difffn.CheckReport]. The tests live by concern:

* ``_check_layer_subject``: the layer under check, its data, its methods run as the runtime does;
* ``_check_layer_structure``: what the methods take and return (sizes, dtypes, state, formats);
* ``_check_layer_backward``: the backward's returns, autodiff, export;
* ``_check_layer_gradients``: the gradients against numerical derivatives (``_numerical``), and
  the second derivative (``_check_second_order``);
* ``_check_layer_precision``: forward and gradients at a mixed-precision compute dtype.

A class may declare ``surrogate_gradients = {"in": "gradient reversal"}`` (a plain class
attribute: an input or learnable name mapped to the reason its gradient is intentionally not the
derivative) and ``once_differentiable = True`` (its backward is first-order only).

Unknown sizes (``None``) in a layout become 4 for the batch (``B``) and 8 for any other axis; the
layer is initialized with the layouts as given. Data are deterministic (from ``key``): standard
normal inputs and upstream gradients.
"""

from __future__ import annotations

from typing import Any

import jax

from .._core import CheckError, FormattedArray, Layout, type_name
from .._training import DTYPES
from . import _check_layer_backward as backward
from . import _check_layer_gradients as gradients
from . import _check_layer_precision as precision_tests
from . import _check_layer_structure as structure
from ._check_common import as_key
from ._check_layer_subject import Layer, LayerSubject
from ._check_list import LAYER, run_by
from ._check_report import CheckReport, Recorder, incomplete


def check_layer(
    layer: Any,
    *layouts: Layout,
    check_export: bool = False,
    key: jax.Array | None = None,
    precision: str | None = None,
) -> CheckReport:
    """Check a custom layer the way MATLAB's ``checkLayer`` does, and name what is wrong.

    Args:
      layer: a ``df.Layer`` instance, initialized or not (an uninitialized layer is initialized
        with ``layouts`` and ``key``, as MATLAB does).
      *layouts: one ``df.Layout`` per layer input; the batch axis is the one labeled ``B``.
        Unknown sizes (``None``) become 4 for ``B`` and 8 for other axes.
      check_export: also export ``predict`` with ``jax.export`` and compare.
      key: a ``jax.random`` key (or an int seed); default ``jax.random.key(0)``. An
        uninitialized layer is initialized with this very key; the test data and the upstream
        gradients are drawn deterministically from it.
      precision: also run ``forward`` and the gradients at a compute dtype of mixed-precision
        training (``"bfloat16"``, ``"float16"``; as ``TrainingOptions(precision=...)``):
        inputs and learnables rounded to it, against float32 on the same rounded values,
        within eight machine epsilons of the dtype; an output or gradient that overflows
        (float16's largest value is 65504) is named. Default None: not run (Skipped).

    Returns:
      A [`CheckReport`][difffn.CheckReport]; ``print(report)`` shows every test, MATLAB's
      ``Test Summary:`` and the diagnostics of failures. ``report.ok`` is True when nothing failed
      or was left incomplete.

    Raises:
      CheckError: ``layer`` is not a layer instance, the layouts are not one ``df.Layout``
        per input, ``precision`` is not a compute dtype, or the class's
        ``surrogate_gradients`` names something that is not an input or learnable.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> import difffn as df
      >>> class Scale(df.Layer):
      ...     w: jax.Array | None = df.learnable(default=None)
      ...     def initialize(self, layout, *, key):
      ...         if self.w is not None:
      ...             return self
      ...         return self.replace(w=jnp.ones((1, layout.size("C"))))
      ...     def predict(self, x):
      ...         return x * self.w
      >>> report = df.check_layer(Scale(), df.Layout((None, 3), "BC"))
      >>> report.failed, report["gradients_are_correct[w]"].status
      (0, 'Passed')
      >>> report = df.check_layer(Scale(), df.Layout((None, 3), "BC"), precision="bfloat16")
      >>> report["gradients_agree_at_precision"].status
      'Passed'
    """
    _validate(layer, layouts)
    if precision is not None and precision not in DTYPES:
        raise CheckError(
            f"check_layer: precision={precision!r} is not a compute dtype; expected one of "
            f"{sorted(DTYPES)} (as TrainingOptions(precision=...)). Fix: precision='bfloat16', "
            "or leave it out."
        )
    key = as_key(key)
    recorder = Recorder()
    subject = LayerSubject(layer, layouts, key, recorder, precision)
    _run_all(subject, check_export=check_export)
    name = f"{type(layer).__name__}" + (f" (layer {layer.name!r})" if layer.name else "")
    inputs = ", ".join(repr(layout) for layout in layouts)
    return recorder.report(name, inputs, subject.notes)


def _bodies(check_export: bool) -> dict:
    """Each test of the list: a function of the subject and the test's parameter, if any."""
    return {
        "initialize_runs": structure.initialize_runs,
        "method_signatures_are_well_formed": structure.method_signatures_are_well_formed,
        "predict_runs": structure.predict_runs,
        "forward_runs": structure.forward_runs,
        "forward_and_predict_agree_in_size": structure.forward_and_predict_agree_in_size,
        "predict_keeps_dtype": lambda s, dtype: structure.keeps_dtype(s, "predict", dtype),
        "forward_keeps_dtype": lambda s, dtype: structure.keeps_dtype(s, "forward", dtype),
        "runs_on_gpu": structure.runs_on_gpu,
        "multiple_observations_are_consistent": structure.multiple_observations_are_consistent,
        "predict_returns_valid_state": lambda s: structure.returns_valid_state(s, "predict"),
        "forward_returns_valid_state": lambda s: structure.returns_valid_state(s, "forward"),
        "reset_state_runs": structure.reset_state_runs,
        "initialize_keeps_set_parameters": structure.initialize_keeps_set_parameters,
        "formattable_predict_is_formatted": lambda s: structure.formattable_is_formatted(
            s, "predict"
        ),
        "formattable_forward_is_formatted": lambda s: structure.formattable_is_formatted(
            s, "forward"
        ),
        "backward_runs": backward.backward_runs,
        "backward_returns_valid_gradients": backward.backward_returns_valid_gradients,
        "backward_keeps_dtype": backward.backward_keeps_dtype,
        "gradients_are_correct": gradients.gradients_are_correct,
        "second_order_gradients_are_correct": gradients.second_order_gradients_are_correct,
        "forward_agrees_at_precision": precision_tests.forward_agrees_at_precision,
        "gradients_agree_at_precision": precision_tests.gradients_agree_at_precision,
        "autodiff_works": backward.autodiff_works,
        "export_matches_predict": lambda s: backward.export_matches_predict(s, check_export),
    }


def _run_all(s: LayerSubject, *, check_export: bool) -> None:
    """Run the list; a test with a placeholder and no parameters records its own results."""
    bodies = _bodies(check_export)
    rec = s.rec
    for test in run_by(LAYER):
        body = bodies[test.name]
        if test.name == "runs_on_gpu" and not structure.gpu_devices():
            s.notes.append("Skipping GPU tests. No GPU device found.")
        if test.name == "export_matches_predict" and not check_export:
            s.notes.append(
                "Skipping the export test. To check that the layer exports, set check_export=True."
            )
        if test.placeholder and not test.params:
            body(s)
        elif test.params:
            for param in test.params:
                rec.run(f"{test.name}[{param}]", body, s, param)
        else:
            rec.run(test.name, body, s)
        if test.name == "initialize_runs" and not s.usable:
            for name in ("predict_runs", "forward_runs", "gradients_are_correct"):
                rec.add(name, incomplete("the layer could not be initialized (initialize_runs)"))
            return


# -- argument checks ------------------------------------------------------------------------------


def _validate(layer, layouts) -> None:
    if isinstance(layer, type) and issubclass(layer, Layer):
        raise CheckError(
            f"check_layer got the class {layer.__name__}, not a layer; expected an instance. "
            f"Fix: check_layer({layer.__name__}(), *layouts)."
        )
    if not isinstance(layer, Layer):
        raise CheckError(
            f"check_layer got a {type_name(layer)}; expected a df.Layer instance. Fix: pass an "
            "instance of your df.Layer subclass (use df.check_function for a "
            "DifferentiableFunction)."
        )
    for i, layout in enumerate(layouts):
        if isinstance(layout, Layout):
            continue
        if isinstance(layout, FormattedArray):
            fix = "df.Layout.of(x) (a layout has sizes and a format, no data)"
        elif hasattr(layout, "shape"):
            fix = f"df.Layout({tuple(layout.shape)}, fmt) with one label per axis, e.g. 'BSSC'"
        else:
            fix = "df.Layout(shape, fmt), e.g. df.Layout((None, 24, 24, 20), 'BSSC')"
        raise CheckError(
            f"check_layer: layout {i + 1} of {type(layer).__name__} is a {type_name(layout)}; "
            f"expected a df.Layout (sizes and a format, like MATLAB's networkDataLayout). "
            f"Fix: {fix}."
        )
    if len(layouts) != layer.num_inputs:
        raise CheckError(
            f"check_layer: {type(layer).__name__} has {layer.num_inputs} input(s) "
            f"{list(layer.input_names)} but got {len(layouts)} layout(s); expected one df.Layout "
            "per input, in order. Fix: check_layer(layer, "
            + ", ".join(f"layout_{n}" for n in layer.input_names)
            + ")."
        )
