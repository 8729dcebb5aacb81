"""The onnx package's own backend node test cases, run through ``df.import_onnx``.

For every operator difffn implements (``difffn/_onnx/_ops*.py``), every node test case that the
installed onnx package generates (``onnx.backend.test.case.node``: the wheel ships the
generators, which run when their modules are imported) is imported with ``df.import_onnx`` and
run with ``net.predict`` on the case's inputs; the outputs must match the case's expected
outputs. Inputs that give shapes, axes, pads and the like (the operator's static inputs, and
what feeds them) become initializers: difffn needs them when it traces, and the models that
MATLAB and PyTorch export hold them as initializers. Network inputs and outputs are moved
between ONNX's axis order and difffn's storage order with the labels the importer reports.

Cases outside what difffn supports are listed in ``EXCLUDED`` with the reason; each must be
refused with a ``df.ONNXImportError`` that says so. ``EXPANDED`` runs a sample of the
multi-node "expanded" cases (ONNX functions written out as graphs of primitive operators, with
their Shape/Gather/Concat subgraphs), marked slow.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
import re
import warnings

import jax
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import difffn as df
from difffn._onnx import _labels, _ops
from difffn._onnx._import import import_model

_ops._load_families()
SUPPORTED = sorted(_ops.OPS)

# name pattern -> (why difffn does not run the case, what its ONNXImportError says)
EXCLUDED = {
    r"FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2|e8m0": (
        "8-, 4- and 2-bit element types: difffn has no dtype for them",
        r"the element type \w+ is not supported",
    ),
    r"_string": ("string tensors", r"the element type string is not supported"),
    r"^test_training_dropout": (
        "training-mode Dropout draws random masks, which cannot match ONNX's",
        r"training_mode=True",
    ),
    r"^test_constant$|^test_constantofshape_|^test_range_|window(_symmetric)?_expanded$": (
        "the output does not depend on any input (a constant); a network computes outputs "
        "from its inputs",
        r"does not depend on the model inputs",
    ),
    r"^test_identity_(sequence|opt)$": (
        "sequence and optional types",
        r"is not a tensor \(a sequence, map or optional\)",
    ),
    r"^test_maxpool_with_argmax_": ("MaxPool's Indices output", r"MaxPool with the Indices output"),
    r"^test_resize_(?!(down|up)sample_scales_linear$|upsample_sizes_nearest_round_prefer_ceil)": (
        "Resize modes that Resize2D does not compute (cubic, align_corners, antialias, axes, "
        "crops, aspect-ratio policies, round_prefer_floor and ceil rounding)",
        r"\(Resize\): Resize (mode=|coordinate_transformation_mode=|with |nearest_mode=|"
        r"pytorch_half_pixel)",
    ),
}

# cases whose expected values are rounded in the onnx source (checked with a looser tolerance)
ROUNDED = {"test_averagepool_2d_ceil_last_window_starts_on_pad": 1e-4}

EXPANDED = [
    "test_layer_normalization_4d_axis0_expanded",
    "test_layer_normalization_4d_axis_negative_1_expanded",
    "test_layer_normalization_default_axis_expanded_ver18",
    "test_group_normalization_example_expanded",
    "test_rms_normalization_4d_axis1_expanded",
    "test_mvn_expanded",
    "test_attention_4d_expanded",
    "test_attention_3d_expanded",
    "test_rotary_embedding_expanded",
    "test_nllloss_NCd1d2_expanded",
    "test_softmax_example_expanded",
    "test_logsoftmax_axis_0_expanded",
    "test_center_crop_pad_crop_expanded",
    "test_causal_conv_with_state_basic_expanded",
    "test_gelu_tanh_1_expanded",
    "test_mish_expanded",
    "test_swiglu_expanded",
    "test_prelu_broadcast_expanded",
    "test_celu_expanded",
    "test_hardswish_expanded",
    "test_depthtospace_crd_mode_example_expanded",
    "test_spacetodepth_expanded",
    "test_clip_default_min_expanded",
    "test_reduce_l2_do_not_keepdims_example_expanded",
    "test_reduce_log_sum_default_expanded",
    "test_elu_expanded_ver18",
]


@functools.cache
def node_cases() -> dict:
    """Every node test case the installed onnx generates, by name (generated once)."""
    package = importlib.import_module("onnx.backend.test.case.node")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators' own NumPy overflow notices
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
    return {case.name: case for case in package._NodeTestCases}


def exclusion(name: str):
    for pattern, value in EXCLUDED.items():
        if re.search(pattern, name):
            return value
    return None


def single_node_cases(op_type: str) -> list[str]:
    return sorted(
        name
        for name, case in node_cases().items()
        if len(case.model.graph.node) == 1 and case.model.graph.node[0].op_type == op_type
    )


@contextlib.contextmanager
def precision(x64: bool):
    """float64/int64 cases run with jax x64 (as the x64 fixture does), the others without."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", x64)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def _array(value):
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def prepared(case):
    """The case's model with its static inputs as initializers, and the runtime feeds."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    graph = model.graph
    inputs, outputs = case.data_sets[0]
    inputs = [np.asarray(_array(v)) for v in inputs]
    outputs = [np.asarray(_array(v)) for v in outputs]
    needed = set()
    for node in reversed(list(graph.node)):
        definition = _ops.lookup(node.op_type)
        meta = dict(definition.meta)
        feeds_static = any(name in needed for name in node.output)
        for position, name in enumerate(node.input):
            if name and position not in meta and (position in definition.static or feeds_static):
                needed.add(name)
    names = [info.name for info in graph.input]
    feeds = {}
    for name, value in zip(names, inputs):
        if name in needed:
            graph.initializer.append(numpy_helper.from_array(value, name))
        else:
            feeds[name] = value
    kept = [info for info in graph.input if info.name not in needed]
    del graph.input[:]
    graph.input.extend(kept)
    return model, feeds, outputs


def tolerance(name: str, dtype) -> tuple[float, float]:
    if name in ROUNDED:
        return 1e-4, ROUNDED[name]
    if dtype == np.float16:
        return 2e-3, 2e-3
    if dtype.name == "bfloat16":
        return 2e-2, 2e-2
    return 1e-4, 1e-5


def run_case(name: str) -> None:
    """Import the case, run it, and compare every output with the expected one."""
    case = node_cases()[name]
    model, feeds, expected = prepared(case)
    wide = any(a.dtype in (np.float64, np.int64, np.uint64) for a in [*feeds.values(), *expected])
    with precision(wide):
        result = import_model(model)
        xs = [_labels.to_storage(x, result.input_labels[n]) for n, x in feeds.items()]
        ys = result.network.predict(*xs)
        ys = ys if isinstance(ys, tuple) else (ys,)
        assert len(ys) == len(expected)
        for y, want, info in zip(ys, expected, model.graph.output):
            got = _labels.to_onnx(np.asarray(df.stripdims(y)), result.output_labels[info.name])
            assert got.shape == want.shape, f"{name} {info.name}: {got.shape} != {want.shape}"
            if want.dtype == bool or want.dtype.kind in "iu":
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {info.name}")
            else:
                rtol, atol = tolerance(name, want.dtype)
                np.testing.assert_allclose(
                    got.astype(np.float64),
                    want.astype(np.float64),
                    rtol=rtol,
                    atol=atol,
                    err_msg=f"{name} {info.name}",
                )


@pytest.mark.parametrize("op_type", SUPPORTED)
def test_every_node_case_of_the_operator(op_type):
    failures = []
    for name in single_node_cases(op_type):
        excluded = exclusion(name)
        try:
            if excluded is None:
                run_case(name)
            else:
                reason, message = excluded
                with pytest.raises(df.ONNXImportError, match=message):
                    import_model(prepared(node_cases()[name])[0])
        except Exception as error:  # noqa: BLE001 - every failing case is listed below
            failures.append(f"{name}: {type(error).__name__}: {str(error)[:300]}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPANDED)
def test_expanded_function_case(name):
    run_case(name)


def test_the_cases_cover_the_supported_operators():
    counts = {op: len(single_node_cases(op)) for op in SUPPORTED}
    runnable = {op: sum(exclusion(n) is None for n in single_node_cases(op)) for op in SUPPORTED}
    assert sum(runnable.values()) >= 700
    without = sorted(op for op, n in counts.items() if n == 0)
    # operators the onnx package has no single-node case for are tested in test_onnx_import.py
    assert without == ["GlobalLpPool"], without
    assert set(EXPANDED) <= set(node_cases())
