"""The public surface: the contract's names exist, are documented, and appear in docs/api.md."""

from __future__ import annotations

import inspect
import types

import pytest
from helpers import ROOT

import difffn as df

# The names of the public API contract, which users and outside test suites rely on.
CONTRACT = [
    "BackwardError",
    "CheckReport",
    "DifferentiableFunction",
    "Error",
    "HigherOrderError",
    "FormattedArray",
    "Layer",
    "Layout",
    "Network",
    "TrainingOptions",
    "adamupdate",
    "check_function",
    "check_layer",
    "data",
    "dims",
    "dlarray",
    "export",
    "finddim",
    "get_l2_factor",
    "get_learn_rate_factor",
    "layers",
    "learnable",
    "load",
    "load_exported",
    "losses",
    "minibatchpredict",
    "minibatchqueue",
    "MiniBatchQueue",
    "dlupdate",
    "permute",
    "rmspropupdate",
    "save",
    "scores2label",
    "set_l2_factor",
    "set_learn_rate_factor",
    "sgdmupdate",
    "state",
    "stripdims",
    "testnet",
    "trainnet",
]
LAYERS = [
    "ImageInput",
    "FeatureInput",
    "SequenceInput",
    "Conv2D",
    "BatchNorm",
    "FullyConnected",
    "ReLU",
    "ELU",
    "Softmax",
    "Dropout",
    "Flatten",
    "MaxPool2D",
    "GlobalAveragePool2D",
    "Addition",
    "Concatenation",
    "LSTM",
    "FunctionLayer",
    "GRU",
    "BiLSTM",
    "Embedding",
    "SelfAttention",
    "PositionEmbedding",
    "SinusoidalPositionEncoding",
    "MaxPool1D",
    "AveragePool1D",
    "GlobalAveragePool1D",
    "GlobalMaxPool1D",
]


def public_names(module):
    return sorted(n for n in dir(module) if not n.startswith("_"))


@pytest.mark.parametrize("name", CONTRACT)
def test_contract_name_exists(name):
    assert hasattr(df, name), f"df.{name} is part of the API contract but missing"


@pytest.mark.parametrize("name", LAYERS)
def test_builtin_layer_exists(name):
    assert issubclass(getattr(df.layers, name), df.Layer)


def test_every_error_is_in_the_difffn_family():
    errors = [getattr(df, n) for n in public_names(df) if n.endswith("Error")]
    assert errors and all(issubclass(e, df.Error) for e in errors)


def test_every_public_name_has_a_docstring():
    missing = []
    for module in (df, df.layers):
        for name in public_names(module):
            obj = getattr(module, name)
            if isinstance(obj, (types.ModuleType, str)):
                continue
            if not inspect.getdoc(obj):
                missing.append(f"{module.__name__}.{name}")
    assert not missing, f"public names without a docstring: {missing}"


def test_every_public_name_appears_in_the_api_reference():
    reference = (ROOT / "docs" / "api.md").read_text()
    missing = [
        f"df.{name}"
        for name in public_names(df)
        if f"df.{name}" not in reference and name not in ("annotations",)
    ]
    assert not missing, f"docs/api.md does not mention: {missing}"
