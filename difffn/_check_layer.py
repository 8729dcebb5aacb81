"""``check_layer``: MATLAB's ``checkLayer`` for difffn layers.

``check_layer(layer, *layouts)`` runs a list of named tests on a layer and returns a
:class:`~difffn.CheckReport`. The tests, in order (``[...]`` marks a parametrized test):

========================================================  ==========================================
``initialize_runs``                                       an uninitialized layer initializes
``method_signatures_are_well_formed``                     predict/forward/backward/initialize/
                                                          reset_state take the arguments they must
``predict_runs``, ``forward_runs``                        they run and return the declared values
``forward_and_predict_agree_in_size``                     same output count, shapes and formats
``predict_keeps_dtype[float32|float64]``                  outputs and state keep the input's dtype
``forward_keeps_dtype[float32|float64]``                  (run with float64 enabled, so a stray
                                                          float64 constant shows)
``runs_on_gpu``                                           the same on a GPU, when there is one
``multiple_observations_are_consistent``                  predict on a batch equals predict on each
                                                          observation alone (``B`` label)
``predict_returns_valid_state``,                          state outputs: count, shape, dtype
``forward_returns_valid_state``, ``reset_state_runs``
``initialize_keeps_set_parameters``                       initialize leaves set parameters alone
``formattable_predict_is_formatted``,                     a formattable layer returns formatted
``formattable_forward_is_formatted``                      outputs with a ``C`` label
``backward_runs``, ``backward_returns_valid_gradients``,  the custom backward runs and returns one
``backward_keeps_dtype[float32|float64]``                 gradient per input and learnable, with
                                                          the right shapes and dtypes
``gradients_are_correct[NAME]``                           per input and per learnable: the gradient
                                                          agrees with numerical derivatives
``autodiff_works[predict|forward]``                       without a custom backward, JAX autodiff
                                                          differentiates them
``export_matches_predict``                                with ``check_export=True``: the layer
                                                          exports with ``jax.export`` and matches
========================================================  ==========================================

Unknown sizes (``None``) in a layout become 4 for the batch (``B``) and 8 for any other axis; the
layer is initialized with the layouts as given. Data are deterministic (from ``key``): standard
normal inputs and upstream gradients. The gradient tests run in float64 (enabled only inside the
check) through ``forward`` (training time), the function the custom backward is paired with; see
``_numerical.py`` for the method and tolerances.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from . import _export
from . import _numerical as numerical
from ._check_report import (
    CheckReport,
    Recorder,
    describe_exception,
    failed,
    incomplete,
    passed,
    skipped,
)
from ._errors import CheckError, LayerError, type_name
from ._fields import NetworkBase
from ._format import FormattedArray, Layout, dlarray, stripdims
from ._layer import Layer
from ._layer_call import call_layer
from ._layer_call import run_user as _run_user
from ._signatures import backward_takes_state as _backward_takes_state
from ._signatures import has_backward
from ._signatures import has_method as _has_method

DEFAULT_BATCH = 4
DEFAULT_SIZE = 8
MAX_SINGLE_OBSERVATIONS = 4
MULTI_OBSERVATION_RTOL = 1e-9
GPU_RTOL = {"float32": 1e-4, "float64": 1e-10}
EXPORT_RTOL = 1e-5


def check_layer(layer, *layouts, check_export: bool = False, key=None) -> CheckReport:
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

    Returns:
      A :class:`~difffn.CheckReport`; ``print(report)`` shows every test, MATLAB's
      ``Test Summary:`` and the diagnostics of failures. ``report.ok`` is True when nothing failed
      or was left incomplete.

    Raises:
      CheckError: ``layer`` is not a layer instance, or the layouts are not one ``df.Layout``
        per input.

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
    """
    _validate(layer, layouts)
    key = _as_key(key)
    recorder = Recorder()
    checker = _LayerChecker(layer, layouts, key, recorder)
    checker.run_all(check_export=check_export)
    subject = f"{type(layer).__name__}" + (f" (layer {layer.name!r})" if layer.name else "")
    inputs = ", ".join(repr(layout) for layout in layouts)
    return recorder.report(subject, inputs, checker.notes)


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


def _as_key(key):
    if key is None:
        return jax.random.key(0)
    if isinstance(key, int) and not isinstance(key, bool):
        return jax.random.key(key)
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    if isinstance(key, jax.Array) and key.dtype == jnp.uint32 and key.shape == (2,):
        return jax.random.wrap_key_data(key)
    raise CheckError(
        f"key is a {type_name(key)}; expected a jax.random key or an int seed. Fix: "
        "key=jax.random.key(0)."
    )


def concrete_shape(layout: Layout) -> tuple[int, ...]:
    """The layout's sizes with ``None`` replaced: 4 for ``B``, 8 otherwise."""
    return tuple(
        (DEFAULT_BATCH if label == "B" else DEFAULT_SIZE) if size is None else size
        for size, label in zip(layout.shape, layout.format, strict=True)
    )


# -- helpers --------------------------------------------------------------------------------------


def _cast(tree, dtype):
    """Cast every floating leaf of a pytree (a layer, inputs) to ``dtype``."""

    def cast(leaf):
        if isinstance(leaf, (jax.Array, np.ndarray)) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.asarray(leaf, dtype)
        return leaf

    return jax.tree.map(cast, tree)


def _shape_text(shape) -> str:
    return str(tuple(int(s) for s in shape))


def _describe_value(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, FormattedArray):
        return f"{value.dtype.name} array of shape {_shape_text(value.shape)} ({value.format!r})"
    if isinstance(value, (jax.Array, np.ndarray)):
        return f"{value.dtype.name} array of shape {_shape_text(value.shape)}"
    return type_name(value)


def _is_array(value) -> bool:
    return isinstance(value, (jax.Array, np.ndarray, FormattedArray, jax.ShapeDtypeStruct))


def _floating(value) -> bool:
    return _is_array(value) and jnp.issubdtype(value.dtype, jnp.floating)


def _gpu_devices():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


def _index_text(index: int, shape, fmt: str = "") -> str:
    if not shape:
        return "()"
    position = np.unravel_index(index, shape)
    if fmt and len(fmt) == len(shape):
        return (
            "(" + ", ".join(f"{lab}={int(p)}" for lab, p in zip(fmt, position, strict=True)) + ")"
        )
    return str(tuple(int(p) for p in position))


# -- the gradient model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Part:
    """A checked value: which backward gradient it is, and where its leaves sit."""

    key: str  # "input:in", "learnable:alpha", "state:s"
    name: str
    kind: str  # "input", "learnable", "state"
    gradient_index: int
    leaves: tuple[int, ...]  # indices into the flat leaves of (inputs, layer)
    shapes: tuple[tuple[int, ...], ...]
    paths: tuple[str, ...]

    @property
    def size(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


@dataclass(frozen=True)
class _LayerModel:
    """The layer's forward as a function of the flat checked values (hashable, static)."""

    treedef: object
    formats: tuple[str, ...]
    parts: tuple[_Part, ...]
    num_gradients: int
    takes_state: bool
    with_backward: bool
    with_autodiff: bool
    traceable: bool

    def rebuild(self, args, parts):
        leaves, _, _ = args
        leaves = list(leaves)
        for part, flat in zip(self.parts, parts, strict=True):
            offset = 0
            for leaf, shape in zip(part.leaves, part.shapes, strict=True):
                size = math.prod(shape)
                leaves[leaf] = flat[offset : offset + size].reshape(shape)
                offset += size
        inputs, layer = jax.tree.unflatten(self.treedef, leaves)
        return layer, _user_inputs(layer, inputs, self.formats)

    def forward(self, args, parts):
        layer, xs = self.rebuild(args, parts)
        return layer, xs, _run_user(layer, xs, True, args[1])

    def outputs(self, args, parts):
        _, _, (outs, state, _) = self.forward(args, parts)
        values = [stripdims(y) for y in outs]
        if self.takes_state:
            values += [stripdims(s) for s in state]
        return values

    def gradients(self, args, parts):
        return numerical.model_gradients(self, args, parts, args[2])

    def _backward(self, args, parts):
        layer, xs, (outs, state, memory) = self.forward(args, parts)
        cotangents = list(args[2])
        dys = [
            _like(jnp.asarray(c, stripdims(y).dtype), y)
            for c, y in zip(cotangents, outs, strict=False)
        ]
        extra = []
        if self.takes_state:
            extra = [jnp.asarray(c) for c in cotangents[len(outs) :]]
        grads = layer.backward(*xs, *outs, *dys, *extra, memory)
        if self.num_gradients == 1 and not isinstance(grads, (tuple, list)):
            grads = (grads,)
        pieces = []
        for part in self.parts:
            pieces.append(_part_gradient(part, grads, self.num_gradients))
        return jnp.concatenate(pieces) if pieces else jnp.zeros((0,), jnp.float64)


def _part_gradient(part: _Part, grads, count: int):
    """The flat gradient of one checked value, or NaNs when the backward's is unusable."""
    bad = jnp.full((part.size,), jnp.nan, jnp.float64)
    if not isinstance(grads, (tuple, list)) or len(grads) != count:
        return bad
    grad = stripdims(grads[part.gradient_index])
    if grad is None:
        return bad
    leaves = [stripdims(g) for g in jax.tree.leaves(grad)]
    if len(leaves) != len(part.shapes):
        return bad
    flat = []
    for g, shape in zip(leaves, part.shapes, strict=True):
        if not _is_array(g) or tuple(g.shape) != shape:
            return bad
        flat.append(jnp.ravel(g).astype(jnp.float64))
    return jnp.concatenate(flat) if flat else jnp.zeros((0,), jnp.float64)


def _like(cotangent, primal):
    if isinstance(primal, FormattedArray):
        return dlarray(cotangent, primal.format)
    return cotangent


def _user_inputs(layer, inputs, formats):
    """What the user's methods receive: formatted inputs if formattable, else plain arrays."""
    if layer.formattable:
        return tuple(
            dlarray(stripdims(x), f) if f else x for x, f in zip(inputs, formats, strict=True)
        )
    return tuple(stripdims(x) for x in inputs)


# -- the checker ----------------------------------------------------------------------------------


class _LayerChecker:
    def __init__(self, layer, layouts, key, recorder: Recorder):
        self.layer = layer
        self.layouts = tuple(layouts)
        self.shapes = tuple(concrete_shape(layout) for layout in layouts)
        self.formats = tuple(layout.format for layout in layouts)
        self.key = key  # initialize gets the caller's key itself
        self.rec = recorder
        self.notes: list[str] = []
        self.data = _Data(key)
        self.xs = tuple(
            self.data.normal(10 + i, shape, jnp.float32) for i, shape in enumerate(self.shapes)
        )
        self.forward_key = self.data.key(2)
        self.predicted = None
        self.forwarded = None
        self.backward_result = None
        self.usable = True
        self.cls = type(layer)

    @property
    def names(self) -> dict:
        layer = self.layer
        return {
            "inputs": tuple(layer.input_names),
            "outputs": tuple(layer.output_names),
            "learnables": tuple(layer.learnable_names),
            "states": tuple(layer.state_names),
        }

    # -- running the user's methods --

    def run(self, layer, xs, training: bool, *, abstract: bool = False):
        """The user's predict (or forward) on ``xs``: compiled when the layer is acceleratable.

        ``abstract``: only shapes and dtypes are needed, so trace without compiling.
        """
        key = self.forward_key if training else None
        run = functools.partial(_run_plain, formats=self.formats, training=training)
        args = (layer, tuple(xs), key)
        if abstract:
            return self._traced_or_eager(jax.eval_shape, run, args)
        return self._traced_or_eager(lambda _, *a: _run_jit(*a, self.formats, training), run, args)

    def _traced_or_eager(self, trace, fn, args):
        """``trace(fn, *args)`` (compiled or abstract) for an acceleratable layer, else eager.

        When tracing fails, ``fn`` runs eagerly: an error there is the user's own, and clearer;
        if it runs, the layer cannot be traced although it is acceleratable, which is the finding.
        """
        if not self.cls.acceleratable:
            return fn(*args)
        try:
            return trace(fn, *args)
        except Exception as traced_error:
            fn(*args)
            raise traced_error from None

    def run_all(self, *, check_export: bool) -> None:
        rec = self.rec
        rec.run("initialize_runs", self.test_initialize_runs)
        if not self.usable:
            for name in ("predict_runs", "forward_runs", "gradients_are_correct"):
                rec.add(name, incomplete("the layer could not be initialized (initialize_runs)"))
            return
        rec.run("method_signatures_are_well_formed", self.test_signatures)
        rec.run("predict_runs", self.test_predict_runs)
        rec.run("forward_runs", self.test_forward_runs)
        rec.run("forward_and_predict_agree_in_size", self.test_forward_predict_size)
        for method in ("predict", "forward"):
            for dtype in ("float32", "float64"):
                rec.run(f"{method}_keeps_dtype[{dtype}]", self.test_dtype, method, dtype)
        if not _gpu_devices():
            self.notes.append("Skipping GPU tests. No GPU device found.")
        rec.run("runs_on_gpu", self.test_gpu)
        rec.run("multiple_observations_are_consistent", self.test_multiple_observations)
        rec.run("predict_returns_valid_state", self.test_state, "predict")
        rec.run("forward_returns_valid_state", self.test_state, "forward")
        rec.run("reset_state_runs", self.test_reset_state)
        rec.run("initialize_keeps_set_parameters", self.test_initialize_keeps)
        rec.run("formattable_predict_is_formatted", self.test_formattable, "predict")
        rec.run("formattable_forward_is_formatted", self.test_formattable, "forward")
        rec.run("backward_runs", self.test_backward_runs)
        rec.run("backward_returns_valid_gradients", self.test_backward_valid)
        for dtype in ("float32", "float64"):
            rec.run(f"backward_keeps_dtype[{dtype}]", self.test_backward_dtype, dtype)
        self.run_gradient_tests()
        rec.run("autodiff_works[predict]", self.test_autodiff, False)
        rec.run("autodiff_works[forward]", self.test_autodiff, True)
        if not check_export:
            self.notes.append(
                "Skipping the export test. To check that the layer exports, set check_export=True."
            )
        rec.run("export_matches_predict", self.test_export, check_export)

    # -- tests --

    def test_initialize_runs(self):
        layer = self.layer
        if layer.initialized:
            return skipped("the layer was given initialized")
        try:
            new = layer.initialize(*self.layouts, key=self.key)
        except Exception as error:
            self.usable = False
            raise failed(
                f"{self.cls.__name__}.initialize raised for layouts {list(self.layouts)}:\n"
                f"{describe_exception(error)}"
            ) from None
        if not isinstance(new, self.cls):
            self.usable = False
            return failed(
                f"{self.cls.__name__}.initialize returned a {type_name(new)}; expected the "
                f"initialized layer (a {self.cls.__name__}). Fix: `return self.replace(...)` "
                "(layers are immutable)."
            )
        empty = [
            n for n in self.names["learnables"] + self.names["states"] if getattr(new, n) is None
        ]
        self.layer = new
        if empty:
            self.usable = False
            return failed(
                f"after initialize, parameter(s) {empty} of {self.cls.__name__} are still None. "
                "Fix: give each learnable and state parameter a value in initialize (or a default)."
            )
        return None

    def test_signatures(self):
        cls, layer = self.cls, self.layer
        n_in, n_out = layer.num_inputs, layer.num_outputs
        problems = []

        def positional(method):
            params = list(inspect.signature(getattr(cls, method)).parameters.values())[1:]
            required = [
                p
                for p in params
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
            ]
            variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
            return params, required, variadic

        if _has_method(layer, "forward"):
            params, required, variadic = positional("forward")
            names = [p.name for p in required]
            if "key" in names:
                problems.append(
                    "forward takes `key` as a required positional argument; it must be an "
                    "optional keyword: `def forward(self, *X, key=None)`."
                )
            elif len(required) != n_in and not (variadic and len(required) <= n_in):
                problems.append(
                    f"forward takes {len(required)} input(s) {names}; the layer has {n_in} "
                    f"({list(layer.input_names)}), like predict."
                )
        if has_backward(layer):
            try:
                _backward_takes_state(cls, n_in, n_out)
            except LayerError as error:
                problems.append(str(error))
        if _has_method(layer, "initialize"):
            params, required, variadic = positional("initialize")
            keywords = {p.name for p in params} | (
                {"key"} if any(p.kind is p.VAR_KEYWORD for p in params) else set()
            )
            if "key" not in keywords:
                problems.append(
                    "initialize does not take `key`; it must be `def initialize(self, "
                    "*layouts, key)` (randomness is an explicit key)."
                )
            count = len([p for p in required if p.name != "key"])
            if count > n_in or (count < n_in and not variadic):
                problems.append(
                    f"initialize takes {count} layout(s); expected {n_in}, one per input."
                )
        if _has_method(layer, "reset_state"):
            _, required, _ = positional("reset_state")
            if required:
                problems.append(
                    f"reset_state takes arguments {[p.name for p in required]}; it must be "
                    "`def reset_state(self)` returning the layer with reset state."
                )
        if problems:
            return failed(f"{cls.__name__}: " + "\n".join(problems))
        return None

    def _check_returned(self, method: str, outs):
        for name, y in zip(self.names["outputs"], outs, strict=True):
            if not _is_array(y):
                raise failed(
                    f"{self.cls.__name__}.{method} returned {_describe_value(y)} as output "
                    f"{name!r}; expected an array. Fix: return jax arrays."
                )

    def test_predict_runs(self):
        self.predicted = None
        outs, state, _ = self.run(self.layer, self.xs, training=False)
        self._check_returned("predict", outs)
        self.predicted = (outs, state)

    def test_forward_runs(self):
        self.forwarded = None
        outs, state, memory = self.run(self.layer, self.xs, training=True)
        self._check_returned("forward", outs)
        self.forwarded = (outs, state, memory)
        if not _has_method(self.layer, "forward"):
            return passed("the layer defines no forward; predict runs at training time")
        return None

    def _require(self, *which):
        for name in which:
            if getattr(self, name) is None:
                method = "predict" if name == "predicted" else "forward"
                raise incomplete(f"{method} did not run (see {method}_runs)")

    def test_forward_predict_size(self):
        self._require("predicted", "forwarded")
        problems = []
        for name, p, f in zip(
            self.names["outputs"], self.predicted[0], self.forwarded[0], strict=True
        ):
            if tuple(p.shape) != tuple(f.shape):
                problems.append(
                    f"output {name!r}: predict gives shape {_shape_text(p.shape)}, forward "
                    f"{_shape_text(f.shape)}"
                )
            elif getattr(p, "format", "") != getattr(f, "format", ""):
                problems.append(
                    f"output {name!r}: predict gives format {p.format!r}, forward {f.format!r}"
                )
        if problems:
            return failed(
                "forward and predict disagree in size:\n  "
                + "\n  ".join(problems)
                + "\nFix: forward (training time) must return outputs of the same sizes as "
                "predict; they may differ only in values (e.g. dropout)."
            )
        return None

    def test_dtype(self, method: str, dtype: str):
        self._require("predicted" if method == "predict" else "forwarded")
        training = method == "forward"
        with jax.enable_x64(True):
            layer = _cast(self.layer, dtype)
            xs = _cast(self.xs, dtype)
            outs, state, _ = self.run(layer, xs, training, abstract=True)
            problems = []
            for name, y in zip(self.names["outputs"], outs, strict=True):
                got = stripdims(y).dtype
                if jnp.issubdtype(got, jnp.inexact) and got != np.dtype(dtype):
                    problems.append(f"output {name!r} is {got}")  # integer outputs are by design
            for name, s in zip(self.names["states"], state, strict=True):
                old = getattr(layer, name)
                if not (_is_array(s) and _is_array(old)):
                    continue  # e.g. a nested network's state table
                expected = np.dtype(dtype) if _floating(old) else old.dtype
                if stripdims(s).dtype != expected:
                    problems.append(f"state {name!r} is {stripdims(s).dtype}")
        if problems:
            return failed(
                f"with {dtype} inputs and parameters, {method} returned: "
                + "; ".join(problems)
                + f"; expected {dtype}. Fix: do not create constants or casts with a fixed "
                "dtype (np.float64 values, .astype(jnp.float32)); use the input's dtype, e.g. "
                "jnp.asarray(c, x.dtype) or y.astype(x.dtype)."
            )
        return None

    def test_gpu(self):
        gpus = _gpu_devices()
        if not gpus:
            return skipped("no GPU")
        self._require("predicted")
        gpu, cpu = gpus[0], jax.devices("cpu")[0]
        problems = []
        with jax.enable_x64(True):
            for dtype in ("float32", "float64"):
                layer, xs = _cast(self.layer, dtype), _cast(self.xs, dtype)
                for training in (False, True):
                    method = "forward" if training else "predict"
                    on_cpu = self.run(jax.device_put(layer, cpu), jax.device_put(xs, cpu), training)
                    on_gpu = self.run(jax.device_put(layer, gpu), jax.device_put(xs, gpu), training)
                    for name, a, b in zip(self.names["outputs"], on_cpu[0], on_gpu[0], strict=True):
                        a, b = np.asarray(stripdims(a)), stripdims(b)
                        if b.dtype != np.dtype(dtype):
                            problems.append(f"{method} output {name!r} is {b.dtype} ({dtype})")
                            continue
                        if gpu not in b.devices():
                            problems.append(f"{method} output {name!r} is not on the GPU")
                            continue
                        b = np.asarray(b)
                        scale = max(float(np.max(np.abs(a), initial=0.0)), 1e-30)
                        error = float(np.max(np.abs(a - b), initial=0.0)) / scale
                        if not error <= GPU_RTOL[dtype]:
                            problems.append(
                                f"{method} output {name!r} ({dtype}) differs from the CPU by "
                                f"{error:.3g} (relative)"
                            )
        if problems:
            return failed("on the GPU: " + "; ".join(problems))
        return None

    def test_multiple_observations(self):
        self._require("predicted")
        batch_axes = [f.find("B") for f in self.formats]
        if all(a < 0 for a in batch_axes):
            return skipped(
                "no layout has a B (batch) label; the batch axis comes from the B label (e.g. "
                "df.Layout((None, 24, 24, 20), 'BSSC'))"
            )
        sizes = {s[a] for s, a in zip(self.shapes, batch_axes, strict=True) if a >= 0}
        batch = max(2, min(sizes))
        with jax.enable_x64(True):
            layer = _cast(self.layer, "float64")
            xs = []
            for i, (shape, axis) in enumerate(zip(self.shapes, batch_axes, strict=True)):
                shape = list(shape)
                if axis >= 0:
                    shape[axis] = batch
                xs.append(np.asarray(self.data.normal(30 + i, shape, jnp.float64)))
            together, _, _ = self.run(layer, [jnp.asarray(x) for x in xs], False)
            problems = []
            for i in range(min(batch, MAX_SINGLE_OBSERVATIONS)):
                single = [
                    jnp.asarray(np.take(x, [i], axis=a) if a >= 0 else x)
                    for x, a in zip(xs, batch_axes, strict=True)
                ]
                alone, _, _ = self.run(layer, single, False)
                for name, y_all, y_one in zip(self.names["outputs"], together, alone, strict=True):
                    fmt = self._output_format(y_all)
                    axis = fmt.find("B") if fmt and len(fmt) == y_all.ndim else -1
                    if axis < 0:
                        return skipped(f"output {name!r} has no B (batch) axis to compare")
                    y_all, y_one = np.asarray(stripdims(y_all)), np.asarray(stripdims(y_one))
                    if y_all.shape[axis] != batch:
                        problems.append(
                            f"output {name!r} has {y_all.shape[axis]} observations for a batch "
                            f"of {batch}"
                        )
                        break
                    expected = np.take(y_all, [i], axis=axis)
                    if expected.shape != y_one.shape:
                        problems.append(
                            f"output {name!r} of observation {i} alone has shape "
                            f"{_shape_text(y_one.shape)}; in the batch, "
                            f"{_shape_text(expected.shape)}"
                        )
                        continue
                    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-300)
                    gap = np.abs(expected - y_one)
                    error = float(np.max(gap, initial=0.0))
                    if not error <= MULTI_OBSERVATION_RTOL * scale:
                        where = _index_text(int(np.argmax(gap)), gap.shape, fmt)
                        problems.append(
                            f"output {name!r}: observation {i} predicted alone differs from the "
                            f"same observation in a batch of {batch} by {error:.3g} at {where} "
                            f"(relative {error / scale:.3g})"
                        )
        if problems:
            return failed(
                "predict is not consistent across observations:\n  "
                + "\n  ".join(problems)
                + "\nFix: each observation's output must depend only on that observation: "
                "do not mix values across the B axis (e.g. reduce over all axes, or reshape "
                "with a hard-coded batch size) in predict."
            )
        return None

    def _output_format(self, y):
        if isinstance(y, FormattedArray):
            return y.format
        if self.layer.formattable:
            return ""
        return next((f for f in self.formats if f), "")

    def test_state(self, method: str):
        states = self.names["states"]
        if not states:
            return skipped("the layer has no state parameters")
        self._require("predicted" if method == "predict" else "forwarded")
        new_state = (self.predicted if method == "predict" else self.forwarded)[1]
        problems = []
        for name, value in zip(states, new_state, strict=True):
            old = getattr(self.layer, name)
            if isinstance(old, NetworkBase):
                continue  # a nested network's state table: the network validates it
            if not _is_array(value):
                problems.append(f"state {name!r} is {_describe_value(value)}")
            elif _is_array(old) and not _state_shape_ok(old.shape, stripdims(value).shape):
                problems.append(
                    f"state {name!r} has shape {_shape_text(stripdims(value).shape)}; the "
                    f"layer's is {_shape_text(old.shape)}"
                )
            elif _is_array(old) and stripdims(value).dtype != old.dtype:
                problems.append(
                    f"state {name!r} has dtype {stripdims(value).dtype}; the layer's is {old.dtype}"
                )
        if problems:
            return failed(
                f"{method} returned invalid state: "
                + "; ".join(problems)
                + ". Fix: return the new value of every state field after the outputs, with the "
                "shape and dtype of the field (an axis of size 1 may grow to the batch size)."
            )
        return None

    def test_reset_state(self):
        if not self.names["states"]:
            return skipped("the layer has no state parameters")
        new = self.layer.reset_state()
        if not isinstance(new, self.cls):
            return failed(
                f"reset_state returned a {type_name(new)}; expected a {self.cls.__name__}. Fix: "
                "`return self.replace(state_field=...)`."
            )
        problems = []
        for name in self.names["states"]:
            old, value = getattr(self.layer, name), getattr(new, name)
            if _is_array(old) and (not _is_array(value) or tuple(value.shape) != tuple(old.shape)):
                problems.append(f"state {name!r} became {_describe_value(value)}")
        for name, kind in self.cls._field_kinds.items():
            if kind in ("property", "base") and name != "name":
                if _tree_change(getattr(self.layer, name), getattr(new, name)) is not None:
                    problems.append(f"property {name!r} changed")
        if problems:
            return failed(
                "reset_state: "
                + "; ".join(problems)
                + ". Fix: reset_state may only reset state fields, keeping their shapes."
            )
        return None

    def test_initialize_keeps(self):
        if not _has_method(self.layer, "initialize"):
            return skipped("the layer defines no initialize")
        again = self.layer.initialize(*self.layouts, key=self.data.key(4))
        if not isinstance(again, self.cls):
            return failed(
                f"initialize returned a {type_name(again)}; expected a {self.cls.__name__}."
            )
        problems = []
        for kind, names in (
            ("learnable", self.names["learnables"]),
            ("state", self.names["states"]),
        ):
            for name in names:
                before, after = getattr(self.layer, name), getattr(again, name)
                change = _tree_change(before, after)
                if change is not None:
                    problems.append(f"{kind} {name!r} ({change})")
        if problems:
            first = problems[0].split("'")[1]
            return failed(
                "initialize changed parameters that were already set: "
                + "; ".join(problems)
                + ". initialize must fill only parameters that are still None, so that running "
                f"it twice changes nothing. Fix: guard each one, e.g. `if self.{first} is None:`."
            )
        return None

    def test_formattable(self, method: str):
        if not self.layer.formattable:
            return skipped("the layer is not formattable (formattable = False)")
        self._require("predicted" if method == "predict" else "forwarded")
        outs = (self.predicted if method == "predict" else self.forwarded)[0]
        problems = []
        for name, y in zip(self.names["outputs"], outs, strict=True):
            if not isinstance(y, FormattedArray):
                problems.append(f"output {name!r} is a plain array")
            elif "C" not in y.format:
                problems.append(f"output {name!r} has format {y.format!r}, without a C label")
        if problems:
            return failed(
                f"{method} of a formattable layer: "
                + "; ".join(problems)
                + ". Fix: return df.dlarray(y, fmt) with a format that has a C (channel) label."
            )
        return None

    # -- backward --

    def _backward_inputs(self, layer, xs, *, abstract: bool = False):
        """Run forward and call the user's backward with random upstream gradients.

        ``abstract``: only shapes and dtypes are needed, so trace without compiling.
        """
        takes_state = _backward_takes_state(self.cls, layer.num_inputs, layer.num_outputs)
        outs, state, _ = self.run(layer, xs, True, abstract=True)
        values = list(outs) + (list(state) if takes_state else [])
        cotangents = tuple(
            self.data.normal(50 + i, stripdims(v).shape, stripdims(v).dtype)
            for i, v in enumerate(values)
        )
        args = (layer, tuple(xs), cotangents, self.forward_key)
        static = {"formats": self.formats, "takes_state": takes_state}
        call = functools.partial(_backward_call, **static)
        if abstract:
            return self._traced_or_eager(jax.eval_shape, call, args), takes_state
        compiled = self._traced_or_eager(lambda _, *a: _backward_jit(*a, **static), call, args)
        return compiled, takes_state

    def _expected_gradients(self, layer, xs, takes_state):
        """(kind, name, value) of each value backward must return a gradient for, in order."""
        expected = [("input", n, x) for n, x in zip(self.names["inputs"], xs, strict=True)]
        expected += [("learnable", n, getattr(layer, n)) for n in self.names["learnables"]]
        if takes_state:
            expected += [("state", n, getattr(layer, n)) for n in self.names["states"]]
        return expected

    def _needs_backward(self):
        if not has_backward(self.layer):
            raise skipped("the layer defines no backward; JAX autodiff differentiates it")
        self._require("forwarded")

    def test_backward_runs(self):
        self._needs_backward()
        self.backward_result = None
        self.backward_result = self._backward_inputs(self.layer, self.xs)

    def _normalized_gradients(self, layer, xs, *, abstract: bool = False):
        if layer is self.layer and xs is self.xs and self.backward_result is not None:
            grads, takes_state = self.backward_result
        else:
            grads, takes_state = self._backward_inputs(layer, xs, abstract=abstract)
        expected = self._expected_gradients(layer, xs, takes_state)
        if len(expected) == 1 and not isinstance(grads, (tuple, list)):
            grads = (grads,)
        order = ", ".join(f"dLd{name}" for _, name, _ in expected)
        if not isinstance(grads, (tuple, list)) or len(grads) != len(expected):
            got = f"{len(grads)} values" if isinstance(grads, (tuple, list)) else type_name(grads)
            raise failed(
                f"backward returned {got}; expected {len(expected)} gradients: {order} (inputs, "
                "then learnables in declaration order"
                + (", then state" if takes_state else "")
                + "). Fix: return one gradient per value, in that order."
            )
        return list(zip(expected, grads, strict=True)), order

    def test_backward_valid(self):
        self._needs_backward()
        pairs, order = self._normalized_gradients(self.layer, self.xs)
        problems = []
        for (kind, name, value), grad in pairs:
            what = f"{kind} {name!r}"
            grad = stripdims(grad)
            leaves_v = jax.tree.leaves(stripdims(value))
            if grad is None:
                problems.append(f"the gradient of {what} is None")
                continue
            leaves_g = [stripdims(g) for g in jax.tree.leaves(grad)]
            if len(leaves_g) != len(leaves_v) or not all(_is_array(g) for g in leaves_g):
                problems.append(f"the gradient of {what} is {_describe_value(grad)}")
                continue
            for g, v in zip(leaves_g, leaves_v, strict=True):
                if tuple(g.shape) != tuple(np.shape(v)):
                    problems.append(
                        f"the gradient of {what} has shape {_shape_text(g.shape)}; expected "
                        f"{_shape_text(np.shape(v))}"
                    )
        if problems:
            return failed(
                "backward returned invalid gradients: "
                + "; ".join(problems)
                + f". Expected, in order: {order}, each with the shape of its value. Fix: for a "
                "parameter broadcast in forward, sum over the broadcast axes with keepdims=True."
            )
        return None

    def test_backward_dtype(self, dtype: str):
        self._needs_backward()
        with jax.enable_x64(True):
            layer, xs = _cast(self.layer, dtype), _cast(self.xs, dtype)
            pairs, _ = self._normalized_gradients(layer, xs, abstract=True)
            problems = []
            for (kind, name, _), grad in pairs:
                for g in jax.tree.leaves(stripdims(grad)):
                    g = stripdims(g)
                    if _floating(g) and g.dtype != np.dtype(dtype):
                        problems.append(f"the gradient of {kind} {name!r} is {g.dtype}")
        if problems:
            return failed(
                f"with {dtype} inputs and parameters, backward returned "
                + "; ".join(problems)
                + f"; expected {dtype}. Fix: compute gradients in the dtype of their values (no "
                "np.float64 constants or fixed-dtype casts)."
            )
        return None

    # -- gradients --

    def run_gradient_tests(self) -> None:
        rec = self.rec
        names = [("input", n) for n in self.names["inputs"]]
        names += [("learnable", n) for n in self.names["learnables"]]
        if self.forwarded is None:
            for _, n in names:
                rec.add(f"gradients_are_correct[{n}]", incomplete("forward did not run"))
            return
        custom = has_backward(self.layer)
        takes_state = False
        if custom:
            try:
                takes_state = _backward_takes_state(
                    self.cls, self.layer.num_inputs, self.layer.num_outputs
                )
            except LayerError as error:
                for _, n in names:
                    rec.add(f"gradients_are_correct[{n}]", incomplete(str(error)))
                return
            if takes_state:
                names += [("state", n) for n in self.names["states"]]
        began = time.perf_counter()
        try:
            results = self._gradient_verdicts(custom, takes_state)
        except _Unusable as reason:
            for _, n in names:
                rec.add(f"gradients_are_correct[{n}]", incomplete(str(reason)))
            return
        except Exception as error:  # noqa: BLE001 - the user's forward/backward raised
            for _, n in names:
                rec.add(
                    f"gradients_are_correct[{n}]",
                    failed(f"the gradient check could not run:\n{describe_exception(error)}"),
                )
            return
        share = (time.perf_counter() - began) / max(len(names), 1)
        for kind, n in names:
            outcome = results.get(f"{kind}:{n}")
            if outcome is None:
                outcome = skipped(f"{kind} {n!r} holds no floating-point values")
            result = rec.add(f"gradients_are_correct[{n}]", outcome)
            rec.results[-1] = dataclasses.replace(result, duration=share)

    def _gradient_verdicts(self, custom: bool, takes_state: bool) -> dict:
        with jax.enable_x64(True):
            return self._gradient_verdicts_x64(custom, takes_state)

    def _gradient_verdicts_x64(self, custom: bool, takes_state: bool) -> dict:
        layer = _cast(self.layer, "float64")
        xs = tuple(jnp.asarray(x, jnp.float64) for x in self.xs)
        path_leaves, treedef = jax.tree_util.tree_flatten_with_path((xs, layer))
        leaves = [leaf for _, leaf in path_leaves]
        n_in = len(xs)
        parts = []
        learnables, states = self.names["learnables"], self.names["states"]
        groups = [("input", n, i, (0, i)) for i, n in enumerate(self.names["inputs"])]
        groups += [("learnable", n, n_in + j, n) for j, n in enumerate(learnables)]
        if takes_state:
            groups += [("state", n, n_in + len(learnables) + k, n) for k, n in enumerate(states)]
        invalid = self._invalid_gradients(custom)
        for kind, name, gradient_index, where in groups:
            indices, shapes, paths = [], [], []
            for index, (path, leaf) in enumerate(path_leaves):
                if not _belongs(path, where) or not _floating(leaf):
                    continue
                indices.append(index)
                shapes.append(tuple(leaf.shape))
                paths.append(jax.tree_util.keystr(path[1:] if kind != "input" else path[2:]))
            if indices:
                parts.append(
                    _Part(
                        f"{kind}:{name}",
                        name,
                        kind,
                        gradient_index,
                        tuple(indices),
                        tuple(shapes),
                        tuple(paths),
                    )
                )
        num_gradients = n_in + len(learnables) + (len(states) if takes_state else 0)
        model = _LayerModel(
            treedef,
            self.formats,
            tuple(parts),
            num_gradients,
            takes_state,
            custom,
            True,
            self.cls.acceleratable,
        )
        flat = {i: np.ravel(np.asarray(leaves[i], np.float64)) for p in parts for i in p.leaves}
        segments, base, scale, base_parts = numerical.lay_out(
            [part.key for part in parts],
            [np.concatenate([flat[i] for i in p.leaves]) for p in parts],
            scale_leaves=[flat[i] for p in parts for i in p.leaves],
        )
        evaluate = jax.eval_shape if model.traceable else (lambda f, p: f(p))
        outputs = evaluate(
            lambda p: model.outputs((tuple(leaves), self.forward_key, ()), p), base_parts
        )
        cotangents = tuple(
            self.data.normal(60 + i, tuple(y.shape), jnp.float64) for i, y in enumerate(outputs)
        )
        args = (tuple(leaves), self.forward_key, cotangents)
        autodiff_note = ""
        try:
            grads = numerical.compute_gradients(model, args, base_parts)
        except Exception as error:  # noqa: BLE001 - retry without the autodiff reference
            if not custom:
                raise _Unusable(
                    "JAX autodiff cannot differentiate the layer's forward (see "
                    f"autodiff_works[forward]): {type(error).__name__}"
                ) from None
            model, grads, autodiff_note = numerical.without_autodiff(model, args, base_parts, error)
        verdicts = numerical.check_gradients(
            model,
            args,
            base,
            scale,
            cotangents,
            segments,
            seed=self.data.seq(7),
            gradients=grads,
        )
        outcomes = {}
        by_key = {p.key: p for p in parts}
        for part in parts:
            if part.key in invalid:
                outcomes[part.key] = incomplete(
                    f"the backward's gradient for {part.kind} {part.name!r} is unusable "
                    f"({invalid[part.key]}); see backward_returns_valid_gradients"
                )
                continue
            outcomes[part.key] = self._outcome(part, verdicts, by_key, custom, autodiff_note)
        return outcomes

    def _invalid_gradients(self, custom) -> dict:
        """Checked values whose backward gradient is missing or misshapen, with the reason."""
        if not custom:
            return {}
        try:
            pairs, _ = self._normalized_gradients(self.layer, self.xs)
        except Exception as error:  # noqa: BLE001
            raise _Unusable(
                f"backward did not return usable gradients (see backward_runs and "
                f"backward_returns_valid_gradients): {str(error).splitlines()[0]}"
            ) from None
        invalid = {}
        for (kind, name, value), grad in pairs:
            leaves_g = [stripdims(g) for g in jax.tree.leaves(stripdims(grad))]
            leaves_v = jax.tree.leaves(stripdims(value))
            if grad is None:
                invalid[f"{kind}:{name}"] = "None"
            elif len(leaves_g) != len(leaves_v) or any(
                not _is_array(g) or tuple(g.shape) != tuple(np.shape(v))
                for g, v in zip(leaves_g, leaves_v, strict=False)
            ):
                invalid[f"{kind}:{name}"] = f"got {_describe_value(stripdims(grad))}"
        return invalid

    def _outcome(self, part: _Part, verdicts, parts_by_key, custom, autodiff_note):
        shape = part.shapes[0] if len(part.shapes) == 1 else None
        fmt = self.formats[self.names["inputs"].index(part.name)] if part.kind == "input" else ""

        def locate(i):
            if shape is not None:
                return _index_text(i, shape, fmt)
            offset = 0
            for path, s in zip(part.paths, part.shapes, strict=True):
                if i < offset + math.prod(s):
                    return f"{path}{_index_text(i - offset, s)}"
                offset += math.prod(s)
            return str(i)

        if custom:
            order = ", ".join(
                [f"dLd{n}" for n in self.names["inputs"]]
                + [f"dLd{n}" for n in self.names["learnables"]]
            )
            fix = (
                f"Fix: check backward's formula for dLd{part.name}: by the chain rule it is the "
                f"sum over outputs of dLdY * dY/d{part.name} (multiply by the upstream gradient, "
                "use the memory value forward returned, and for a parameter broadcast in forward "
                f"sum over exactly the broadcast axes); backward returns {order}, in that order."
            )
        else:
            fix = (
                "Fix: an operation inside forward has a wrong derivative (a "
                "DifferentiableFunction's backward, a jax.custom_vjp/custom_jvp rule) or blocks "
                "it (jax.lax.stop_gradient); check it with df.check_function."
            )
        labels = {k: f"{p.kind} {p.name!r}" for k, p in parts_by_key.items()}
        return gradient_outcome(
            part.key,
            verdicts,
            labels,
            shape=shape,
            locate=locate,
            who="the custom backward" if custom else "JAX autodiff of forward",
            fix=fix,
            note=autodiff_note,
        )

    # -- autodiff and export --

    def test_autodiff(self, training: bool):
        if has_backward(self.layer):
            return skipped("the layer defines backward, which replaces autodiff")
        self._require("forwarded" if training else "predicted")
        layer = self.layer
        xs = tuple(dlarray(x, f) if f else x for x, f in zip(self.xs, self.formats, strict=True))
        learnables = {n: getattr(layer, n) for n in self.names["learnables"]}

        def loss(learnables, xs, cotangents):
            outs, _ = call_layer(
                layer.replace(**learnables), xs, training=training, key=self.forward_key
            )
            return sum(jnp.sum(stripdims(y) * c) for y, c in zip(outs, cotangents, strict=True))

        outs = (self.forwarded if training else self.predicted)[0]
        cotangents = [
            self.data.normal(80 + i, stripdims(y).shape, stripdims(y).dtype)
            for i, y in enumerate(outs)
        ]
        grad_fn = jax.grad(loss, argnums=(0, 1))
        if self.cls.acceleratable:
            grad_fn = jax.jit(grad_fn)
        grads = grad_fn(learnables, xs, cotangents)
        problems = []
        for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
            if not bool(jnp.all(jnp.isfinite(g))):
                problems.append(f"the gradient at {jax.tree_util.keystr(path)} is not finite")
        if problems:
            return failed(
                "autodiff through "
                + ("forward" if training else "predict")
                + ": "
                + "; ".join(problems)
            )
        return None

    def test_export(self, check_export: bool):
        if not check_export:
            return skipped("check_export=False")
        self._require("predicted")
        if not self.cls.acceleratable:
            return failed(
                f"{self.cls.__name__} sets acceleratable = False: it runs eagerly and cannot be "
                "traced, so jax.export cannot export it. Fix: express value-dependent branches "
                "with jnp.where or jax.lax.cond and drop acceleratable = False."
            )
        layer, formats = self.layer, self.formats

        def predict(*xs):
            inputs = [dlarray(x, f) if f else x for x, f in zip(xs, formats, strict=True)]
            outs, state = call_layer(layer, inputs, training=False)
            return tuple(stripdims(v) for v in (*outs, *state))

        loaded = _export.load_function(_export.export_bytes(predict, *self.layouts))
        batch_sizes = [None]
        if any(layout.size("B") is None for layout in self.layouts if "B" in layout.format):
            batch_sizes.append(1)
        problems = []
        for batch in batch_sizes:
            xs = list(self.xs)
            if batch is not None:
                xs = [
                    jax.lax.slice_in_dim(x, 0, batch, axis=f.find("B")) if "B" in f else x
                    for x, f in zip(xs, formats, strict=True)
                ]
            expected, got = predict(*xs), loaded(*xs)
            for i, (e, g) in enumerate(zip(expected, got, strict=True)):
                problems += _compare(f"value {i + 1}", e, g, EXPORT_RTOL)
            cotangents = [jnp.ones_like(e) for e in expected]
            expected_vjp = jax.vjp(predict, *xs)[1](tuple(cotangents))
            got_vjp = jax.vjp(loaded, *xs)[1](tuple(cotangents))
            for i, (e, g) in enumerate(zip(expected_vjp, got_vjp, strict=True)):
                problems += _compare(f"the gradient of input {i + 1}", e, g, EXPORT_RTOL)
        if problems:
            return failed("the exported predict differs: " + "; ".join(problems))
        return None


def _run_plain(layer, xs, key, formats, training):
    return _run_user(layer, _user_inputs(layer, xs, formats), training, key)


_run_jit = jax.jit(_run_plain, static_argnames=("formats", "training"))


def _backward_call(layer, xs, cotangents, forward_key, formats, takes_state):
    """Forward, then the user's backward with the given upstream gradients; its raw result.

    ``cotangents``: one per output, then (if ``takes_state``) one per state output.
    """
    inputs = _user_inputs(layer, xs, formats)
    outs, state, memory = _run_user(layer, inputs, True, forward_key)
    dys = [
        _like(jnp.asarray(c, stripdims(y).dtype), y) for c, y in zip(cotangents, outs, strict=False)
    ]
    extra = []
    if takes_state:
        extra = [
            jnp.asarray(c, stripdims(s).dtype)
            for c, s in zip(cotangents[len(outs) :], state, strict=True)
        ]
    return layer.backward(*inputs, *outs, *dys, *extra, memory)


class _Data:
    """Deterministic test data drawn with NumPy from a key: nothing to compile."""

    def __init__(self, key):
        self.seed = [int(v) for v in np.asarray(jax.random.key_data(key)).ravel()]

    def seq(self, tag: int) -> list[int]:
        return [*self.seed, tag]

    def normal(self, tag: int, shape, dtype) -> jax.Array:
        values = np.random.default_rng(self.seq(tag)).standard_normal(tuple(shape))
        return jnp.asarray(values, dtype=dtype)

    def key(self, tag: int):
        return jax.random.key(int(np.random.default_rng(self.seq(tag)).integers(2**31 - 1)))


_backward_jit = jax.jit(_backward_call, static_argnames=("formats", "takes_state"))


class _Unusable(Exception):
    """The gradient check cannot run, for a reason another test reports."""


def _state_shape_ok(old, new) -> bool:
    """A new state keeps the field's shape, except that an axis of size 1 may grow (a state
    kept per observation, like an LSTM's hidden state, starts with one row)."""
    old, new = tuple(old), tuple(new)
    return len(old) == len(new) and all(a == b or a == 1 for a, b in zip(old, new, strict=True))


def _compare(what, expected, got, rtol) -> list[str]:
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape:
        return [f"{what} has shape {got.shape}, expected {expected.shape}"]
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-30)
    error = float(np.max(np.abs(expected - got), initial=0.0))
    if not error <= rtol * scale:
        return [f"{what} differs by {error:.3g} (relative {error / scale:.3g})"]
    return []


def _belongs(path, where) -> bool:
    if isinstance(where, tuple):  # an input: (0, i)
        return (
            len(path) >= 2
            and getattr(path[0], "idx", None) == 0
            and getattr(path[1], "idx", None) == where[1]
        )
    return (
        len(path) >= 2
        and getattr(path[0], "idx", None) == 1
        and getattr(path[1], "name", None) == where
    )


def _tree_change(before, after) -> str | None:
    """A description of how ``after`` differs from ``before`` (None if identical)."""
    leaves_b, tree_b = jax.tree.flatten(before)
    leaves_a, tree_a = jax.tree.flatten(after)
    if tree_b != tree_a or len(leaves_a) != len(leaves_b):
        return "its structure changed"
    for b, a in zip(leaves_b, leaves_a, strict=True):
        if not isinstance(b, (jax.Array, np.ndarray, np.generic, int, float, complex)):
            try:
                same = b is a or bool(b == a)
            except Exception:  # noqa: BLE001 - objects without a usable ==
                same = False
            if not same:
                return "its value changed"
            continue
        b, a = np.asarray(b), np.asarray(a)
        if b.shape != a.shape:
            return f"shape {_shape_text(b.shape)} became {_shape_text(a.shape)}"
        if b.dtype != a.dtype:
            return f"dtype {b.dtype} became {a.dtype}"
        if not np.array_equal(b, a, equal_nan=b.dtype.kind in "fc"):
            gap = np.abs(a.astype(np.float64) - b.astype(np.float64))
            where = _index_text(int(np.argmax(gap)), gap.shape)
            return f"largest change {float(np.max(gap)):.3g} at {where}"
    return None


def gradient_outcome(key, verdicts, labels, *, shape, locate, who, fix, note=""):
    """The test outcome for one checked value's gradient verdict, with the words users need.

    Args:
      key: the verdict to describe, in ``verdicts``.
      verdicts: every value's verdict (for the swapped-gradients hint).
      labels: ``{key: "learnable 'alpha'"}`` for every verdict.
      shape: the value's shape (``None`` for a pytree of several arrays).
      locate: element index -> ``"(0, 0, 0, 7)"``.
      who: what computed the gradient under test (``"the custom backward"``).
      fix: the closing ``Fix: ...`` sentence.
      note: an extra line (e.g. that autodiff was unavailable as a reference).
    """
    verdict = verdicts[key]
    what = labels[key]
    method = numerical.describe_method(verdict)
    if verdict.status == "Incomplete":
        reasons = sorted({p.reason for p in verdict.unresolved})
        return incomplete(
            f"the gradient of {what} could not be verified: finite differences were unreliable "
            f"at every sample point ({'; '.join(reasons)}), even after moving it. The function "
            "may be non-differentiable almost everywhere, noisy, or compute in low precision."
        )
    if verdict.status == "Passed":
        return passed("\n".join([f"checked along {method}"] + ([note] if note else [])))
    if shape is not None:
        size = " x ".join(str(s) for s in shape) or "a scalar"
    else:
        size = f"{verdict.segment.size} values"
    lines = [
        f"The gradient of the loss with respect to {what} ({size}) from {who} disagrees with "
        "the numerical derivative."
    ]
    lines += numerical.describe_failure(verdict, locate)
    hint = _swap_hint(key, verdicts, labels)
    if hint:
        lines.append(hint)
    lines.append(fix)
    lines.append(f"(checked along {method})")
    if note:
        lines.append(note)
    return failed("\n".join(lines))


def _swap_hint(key, verdicts, labels) -> str:
    """A hint when this gradient equals another value's expected gradient (order swapped)."""
    verdict = verdicts[key]
    got = verdict.gradients[verdict.under_test]
    for other_key, other in verdicts.items():
        if other_key == key or other.segment.size != verdict.segment.size:
            continue
        reference = other.reference()
        if reference is None or not np.any(reference):
            continue
        scale = float(np.max(np.abs(reference)))
        if float(np.max(np.abs(got - reference))) <= 1e-6 * scale:
            return (
                f"  Hint: these values are the expected gradient of {labels[other_key]}: are two "
                "gradients returned in the wrong order?"
            )
    return ""
