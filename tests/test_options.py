"""TrainingOptions: MATLAB's defaults per solver, validation with clear errors, repr, replace."""

from __future__ import annotations

import math

import pytest
from helpers import ROOT
from training_layers import regression_data, regression_net

import difffn as df
from difffn._training import _option_checks, _options


def test_sgdm_defaults_are_matlab_defaults():
    o = df.TrainingOptions()
    assert o.solver == "sgdm"
    assert (o.initial_learn_rate, o.momentum) == (0.01, 0.9)
    assert (o.max_epochs, o.mini_batch_size, o.shuffle) == (30, 128, "once")
    assert o.l2_regularization == 1e-4
    assert (o.validation_frequency, o.verbose_frequency) == (50, 50)
    assert o.validation_patience == math.inf
    assert o.gradient_threshold == math.inf and o.gradient_threshold_method == "l2norm"
    assert o.learn_rate_schedule == "none" and o.learn_rate_drop_factor == 0.1
    assert o.learn_rate_drop_period == 10
    assert o.output_network == "auto" and o.resolved_output_network == "last-iteration"
    assert o.execution_environment == "auto" and o.plots == "none" and o.verbose is True
    assert o.gradient_decay_factor is None and o.epsilon is None


def test_adam_and_rmsprop_defaults():
    adam = df.TrainingOptions("adam")
    assert adam.initial_learn_rate == 0.001
    assert (adam.gradient_decay_factor, adam.squared_gradient_decay_factor) == (0.9, 0.999)
    assert adam.epsilon == 1e-8 and adam.momentum is None
    rms = df.TrainingOptions("rmsprop")
    assert rms.initial_learn_rate == 0.001
    assert rms.squared_gradient_decay_factor == 0.9 and rms.epsilon == 1e-8


def test_repr_shows_only_what_differs_from_the_defaults():
    assert repr(df.TrainingOptions()) == "TrainingOptions('sgdm')"
    o = df.TrainingOptions("adam", max_epochs=4, initial_learn_rate=0.001, metrics="accuracy")
    assert repr(o) == "TrainingOptions('adam', max_epochs=4, metrics=['accuracy'])"


def test_options_are_immutable_and_replace_returns_new_options():
    o = df.TrainingOptions(max_epochs=3)
    with pytest.raises(df.OptionsError, match="immutable"):
        o.max_epochs = 4
    o2 = o.replace(mini_batch_size=16)
    assert (o2.max_epochs, o2.mini_batch_size, o.mini_batch_size) == (3, 16, 128)
    adam = o.replace(solver="adam")
    assert adam.solver == "adam" and adam.initial_learn_rate == 0.001 and adam.max_epochs == 3


def test_best_validation_resolves_with_validation_data():
    o = df.TrainingOptions(validation_data=([[0.0]], [0]))
    assert o.resolved_output_network == "best-validation"


def test_unknown_option_suggests_the_snake_case_name_and_lists_all():
    with pytest.raises(df.OptionsError, match=r"'MaxEpochs' \(did you mean 'max_epochs'\?\)"):
        df.TrainingOptions(MaxEpochs=3)
    with pytest.raises(df.OptionsError, match="Valid options: checkpoint_frequency, .*verbose"):
        df.TrainingOptions(colour="red")


def test_solver_specific_option_for_another_solver():
    with pytest.raises(df.OptionsError, match=r"momentum is an option of solver\(s\) \['sgdm'\]"):
        df.TrainingOptions("adam", momentum=0.5)
    with pytest.raises(df.OptionsError, match="gradient_decay_factor.*'rmsprop' options are"):
        df.TrainingOptions("rmsprop", gradient_decay_factor=0.5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_epochs": 0}, "max_epochs must be a positive int"),
        ({"max_epochs": 2.5}, "max_epochs must be a positive int"),
        ({"mini_batch_size": True}, "mini_batch_size must be a positive int"),
        ({"shuffle": "always"}, "shuffle must be one of 'once', 'every-epoch', 'never'"),
        ({"initial_learn_rate": 0}, "initial_learn_rate must be a positive real number"),
        ({"momentum": 1.5}, r"momentum must be a real number in \[0, 1\]"),
        ({"l2_regularization": -1}, "l2_regularization must be a non-negative real number"),
        (
            {"gradient_threshold_method": "norm"},
            "gradient_threshold_method must be one of 'l2norm', 'global-l2norm', 'absolute-value'",
        ),
        ({"gradient_threshold": 0}, "gradient_threshold must be a positive real number"),
        ({"validation_patience": 0}, "validation_patience must be a positive int or math.inf"),
        ({"output_network": "best"}, "output_network must be one of 'auto', 'last-iteration'"),
        ({"output_network": "best-validation"}, "needs validation_data"),
        ({"objective_metric_name": "accuracy"}, "objective_metric_name must be 'loss' or one"),
        ({"plots": "yes"}, "plots must be one of 'none', 'training-progress'"),
        ({"verbose": 1}, "verbose must be True or False"),
        ({"output_fcn": 3}, "output_fcn must be a callable"),
        ({"execution_environment": "tpu"}, "'auto', 'cpu', 'gpu', 'multi-device'"),
        ({"execution_environment": "multi-gpu"}, "MATLAB's 'multi-gpu' is 'multi-device' here"),
        (
            {"execution_environment": "parallel"},
            r"'parallel' is 'multi-device' here .* or 'multi-host' .*jax.distributed.initialize",
        ),
        ({"parameter_sharding": "zero3"}, "parameter_sharding must be one of 'replicated', 'fsdp'"),
        (
            {"parameter_sharding": "fsdp"},
            r"parameter_sharding='fsdp' applies to training over a mesh .* "
            r"execution_environment='auto' runs on one device. Fix: execution_environment="
            r"'multi-device'",
        ),
        (
            {"execution_environment": "multi-device", "mesh_shape": {"data": 2, "tensor": 2}},
            r"mesh_shape names the mesh axis 'tensor'; the axes are \['data', 'model'\]",
        ),
        (
            {"execution_environment": "multi-device", "mesh_shape": {"data": 0}},
            r"mesh_shape\['data'\] must be a positive int \(or -1",
        ),
        (
            {"execution_environment": "multi-device", "mesh_shape": {"data": -1, "model": -1}},
            "at most one axis size to be inferred",
        ),
        ({"mesh_shape": {"data": 2}}, "mesh_shape=\\{'data': 2\\} applies to training over a mesh"),
        ({"precision": "half"}, "precision must be one of 'float32', 'bfloat16', 'float16'"),
        ({"checkpoint_path": "/no/such/folder"}, "checkpoint_path must be an existing folder"),
        ({"checkpoint_frequency_unit": "batch"}, "one of 'epoch', 'iteration'"),
        ({"metrics": ["accuracy", "accuracy"]}, "repeated names"),
        ({"learn_rate_schedule": "step"}, "not a schedule; expected one of .*'piecewise'"),
        (
            {"learn_rate_drop_factor": 2},
            r"learn_rate_drop_factor must be a real number in \[0, 1\]",
        ),
        (
            {"learn_rate_schedule": "cosine", "learn_rate_schedule_settings": {"perid": 3}},
            "has no setting 'perid'; the settings of 'cosine' are",
        ),
        (
            {"learn_rate_schedule": "warmup", "learn_rate_schedule_settings": {"num_steps": 0}},
            "num_steps'] must be a positive integer",
        ),
        (
            {
                "learn_rate_schedule": ("warmup", "cosine"),
                "learn_rate_schedule_settings": {"num_steps": 3},
            },
            "key the settings by schedule name",
        ),
        (
            {"learn_rate_schedule": (lambda lr, i, e: lr, "cosine")},
            "can only be the last entry",
        ),
    ],
)
def test_bad_values_are_clear_errors(kwargs, match):
    with pytest.raises(df.OptionsError, match=match):
        df.TrainingOptions(**kwargs)


def test_bad_solver_lists_the_solvers():
    with pytest.raises(df.OptionsError, match="solver must be one of 'sgdm', 'adam', 'rmsprop'"):
        df.TrainingOptions("lbfgs")


def test_checkpoint_path_must_exist(tmp_path):
    o = df.TrainingOptions(checkpoint_path=tmp_path, checkpoint_frequency=2)
    assert o.checkpoint_path == str(tmp_path)
    assert o.checkpoint_frequency_unit == "epoch"


def test_objective_metric_may_be_a_listed_metric():
    o = df.TrainingOptions(metrics=["accuracy", "fscore"], objective_metric_name="fscore")
    assert [m.name for m in o.metrics] == ["accuracy", "fscore"]


# -- the options table ----------------------------------------------------------------------------


def test_every_option_of_the_table_is_documented():
    docs = (ROOT / "docs" / "training.md").read_text()
    for name in _options.option_names():
        assert name in df.TrainingOptions.__doc__, name
        assert f"`{name}" in docs, name


def test_the_fingerprint_and_the_step_key_come_from_the_table():
    o = df.TrainingOptions("adam", max_epochs=3, gradient_threshold=2.0, verbose=False)
    fingerprint = _options.fingerprint(o)
    assert fingerprint["option max_epochs"] == "3"
    assert fingerprint["option squared_gradient_decay_factor"] == "0.999"
    assert fingerprint["option momentum"] == "None"  # an sgdm option: None for adam
    assert fingerprint["option output_network"] == "'last-iteration'"  # "auto", resolved
    assert "option verbose" not in fingerprint and "option checkpoint_path" not in fingerprint
    assert set(fingerprint) == {f"option {r.name}" for r in _options.OPTIONS if r.numbers}
    key = dict(_options.step_key(o))
    assert key["solver"] == "adam" and key["gradient_threshold"] == 2.0
    assert "max_epochs" not in key and "initial_learn_rate" not in key  # learn rate: a step input


def test_adding_an_option_to_the_table_is_enough(monkeypatch, tmp_path):
    """A new row: validated, defaulted, shown, replaced, fingerprinted, in the step key."""
    X, T = regression_data(32)
    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir()
    after.mkdir()
    base = df.TrainingOptions(max_epochs=2, mini_batch_size=16, verbose=False)
    df.trainnet(X, T, regression_net(), "mse", base.replace(checkpoint_path=before))

    row = _options.Option(
        "ema_decay", 0.0, _option_checks.real(low=0, high=1), numbers=True, step=True
    )
    monkeypatch.setattr(_options, "OPTIONS", (*_options.OPTIONS, row))
    base = base.replace()  # options made with the new table
    o = df.TrainingOptions(ema_decay=0.5, verbose=False)
    assert (o.ema_decay, df.TrainingOptions().ema_decay) == (0.5, 0.0)
    assert repr(o) == "TrainingOptions('sgdm', ema_decay=0.5, verbose=False)"
    assert o.replace(max_epochs=2).ema_decay == 0.5
    assert o.replace(solver="adam").ema_decay == 0.5
    with pytest.raises(df.OptionsError, match=r"'ema_dacay' \(did you mean 'ema_decay'\?\)"):
        df.TrainingOptions(ema_dacay=0.5)
    with pytest.raises(df.OptionsError, match=r"ema_decay must be a real number in \[0, 1\]"):
        df.TrainingOptions(ema_decay=2)
    assert _options.fingerprint(o)["option ema_decay"] == "0.5"
    assert ("ema_decay", 0.5) in _options.step_key(o)
    assert ("ema_decay", 0.0) in _options.step_key(o.replace(ema_decay=0.0))

    # through trainnet: a resume with another value is refused, naming the option
    options = base.replace(ema_decay=0.5, checkpoint_path=after)
    df.trainnet(X, T, regression_net(), "mse", options)
    with pytest.raises(
        df.SerializationError, match=r"differs in option ema_decay: it had 0.5; this call has 0.25"
    ):
        df.trainnet(
            X, T, regression_net(), "mse", options.replace(ema_decay=0.25), resume_from=after
        )
    # a checkpoint written before the option existed lacks it, and counts as having the default
    df.trainnet(X, T, regression_net(), "mse", base, resume_from=before)
    with pytest.raises(
        df.SerializationError, match=r"differs in option ema_decay: it had 0.0; this call has 0.5"
    ):
        df.trainnet(X, T, regression_net(), "mse", base.replace(ema_decay=0.5), resume_from=before)
