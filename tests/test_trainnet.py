"""trainnet: each option's effect, the history and info, logging, data forms and errors."""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_tree_allclose
from training_layers import (
    Affine,
    RunningMean,
    classification_data,
    classifier_net,
    regression_data,
    regression_net,
)

import difffn as df
from difffn._training import _checkpoint


def quiet(**options):
    return df.TrainingOptions(**{"verbose": False, **options})


# -- basics ---------------------------------------------------------------------------------------


def test_regression_converges_and_returns_a_trained_network(key):
    X, T = regression_data(128)
    net = regression_net().initialize(key=key)
    before = {k: np.array(v) for k, v in net.learnables.items()}
    opts = quiet(solver="adam", initial_learn_rate=0.05, max_epochs=40, mini_batch_size=32)
    trained, info = df.trainnet(X, T, net, "mse", opts)
    assert isinstance(trained, df.Network) and isinstance(info, df.TrainingInfo)
    assert info.training_history["loss"][-1] < 1e-2 < info.training_history["loss"][0]
    assert info.stop_reason == "Max epochs completed"
    assert info.output_network_iteration == 40 * 4 == len(info.training_history)
    # the caller's network is untouched (the step donates only its own copies)
    for k, v in net.learnables.items():
        np.testing.assert_array_equal(v, before[k])


def test_a_list_of_layers_trains_like_the_network_built_from_it():
    # MATLAB's trainnet takes a layer array as well as a dlnetwork.
    X, T = regression_data(32)
    opts = quiet(max_epochs=1, mini_batch_size=32)
    layers = list(regression_net().layers)
    from_list, _ = df.trainnet(X, T, layers, "mse", opts, key=jax.random.key(1))
    from_net, _ = df.trainnet(X, T, df.Network(layers), "mse", opts, key=jax.random.key(1))
    assert isinstance(from_list, df.Network) and from_list.connections == from_net.connections
    assert_tree_allclose(from_list.learnables, from_net.learnables)


def test_history_columns_and_values():
    X, T = classification_data(64)
    opts = quiet(max_epochs=2, mini_batch_size=16, metrics=["accuracy", "fscore"])
    _, info = df.trainnet(X, T, classifier_net(), "crossentropy", opts)
    h = info.training_history
    assert h.columns == (
        "iteration",
        "epoch",
        "time_elapsed",
        "learn_rate",
        "loss",
        "accuracy",
        "fscore",
    )
    np.testing.assert_array_equal(h["iteration"], np.arange(1, 9))
    np.testing.assert_array_equal(h["epoch"], [1] * 4 + [2] * 4)
    np.testing.assert_allclose(h["learn_rate"], 0.01)
    assert np.all((h["accuracy"] >= 0) & (h["accuracy"] <= 100))
    assert np.all(np.diff(h["time_elapsed"]) >= 0)
    assert len(info.validation_history) == 0
    assert len(h.rows()) == 8 and h.rows()[0]["iteration"] == 1


def test_uninitialized_network_is_initialized_from_the_key():
    X, T = regression_data(32)
    opts = quiet(max_epochs=1, mini_batch_size=32)
    a, _ = df.trainnet(X, T, regression_net(), "mse", opts, key=jax.random.key(1))
    b, _ = df.trainnet(X, T, regression_net(), "mse", opts, key=jax.random.key(1))
    c, _ = df.trainnet(X, T, regression_net(), "mse", opts, key=jax.random.key(2))
    assert_tree_allclose(a.learnables, b.learnables)
    assert not np.allclose(a.learnables["fc/weights"], c.learnables["fc/weights"])


def test_input_normalization_statistics_are_computed_from_the_training_data(capsys):
    X, T = regression_data(64)
    X = X * 3 + 5
    net = df.Network(
        [df.layers.FeatureInput(3, normalization="zscore", name="in"), Affine(name="fc")]
    )
    trained, _ = df.trainnet(X, T, net, "mse", df.TrainingOptions(max_epochs=1, mini_batch_size=64))
    layer = trained.layer("in")
    np.testing.assert_allclose(layer.mean, X.mean(0), rtol=1e-5)
    np.testing.assert_allclose(layer.standard_deviation, X.std(0), rtol=1e-4)
    assert "Initializing input data normalization." in capsys.readouterr().out


def test_state_is_updated_during_training(key):
    X, T = regression_data(64)
    net = df.Network(
        [df.layers.FeatureInput(3, name="in"), RunningMean(name="rm"), Affine(name="fc")]
    ).initialize(key=key)
    trained, _ = df.trainnet(X, T, net, "mse", quiet(max_epochs=4, mini_batch_size=64))
    # four updates of mean <- (mean + batch mean) / 2 from 0
    np.testing.assert_allclose(trained.state["rm/mean"], X.mean(0) * (1 - 0.5**4), rtol=1e-5)


class EagerScale(df.Layer):
    """Python control flow on values: the network runs it eagerly."""

    acceleratable = False
    w: jax.Array | None = df.learnable(default=None)

    def initialize(self, layout, *, key):
        return self if self.w is not None else self.replace(w=jnp.ones((1, layout.size("C"))))

    def predict(self, x):
        if float(jnp.max(jnp.abs(x))) > 1e6:
            return x
        return x * self.w


def test_non_acceleratable_networks_train_eagerly(key):
    X, T = regression_data(32)
    net = df.Network(
        [df.layers.FeatureInput(3, name="in"), EagerScale(name="scale"), Affine(name="fc")]
    ).initialize(key=key)
    assert not net.acceleratable
    trained, info = df.trainnet(X, T, net, "mse", quiet(max_epochs=3, mini_batch_size=16))
    assert len(info.training_history) == 6
    assert not np.allclose(trained.learnables["scale/w"], 1.0)


# -- data order: last partial batch, shuffle, key -------------------------------------------------


def index_probe(n=70, batch=32):
    """A frozen model whose batch loss is the mean index of the batch's observations."""
    X = np.arange(n, dtype=np.float32)[:, None]
    T = np.zeros((n, 1), np.float32)
    net = df.Network([df.layers.FeatureInput(1, name="in"), Affine(name="fc")])
    net = net.initialize(key=jax.random.key(0)).replace(
        learnables={"fc/weights": jnp.ones((1, 1)), "fc/bias": jnp.zeros((1, 1))}
    )
    net = df.set_learn_rate_factor(df.set_learn_rate_factor(net, "fc/weights", 0), "fc/bias", 0)
    return X, T, net


def batch_means(shuffle, *, key=0, epochs=3):
    X, T, net = index_probe()
    opts = quiet(max_epochs=epochs, mini_batch_size=32, shuffle=shuffle)
    _, info = df.trainnet(X, T, net, "l1loss", opts, key=jax.random.key(key))
    return info.training_history["loss"].reshape(epochs, -1)


def test_last_partial_batch_is_dropped_and_never_keeps_the_order():
    means = batch_means("never")
    assert means.shape == (3, 2)  # 70 observations: two batches of 32, the last 6 dropped
    np.testing.assert_allclose(means, [[15.5, 47.5]] * 3)


def test_shuffle_once_keeps_one_order_and_every_epoch_reshuffles():
    once = batch_means("once")
    assert not np.allclose(once[0], [15.5, 47.5])
    np.testing.assert_allclose(once[0], once[1])
    np.testing.assert_allclose(once[0], once[2])
    every = batch_means("every-epoch")
    assert not np.allclose(every[0], every[1])


def test_the_key_fixes_the_shuffle():
    np.testing.assert_allclose(batch_means("every-epoch", key=3), batch_means("every-epoch", key=3))
    assert not np.allclose(batch_means("once", key=3), batch_means("once", key=4))


def test_learn_rate_schedule_is_applied_per_epoch():
    X, T = regression_data(64)
    opts = quiet(
        max_epochs=5,
        mini_batch_size=32,
        learn_rate_schedule="piecewise",
        learn_rate_drop_period=2,
        learn_rate_drop_factor=0.5,
    )
    _, info = df.trainnet(X, T, regression_net(), "mse", opts)
    np.testing.assert_allclose(
        info.training_history["learn_rate"], [0.01] * 4 + [0.005] * 4 + [0.0025] * 2
    )


# -- validation: patience, best network, metrics --------------------------------------------------


def test_validation_patience_stops_training():
    X, T = regression_data(64)
    opts = quiet(
        max_epochs=10,
        mini_batch_size=32,
        validation_data=(X, T),
        validation_frequency=1,
        validation_patience=2,
        learn_rate_schedule=lambda lr, iteration, epoch: 1e-30,  # nothing improves
    )
    _, info = df.trainnet(X, T, regression_net(), "mse", opts)
    assert info.stop_reason == "Stopped by validation patience"
    assert len(info.training_history) == 2
    np.testing.assert_array_equal(info.validation_history["iteration"], [0, 1, 2])


def test_best_validation_returns_the_best_network():
    X, T = regression_data(64)
    Xv, Tv = regression_data(32, seed=1)
    # a good learn rate for six iterations, then one that makes training diverge
    schedule = lambda lr, iteration, epoch: 0.05 if iteration <= 6 else 2.0  # noqa: E731
    opts = quiet(
        solver="adam",
        max_epochs=6,
        mini_batch_size=16,
        validation_data=(Xv, Tv),
        validation_frequency=2,
        learn_rate_schedule=schedule,
    )
    best, info = df.trainnet(X, T, regression_net(), "mse", opts)
    v = info.validation_history
    assert opts.resolved_output_network == "best-validation"
    assert info.output_network_iteration == v["iteration"][np.argmin(v["loss"])] < 24
    assert float(df.losses.mse(best.predict(Xv), Tv)) == pytest.approx(v["loss"].min(), rel=1e-5)
    last, info_last = df.trainnet(
        X, T, regression_net(), "mse", opts.replace(output_network="last-iteration")
    )
    assert info_last.output_network_iteration == 24
    assert float(df.losses.mse(last.predict(Xv), Tv)) == pytest.approx(v["loss"][-1], rel=1e-5)


def test_validation_metrics_score_the_whole_validation_set():
    X, T = classification_data(96)
    Xv, Tv = classification_data(50, seed=1)  # 50: the last validation batch is partial
    opts = quiet(
        max_epochs=3,
        mini_batch_size=16,
        validation_data=(Xv, Tv),
        metrics=["accuracy", "precision"],
        output_network="last-iteration",
    )
    net, info = df.trainnet(X, T, classifier_net(), "crossentropy", opts)
    last = info.validation_history.rows()[-1]
    assert last["iteration"] == 18
    expected = df.testnet(net, Xv, Tv, ["accuracy", "precision", "crossentropy"])
    assert last["accuracy"] == pytest.approx(expected["accuracy"], rel=1e-6)
    assert last["precision"] == pytest.approx(expected["precision"], rel=1e-6)
    assert last["loss"] == pytest.approx(expected["crossentropy"], rel=1e-5)


def test_objective_metric_drives_the_best_network():
    X, T = classification_data(96)
    opts = quiet(
        max_epochs=2,
        mini_batch_size=32,
        validation_data=(X, T),
        validation_frequency=1,
        metrics="accuracy",
        objective_metric_name="accuracy",
    )
    _, info = df.trainnet(X, T, classifier_net(), "crossentropy", opts)
    v = info.validation_history
    assert (
        v["accuracy"][list(v["iteration"]).index(info.output_network_iteration)]
        == v["accuracy"].max()
    )


# -- losses and data forms ------------------------------------------------------------------------


class HalfSquaredError(df.DifferentiableFunction):
    save_inputs_for_backward = True

    def forward(self, y, t):
        return 0.5 * jnp.sum((y - t) ** 2) / y.shape[0]

    def backward(self, dl, compute_gradients, y, t):
        d = dl * (y - t) / y.shape[0]
        return d, (-d if compute_gradients[1] else None)


def test_differentiable_function_and_callable_losses_equal_the_built_in(key):
    X, T = regression_data(64)
    net = regression_net().initialize(key=key)
    opts = quiet(max_epochs=2, mini_batch_size=16)
    reference, _ = df.trainnet(X, T, net, "mse", opts)
    custom, _ = df.trainnet(X, T, net, HalfSquaredError(), opts)
    plain, _ = df.trainnet(X, T, net, lambda y, t: df.losses.mse(y, t), opts)
    assert_tree_allclose(custom.learnables, reference.learnables, rtol=1e-5)
    assert_tree_allclose(plain.learnables, reference.learnables, rtol=1e-6)


def test_integer_and_one_hot_targets_train_alike(key):
    X, T = classification_data(64)
    net = classifier_net().initialize(key=key)
    opts = quiet(max_epochs=2, mini_batch_size=16)
    a, _ = df.trainnet(X, T, net, "crossentropy", opts)
    b, _ = df.trainnet(X, np.eye(3, dtype=np.float32)[T], net, "crossentropy", opts)
    assert_tree_allclose(a.learnables, b.learnables, rtol=1e-5)


def test_iterable_data_equals_arrays_in_the_same_order(key):
    X, T = regression_data(64)
    net = regression_net().initialize(key=key)
    opts = quiet(max_epochs=2, mini_batch_size=16, shuffle="never")
    from_arrays, _ = df.trainnet(X, T, net, "mse", opts)
    batches = [(X[i : i + 16], T[i : i + 16]) for i in range(0, 64, 16)]
    from_batches, info = df.trainnet(batches, net, "mse", opts)
    assert_tree_allclose(from_batches.learnables, from_arrays.learnables, rtol=1e-6)
    assert len(info.training_history) == 8


def test_iterable_data_drops_a_smaller_last_batch(key):
    X, T = regression_data(40)
    batches = [(X[i : i + 16], T[i : i + 16]) for i in range(0, 40, 16)]  # 16, 16, 8
    _, info = df.trainnet(batches, regression_net(), "mse", quiet(max_epochs=2))
    assert len(info.training_history) == 4


def test_iterable_validation_data_equals_arrays(key):
    X, T = classification_data(64)
    net = classifier_net().initialize(key=key)
    opts = quiet(max_epochs=1, mini_batch_size=16, metrics="accuracy", validation_frequency=2)
    _, a = df.trainnet(X, T, net, "crossentropy", opts.replace(validation_data=(X, T)))
    batches = [(X[i : i + 16], T[i : i + 16]) for i in range(0, 64, 16)]
    _, b = df.trainnet(X, T, net, "crossentropy", opts.replace(validation_data=batches))
    np.testing.assert_allclose(b.validation_history["loss"], a.validation_history["loss"], 1e-6)
    np.testing.assert_allclose(b.validation_history["accuracy"], a.validation_history["accuracy"])


def test_two_outputs_and_two_targets(key):
    X, T = regression_data(64, outputs=2)
    net = df.Network(
        [
            df.layers.FeatureInput(3, name="in"),
            Affine(size=1, name="a"),
            [Affine(size=1, name="b")],
        ],
        connections=[("in", "b")],
        outputs=["a", "b"],
    ).initialize(key=key)

    def loss(ya, yb, ta, tb):
        return df.losses.mse(ya, ta) + df.losses.mse(yb, tb)

    opts = quiet(solver="adam", initial_learn_rate=0.05, max_epochs=30, mini_batch_size=16)
    trained, info = df.trainnet(X, (T[:, :1], T[:, 1:]), net, loss, opts)
    assert info.training_history["loss"][-1] < 0.05 * info.training_history["loss"][0]
    ya, yb = trained.predict(X)
    assert float(loss(ya, yb, T[:, :1], T[:, 1:])) < 0.05


def test_formatted_inputs_with_another_layout(key):
    X, T = regression_data(32)
    net = df.Network([Affine(name="fc")])  # no input layer: the format comes from the data
    x = df.dlarray(X, "BC")
    trained, info = df.trainnet(x, T, net, "mse", quiet(max_epochs=2, mini_batch_size=16))
    assert trained.initialized and len(info.training_history) == 4


# -- what people see ------------------------------------------------------------------------------


def test_verbose_table_has_matlab_columns_and_rows(capsys):
    X, T = classification_data(64)
    opts = df.TrainingOptions(
        max_epochs=3,
        mini_batch_size=16,
        validation_data=(X, T),
        validation_frequency=5,
        verbose_frequency=4,
        metrics="accuracy",
    )
    df.trainnet(X, T, classifier_net(), "crossentropy", opts)
    # not a terminal: the progress bar is plain "Progress: ..." lines between the table's rows
    lines = [r for r in capsys.readouterr().out.splitlines() if not r.startswith("Progress: ")]
    header = lines.index(next(line for line in lines if line.lstrip().startswith("Iteration")))
    assert lines[header].split() == [
        "Iteration",
        "Epoch",
        "TimeElapsed",
        "LearnRate",
        "TrainingLoss",
        "ValidationLoss",
        "TrainingAccuracy",
        "ValidationAccuracy",
    ]
    assert set(lines[header + 1].replace(" ", "")) == {"_"}
    rows = lines[header + 2 : lines.index("Training stopped: Max epochs completed")]
    iterations = [int(r.split()[0]) for r in rows]
    assert iterations == [0, 1, 4, 5, 8, 10, 12]  # start, 1, every 4, validations, the end
    for row in rows:
        assert re.search(r"\s\d\d:\d\d:\d\d\s", row)
    zero = rows[0].split()
    assert zero[:4] == ["0", "0", zero[2], "0.01"] and len(zero) == 6  # validation only
    assert len(rows[-1].split()) == 8
    assert rows[0].index(zero[-1]) + len(zero[-1]) == len(rows[0])  # right-aligned columns


def test_a_terminal_gets_a_progress_bar(monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    X, T = regression_data(64)
    opts = df.TrainingOptions(max_epochs=2, mini_batch_size=16, verbose_frequency=4)
    _, info = df.trainnet(X, T, regression_net(), "mse", opts)
    text = terminal.getvalue()
    assert "\r\x1b[2K" in text  # rich redraws the bar in place
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    last = float(info.training_history["loss"][-1])
    bar = re.search(
        r"8/8 epoch 2/2, ([\d.,]+) it/s, 00:00:\d\d left, loss ([\d.e+-]+), learn rate 0\.01",
        plain,
    )
    assert bar is not None, plain
    assert float(bar.group(2)) == pytest.approx(last, rel=1e-3)  # the last row's loss
    table = [line.split("\r")[-1] for line in plain.splitlines()]
    assert table[-1] == "Training stopped: Max epochs completed"


def test_output_that_is_not_a_terminal_gets_plain_progress_lines(capsys):
    X, T = classification_data(64)
    opts = df.TrainingOptions(
        max_epochs=5, mini_batch_size=16, metrics="accuracy", verbose_frequency=4
    )
    _, info = df.trainnet(X, T, classifier_net(), "crossentropy", opts)
    text = capsys.readouterr().out
    assert "\r" not in text and "\x1b" not in text
    lines = [line for line in text.splitlines() if line.startswith("Progress: ")]
    done = [int(re.match(r"Progress: iteration (\d+)/20, ", line).group(1)) for line in lines]
    assert done == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]  # every tenth of the run
    last = re.search(
        r"epoch 5/5, [\d.,]+ it/s, 00:00:00 left, loss (\S+), Accuracy (\S+), "
        r"learn rate 0\.01$",
        lines[-1],
    )
    assert last is not None, lines[-1]
    # the row before the last tick is iteration 16's (verbose_frequency=4)
    assert float(last.group(1).rstrip(",")) == pytest.approx(
        float(info.training_history["loss"][15]), rel=1e-3
    )


def test_verbose_false_prints_nothing(capsys):
    X, T = regression_data(32)
    df.trainnet(X, T, regression_net(), "mse", quiet(max_epochs=1, mini_batch_size=16))
    assert capsys.readouterr().out == ""


def test_training_progress_plot_is_written_and_its_path_printed(tmp_path, capsys):
    X, T = classification_data(64)
    path = tmp_path / "progress.png"
    opts = quiet(
        max_epochs=2,
        mini_batch_size=16,
        metrics="accuracy",
        validation_data=(X, T),
        plots="training-progress",
        plots_path=path,
    )
    _, info = df.trainnet(X, T, classifier_net(), "crossentropy", opts)
    assert info.plot_path == str(path) and os.path.getsize(path) > 10_000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Training progress plot: {path}" in capsys.readouterr().out


def test_output_fcn_sees_progress_and_stops_training():
    X, T = regression_data(64)
    seen = []

    def watch(info):
        seen.append(dict(info))
        return info["iteration"] >= 3

    _, info = df.trainnet(
        X, T, regression_net(), "mse", quiet(max_epochs=5, mini_batch_size=16, output_fcn=watch)
    )
    assert info.stop_reason == "Stopped by output_fcn"
    assert len(info.training_history) == 3
    assert [s["state"] for s in seen] == ["start", "iteration", "iteration", "iteration", "done"]
    assert isinstance(seen[1]["training_loss"], float) and seen[1]["learn_rate"] == 0.01
    assert seen[-1]["iteration"] == 3


def test_nan_loss_stops_training():
    X, T = regression_data(64)
    _, info = df.trainnet(
        X,
        T,
        regression_net(),
        lambda y, t: jnp.nan * jnp.sum(df.stripdims(y)),
        quiet(max_epochs=50, mini_batch_size=16),
    )
    assert info.stop_reason == "Training loss is NaN"
    assert len(info.training_history) == 1


def test_a_nan_loss_is_found_at_its_iteration_and_training_stops_there():
    """Found within the step (not at the next log row): the history ends at the NaN iteration
    and the network is the one after it, as if training had stopped there."""
    X, T = regression_data(320)
    poison = np.zeros((320, 1), np.float32)
    poison[96:112] = 1  # the seventh of 20 mini-batches (shuffle never): iteration 7
    targets = np.concatenate([T, poison], axis=1)

    def loss(y, t):
        nan = jax.lax.stop_gradient(jnp.where(jnp.any(t[:, 1] > 0), jnp.nan, 0.0))
        return df.losses.mse(y, t[:, :1]) + jnp.where(df.stripdims(y)[0, 0] > 1e9, 0.0, nan)

    options = quiet(max_epochs=1, mini_batch_size=16, shuffle="never", verbose_frequency=50)
    nets, infos = [], []
    for poisoned in (True, False):  # the second: the first 7 iterations, stopped by output_fcn
        data = (X, targets) if poisoned else (X, np.concatenate([T, 0 * poison], axis=1))
        stop = None if poisoned else (lambda info: info["iteration"] >= 7)
        net, info = df.trainnet(*data, regression_net(), loss, options.replace(output_fcn=stop))
        nets.append(net)
        infos.append(info)
    info = infos[0]
    assert info.stop_reason == "Training loss is NaN"
    assert info.output_network_iteration == 7 and len(info.training_history) == 7
    assert np.isnan(info.training_history["loss"][-1])
    assert np.all(np.isfinite(info.training_history["loss"][:-1]))
    # the network after iteration 7 (its update used a finite gradient), bit for bit
    assert_tree_allclose(nets[0].learnables, nets[1].learnables, rtol=0, atol=0)


def test_checkpoints_are_written_at_the_chosen_frequency(tmp_path):
    X, T = regression_data(64)
    opts = quiet(
        max_epochs=2,
        mini_batch_size=16,
        checkpoint_path=tmp_path,
        checkpoint_frequency=3,
        checkpoint_frequency_unit="iteration",
    )
    trained, _ = df.trainnet(X, T, regression_net(), "mse", opts)
    files = [f for f in os.listdir(tmp_path) if f.startswith("net_checkpoint__")]
    files = sorted(files, key=lambda f: int(f.split("__")[1]))
    assert [f.split("__")[1] for f in files] == ["3", "6", "8"]  # 8: the result, at the end
    assert all((tmp_path / f).is_dir() for f in files)  # orbax folders (docs/scaling.md)
    payload = _checkpoint.read(tmp_path / files[-2])
    assert (payload["iteration"], payload["epoch"]) == (6, 2)
    final = _checkpoint.read(tmp_path / files[-1])
    assert final["layout"]["learnables"][0][1] == list(trained.learnables["fc/weights"].shape)


def test_cpu_execution_environment(key):
    X, T = regression_data(32)
    net, _ = df.trainnet(
        X,
        T,
        regression_net(),
        "mse",
        quiet(max_epochs=1, mini_batch_size=16, execution_environment="cpu"),
    )
    assert net.learnables["fc/weights"].devices() == {jax.devices("cpu")[0]}


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda X, T, net, o: df.trainnet(X, net, "mse", o, 3, 4), "takes \\(X, T, net, loss"),
        (lambda X, T, net, o: df.trainnet(X, T, "net", "mse", o), "net must be a df.Network"),
        (lambda X, T, net, o: df.trainnet(X, T, net, "mse", {}), "options must be"),
        (lambda X, T, net, o: df.trainnet(X, T, net, "msee", o), "unknown loss 'msee'.*'mse'"),
        (lambda X, T, net, o: df.trainnet(X, T[:10], net, "mse", o), "different numbers"),
        (lambda X, T, net, o: df.trainnet((X, X), T, net, "mse", o), "has 1 input"),
        (
            lambda X, T, net, o: df.trainnet(X, T, net, "mse", o.replace(mini_batch_size=100)),
            "larger than the 32 training observations",
        ),
        (
            lambda X, T, net, o: df.trainnet(X, T, net, lambda y, t: y, o),
            "must return a scalar",
        ),
        (
            lambda X, T, net, o: df.trainnet(iter([(X, T)]), net, "mse", o),
            "one-shot iterator",
        ),
        (
            lambda X, T, net, o: df.trainnet(
                X, T, net, "mse", o.replace(execution_environment="gpu")
            ),
            "no GPU",
        ),
    ],
)
def test_bad_arguments_are_clear_errors(call, match):
    X, T = regression_data(32)
    with pytest.raises(df.OptionsError, match=match):
        call(X, T, regression_net(), quiet(max_epochs=2, mini_batch_size=16))


def test_recurrent_state_does_not_leak_across_mini_batches():
    """Each mini-batch starts with reset recurrent state (LSTM); BatchNorm keeps its statistics."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 6, 1)).astype(np.float32)
    t = (np.cumsum(x[..., 0], axis=1)[:, -1] > 0).astype(np.int32)
    L = df.layers
    net = df.Network(
        [
            L.SequenceInput(1, name="in"),
            L.LSTM(4, output_mode="last", name="lstm"),
            L.BatchNorm(name="bn"),
            L.FullyConnected(2, name="fc"),
            L.Softmax(name="sm"),
        ]
    )
    options = df.TrainingOptions("adam", max_epochs=2, mini_batch_size=16, verbose=False)
    trained, _ = df.trainnet(x, t, net, "crossentropy", options)
    assert trained.state["lstm/hidden_state"].shape == (1, 4)
    assert not np.allclose(trained.state["bn/trained_mean"], 0.0)  # BatchNorm statistics moved
    accuracy = df.testnet(trained, x[:10], t[:10], "accuracy")  # another batch size works
    assert np.isfinite(float(np.asarray(accuracy).ravel()[0]))


# -- data mistakes are named before anything runs (issue 12 items 3, 8, 9, 10) -------------------


def endless(batches):
    """An endless generator of batches (cycling), like a data stream."""
    while True:
        yield from batches


def labels_data(n=64):
    X, T = classification_data(n)
    return X, T


MISTAKES = [
    (
        "matlab-labels",
        lambda X, T, net, o: df.trainnet(X, T + 1, net, "crossentropy", o),
        r"T are class labels 1\.\.3, but the 3 classes are numbered 0\.\.2: these look like "
        r"MATLAB's 1-based class indices\. Fix: subtract one \(T - 1\)",
    ),
    (
        "negative-label",
        lambda X, T, net, o: df.trainnet(X, np.where(T == 0, -1, T), net, "crossentropy", o),
        r"T hold the class label -1, outside 0\.\.2 for the 3 classes of the predictions \(a "
        r"negative label would silently pick a class from the end\)",
    ),
    (
        "validation-labels",
        lambda X, T, net, o: df.trainnet(
            X, T, net, "crossentropy", o.replace(validation_data=(X, T + 1))
        ),
        r"validation_data T are class labels 1\.\.3",
    ),
    (
        "batch-labels",
        lambda X, T, net, o: df.trainnet([(X[:16], T[:16] + 5)], net, "crossentropy", o),
        r"the targets of a data batch hold the class label 7, outside 0\.\.2",
    ),
    (
        "metric-labels",
        lambda X, T, net, o: df.trainnet(X, T + 1, net, "mse", o.replace(metrics="accuracy")),
        r"MATLAB's 1-based class indices",
    ),
    (
        "empty",
        lambda X, T, net, o: df.trainnet(X[:0], T[:0], net, "crossentropy", o),
        r"the training data has no observations \(X\[0\] has shape \(0, 4\), 0 along its batch",
    ),
    (
        "empty-validation",
        lambda X, T, net, o: df.trainnet(
            X, T, net, "crossentropy", o.replace(validation_data=(X[:0], T[:0]))
        ),
        r"the validation data has no observations",
    ),
    (
        "empty-iterable",
        lambda X, T, net, o: df.trainnet([], net.initialize(key=jax.random.key(0)), "mse", o),
        r"the training data yielded no batch in epoch 1",
    ),
    (
        "empty-batch",
        lambda X, T, net, o: df.trainnet([(X[:0], T[:0])], net, "crossentropy", o),
        r"a batch of the data has no observations",
    ),
    (
        "strings",
        lambda X, T, net, o: df.trainnet(X.astype(str), T, net, "crossentropy", o),
        r"X has dtype <U\d+, which is not numbers \(strings or Python objects\?\)",
    ),
    (
        "ragged",
        lambda X, T, net, o: df.trainnet([[1.0, 2.0], [3.0]], T, net, "crossentropy", o),
        r"X is a list of list, not an array\. Fix: np\.asarray\(X, dtype=np\.float32\) \(a "
        r"ragged list",
    ),
    (
        "complex",
        lambda X, T, net, o: df.trainnet(X * (1 + 1j), T, net, "crossentropy", o),
        r"X is complex \(complex\d+\); the network computes in real numbers and would drop the "
        r"imaginary part",
    ),
    (
        "int-key",
        lambda X, T, net, o: df.trainnet(X, T, net, "crossentropy", o, key=0),
        r"key must be a jax\.random key; got int 0\. Fix: key=jax\.random\.key\(0\)",
    ),
    (
        "options-forgotten",
        lambda X, T, net, o: df.trainnet(X, T, net, "crossentropy"),
        r"trainnet\(X, T, net, loss\) is missing the options \(got ndarray, ndarray, Network, "
        r"str\)\. Fix: trainnet\(X, T, net, loss, df\.TrainingOptions\(\.\.\.\)\)",
    ),
    (
        "options-forgotten-iterable",
        lambda X, T, net, o: df.trainnet([(X, T)], net, "crossentropy"),
        r"trainnet\(data, net, loss\) is missing the options",
    ),
    (
        "per-observation-list",
        lambda X, T, net, o: df.trainnet(list(X), T, net, "crossentropy", o),
        r"X is a list of 64 arrays of shape \(4,\), read as 64 network inputs; the network has "
        r"1 input\(s\) \['in'\]\. If each array is one observation, stack them: X = np\.stack\(X\)",
    ),
    (
        "validation-without-targets",
        lambda X, T, net, o: o.replace(validation_data=X),
        r"validation_data must hold inputs and targets, \(X, T\); got inputs of shape \(64, 4\) "
        r"without targets\. Fix: validation_data=\(X_val, T_val\)",
    ),
    (
        "validation-batches-without-targets",
        lambda X, T, net, o: df.trainnet(
            X, T, net, "crossentropy", o.replace(validation_data=[X[:16], X[16:32], X[32:]])
        ),
        r"each batch of the validation_data iterable must be a tuple \(inputs\.\.\., "
        r"targets\.\.\.\); got one array of shape \(16, 4\): inputs without targets\?",
    ),
    (
        "steps-with-arrays",
        lambda X, T, net, o: df.trainnet(X, T, net, "crossentropy", o.replace(steps_per_epoch=2)),
        r"steps_per_epoch=2 applies to an iterable of batches",
    ),
    (
        "endless-one-shot",
        lambda X, T, net, o: df.trainnet(endless([(X, T)]), net, "crossentropy", o),
        r"is a one-shot iterator.*or steps_per_epoch=N to read it as one stream",
    ),
]


@pytest.mark.parametrize("call, match", [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_data_mistakes_are_named_before_training(call, match):
    X, T = labels_data()
    with pytest.raises(df.OptionsError, match=match):
        call(X, T, classifier_net(), quiet(max_epochs=2, mini_batch_size=16))


def test_integer_one_hot_targets_train_like_float_one_hot(key):
    X, T = classification_data(64)
    net = classifier_net().initialize(key=key)
    opts = quiet(max_epochs=2, mini_batch_size=16, metrics="accuracy")
    one_hot = np.eye(3, dtype=np.float32)[T]
    a, info_a = df.trainnet(X, one_hot, net, "crossentropy", opts)
    b, info_b = df.trainnet(X, one_hot.astype(np.int32), net, "crossentropy", opts)
    assert_tree_allclose(b.learnables, a.learnables, rtol=0, atol=0)
    np.testing.assert_array_equal(
        info_b.training_history["accuracy"], info_a.training_history["accuracy"]
    )


def test_an_endless_validation_generator_needs_validation_steps(monkeypatch):
    from difffn._batching import _sources

    X, T = classification_data(64)
    batches = [(X[i : i + 16], T[i : i + 16]) for i in range(0, 64, 16)]
    monkeypatch.setattr(_sources, "UNSIZED_VALIDATION_BYTES", 1 << 16)  # stands for 1 GiB
    opts = quiet(max_epochs=1, mini_batch_size=16, validation_data=endless(batches))
    with pytest.raises(
        df.OptionsError,
        match=r"validation_data is an iterable without len\(\) that has yielded \d+ batches .* "
        r"and goes on.*Fix: validation_steps=N",
    ):
        df.trainnet(X, T, classifier_net(), "crossentropy", opts)
    # validation_steps bounds it: the same numbers as the finite list of those batches
    bounded = opts.replace(validation_data=endless(batches), validation_steps=4)
    _, a = df.trainnet(X, T, classifier_net(), "crossentropy", bounded)
    _, b = df.trainnet(
        X, T, classifier_net(), "crossentropy", opts.replace(validation_data=batches)
    )
    np.testing.assert_array_equal(a.validation_history["loss"], b.validation_history["loss"])
    # on arrays, it keeps the first mini-batches
    first = opts.replace(validation_data=(X, T), validation_steps=1)
    _, c = df.trainnet(X, T, classifier_net(), "crossentropy", first)
    _, d = df.trainnet(
        X, T, classifier_net(), "crossentropy", opts.replace(validation_data=(X[:16], T[:16]))
    )
    np.testing.assert_array_equal(c.validation_history["loss"], d.validation_history["loss"])


def test_steps_per_epoch_reads_an_endless_generator_as_a_stream():
    X, T = classification_data(64)
    batches = [(X[i : i + 16], T[i : i + 16]) for i in range(0, 64, 16)]
    opts = quiet(max_epochs=3)
    net_list, info_list = df.trainnet(batches, classifier_net(), "crossentropy", opts)
    net_stream, info = df.trainnet(
        endless(batches), classifier_net(), "crossentropy", opts.replace(steps_per_epoch=4)
    )
    assert info.stop_reason == "Max epochs completed" and len(info.training_history) == 12
    np.testing.assert_array_equal(info.training_history["epoch"], np.repeat([1, 2, 3], 4))
    assert_tree_allclose(net_stream.learnables, net_list.learnables, rtol=0, atol=0)
    # a stream read two epochs of three batches: the list restarts when it ends
    _, info = df.trainnet(
        batches, classifier_net(), "crossentropy", opts.replace(steps_per_epoch=3)
    )
    assert len(info.training_history) == 9
    # a one-shot iterator that ends stops training
    _, info = df.trainnet(
        iter(batches * 2), classifier_net(), "crossentropy", opts.replace(steps_per_epoch=3)
    )
    assert info.stop_reason == "Training data exhausted" and len(info.training_history) == 8
