"""Watching a run: the live training-progress plot, its stop file, and TensorBoard events.

The events are read back with TensorBoard's own reader (``EventAccumulator``); the plot's
content is read from its matplotlib artists and its files from disk.
"""

from __future__ import annotations

import base64
import io
import os
import re
import sys

import numpy as np
import pytest
from training_layers import classification_data, classifier_net

import difffn as df
from difffn._training import _live_plot


def options(**changes):
    base = dict(
        max_epochs=3,
        mini_batch_size=16,
        metrics="accuracy",
        verbose=False,
        validation_data=None,
    )
    return df.TrainingOptions(**{**base, **changes})


@pytest.fixture
def figures(monkeypatch):
    """Every figure the live plot draws, in order (redraws are not throttled)."""
    drawn = []
    draw = _live_plot.draw

    def record(*args, **kwargs):
        figure = draw(*args, **kwargs)
        drawn.append(figure)
        return figure

    monkeypatch.setattr(_live_plot, "draw", record)
    monkeypatch.setattr(_live_plot, "MIN_SECONDS", 0.0)
    monkeypatch.setattr(_live_plot, "WAIT_PER_DRAW", 0.0)
    return drawn


def line_by_label(ax, label):
    found = [line for line in ax.get_lines() if line.get_label() == label]
    assert len(found) == 1, [line.get_label() for line in ax.get_lines()]
    return found[0]


# -- TensorBoard --------------------------------------------------------------------------------


def test_log_dir_writes_every_logged_scalar_that_tensorboard_reads_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    X, T = classification_data(64)
    opts = options(validation_data=(X, T), validation_frequency=3, log_dir=tmp_path / "tb")
    _, info = df.trainnet(X, T, classifier_net(), "crossentropy", opts)
    train = EventAccumulator(str(tmp_path / "tb" / "train")).Reload()
    validation = EventAccumulator(str(tmp_path / "tb" / "validation")).Reload()
    assert set(train.Tags()["scalars"]) == {"loss", "accuracy", "learn_rate"}
    assert set(validation.Tags()["scalars"]) == {"loss", "accuracy"}
    history = info.training_history
    for tag, column in [("loss", "loss"), ("accuracy", "accuracy"), ("learn_rate", "learn_rate")]:
        events = train.Scalars(tag)
        assert [e.step for e in events] == list(history["iteration"])  # every iteration
        np.testing.assert_allclose([e.value for e in events], history[column], rtol=1e-6)
    events = validation.Scalars("loss")
    assert [e.step for e in events] == [0, 3, 6, 9, 12]
    np.testing.assert_allclose(
        [e.value for e in events], info.validation_history["loss"], rtol=1e-6
    )


def test_a_resumed_run_leaves_each_iteration_once_in_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    X, T = classification_data(64)
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    logs = tmp_path / "tb"

    def stop_at_6(info):
        return info["iteration"] == 6

    first = options(
        max_epochs=3,
        log_dir=logs,
        checkpoint_path=checkpoints,
        output_fcn=stop_at_6,
        checkpoint_frequency=1,
        checkpoint_frequency_unit="iteration",
    )
    _, stopped = df.trainnet(X, T, classifier_net(), "crossentropy", first)
    assert stopped.stop_reason == "Stopped by output_fcn"
    second = first.replace(output_fcn=None)
    _, info = df.trainnet(X, T, classifier_net(), "crossentropy", second, resume_from=checkpoints)
    events = EventAccumulator(str(logs / "train")).Reload().Scalars("loss")
    assert [e.step for e in events] == list(range(1, 13))
    np.testing.assert_allclose([e.value for e in events], info.training_history["loss"], rtol=1e-6)


def test_log_dir_without_tensorboardx_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(
        df.MissingDependencyError,
        match=r"TrainingOptions\(log_dir=\.\.\.\) writes TensorBoard event files with "
        r"tensorboardX, which is not installed\. Fix: pip install 'difffn\[tensorboard\]'",
    ):
        df.TrainingOptions(log_dir=tmp_path)


def test_log_dir_that_is_a_file_is_an_options_error(tmp_path):
    path = tmp_path / "events"
    path.write_text("")
    with pytest.raises(df.OptionsError, match=r"log_dir must be a folder; .*events' is a file"):
        df.TrainingOptions(log_dir=path)


# -- the live plot ------------------------------------------------------------------------------


def test_the_plot_is_redrawn_while_training_runs_with_the_curves_and_info(tmp_path, figures):
    X, T = classification_data(64)
    path = tmp_path / "progress.png"
    seen = []

    def look(info):  # the file on disk while training runs
        if info["state"] == "iteration" and info["iteration"] in (4, 8):
            seen.append((info["iteration"], path.read_bytes()[:8], len(figures)))
        return False

    opts = options(
        validation_data=(X, T),
        validation_frequency=4,
        verbose_frequency=4,
        output_fcn=look,
        plots="training-progress",
        plots_path=path,
    )
    _, info = df.trainnet(X, T, classifier_net(), "crossentropy", opts)
    assert [s[0] for s in seen] == [4, 8] and all(s[1] == b"\x89PNG\r\n\x1a\n" for s in seen)
    assert seen[0][2] < seen[1][2] < len(figures)  # redrawn between, and at the end

    def curves(figure):
        loss_ax, accuracy_ax = figure.axes[:2]
        return loss_ax, accuracy_ax

    # while running: the curve holds the iterations done so far
    middle = figures[seen[0][2] - 1]
    loss_ax, _ = curves(middle)
    np.testing.assert_array_equal(line_by_label(loss_ax, "training").get_xdata(), [1, 2, 3, 4])
    assert "Status: Running" in middle.axes[-1].texts[0].get_text()

    final = figures[-1]
    loss_ax, accuracy_ax = curves(final)
    history, validation = info.training_history, info.validation_history
    np.testing.assert_array_equal(line_by_label(loss_ax, "training").get_xdata(), np.arange(1, 13))
    np.testing.assert_allclose(line_by_label(loss_ax, "training").get_ydata(), history["loss"])
    np.testing.assert_allclose(
        line_by_label(accuracy_ax, "training").get_ydata(), history["accuracy"]
    )
    np.testing.assert_array_equal(line_by_label(loss_ax, "validation").get_xdata(), [0, 4, 8, 12])
    np.testing.assert_allclose(
        line_by_label(accuracy_ax, "validation").get_ydata(), validation["accuracy"]
    )
    smoothed = line_by_label(loss_ax, "smoothed").get_ydata()
    assert smoothed[0] == pytest.approx(history["loss"][0])
    assert smoothed[1] == pytest.approx(0.6 * history["loss"][0] + 0.4 * history["loss"][1])
    # epochs of 4 iterations: the second one is shaded (alternate epochs)
    spans = [(p.get_x(), p.get_x() + p.get_width()) for p in loss_ax.patches]
    assert spans == [(4.0, 8.0)]
    text = final.axes[-1].texts[0].get_text()
    for expected in [
        "Status: Max epochs completed",
        "Epoch: 3 of 3",
        "Iteration: 12 of 12",
        "Iterations per epoch: 4",
        "Learn rate: 0.01",
        "Hardware: cpu (",
    ]:
        assert expected in text, text
    assert re.search(r"Elapsed: \d\d:\d\d:\d\d", text)
    from matplotlib.image import imread

    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[1] > pixels.shape[0] > 100


def test_creating_the_stop_file_stops_training_by_user(tmp_path, capsys):
    X, T = classification_data(64)
    path = tmp_path / "progress.png"
    stop = tmp_path / "progress.stop"
    stop.write_text("")  # a stale flag from an earlier run is removed at the start

    def press_stop(info):
        if info["iteration"] == 5:
            stop.write_text("")
        return False

    opts = options(output_fcn=press_stop, plots="training-progress", plots_path=path)
    _, info = df.trainnet(X, T, classifier_net(), "crossentropy", opts)
    assert info.stop_reason == "Stopped by user"
    assert len(info.training_history) == 5 and not stop.exists()
    printed = capsys.readouterr().out
    assert f"to stop training, create the file {stop}" in printed


def test_an_html_plot_reloads_itself_while_training_runs(tmp_path):
    X, T = classification_data(64)
    path = tmp_path / "progress.html"
    pages = []

    def look(info):
        if info["iteration"] == 4:
            pages.append(path.read_text())
        return False

    opts = options(verbose_frequency=2, output_fcn=look, plots="training-progress", plots_path=path)
    df.trainnet(X, T, classifier_net(), "crossentropy", opts)
    final = path.read_text()
    assert 'http-equiv="refresh"' in pages[0] and 'http-equiv="refresh"' not in final
    data = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", final).group(1)
    assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == ["progress.html"]  # no temporary file left


def test_the_plot_without_matplotlib_names_the_extra(monkeypatch, tmp_path):
    X, T = classification_data(32)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    opts = options(plots="training-progress", plots_path=tmp_path / "p.png")
    with pytest.raises(
        df.MissingDependencyError,
        match=r"TrainingOptions\(plots='training-progress'\) draws with matplotlib, which is not "
        r"installed\. Fix: pip install 'difffn\[plot\]'",
    ):
        df.trainnet(X, T, classifier_net(), "crossentropy", opts)


# -- where the progress bar goes ------------------------------------------------------------------


def test_a_notebook_without_ipywidgets_gets_plain_lines(monkeypatch):
    """rich draws live output in a notebook only through ipywidgets; without it, plain lines."""
    import rich.console

    from difffn._training import _progress

    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: True)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    assert _progress.front_end(sys.stdout) == "plain"
    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: False)

    class Terminal:
        def isatty(self):
            return True

    assert _progress.front_end(Terminal()) == "terminal"
    assert _progress.front_end(io.StringIO()) == "plain"  # a file, a pipe: not a terminal
