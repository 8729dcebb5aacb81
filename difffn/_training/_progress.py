"""What people see while training runs: the verbose table, a progress bar, the progress plot.

The table has MATLAB's columns: ``Iteration``, ``Epoch``, ``TimeElapsed`` (hh:mm:ss),
``LearnRate``, ``TrainingLoss``, ``ValidationLoss`` (with validation data), then
``Training<Metric>`` / ``Validation<Metric>`` per metric, and ends with the stop reason. A
progress bar is drawn on the same line, only when the stream is a terminal. The plot
(``plots="training-progress"``) is a matplotlib PNG (Agg canvas, no display needed): the loss
against iteration (training, smoothed training, validation), and one panel per metric.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence


def format_time(seconds: float) -> str:
    """``hh:mm:ss``."""
    seconds = int(seconds)
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _number(value, digits: int = 5) -> str:
    if value is None:
        return ""
    if math.isnan(value):
        return "NaN"
    return f"{value:.{digits}g}"


class Reporter:
    """Prints the verbose table and the progress bar for one training run."""

    def __init__(
        self,
        *,
        verbose: bool,
        metric_titles: Sequence[str],
        validation: bool,
        total_iterations: int | None,
        stream=None,
        max_epochs: int | None = None,
    ):
        self.verbose = verbose
        self.stream = stream if stream is not None else sys.stdout
        self.validation = validation
        self.total = total_iterations
        self.max_epochs = max_epochs  # with an unknown epoch length: the total once one ends
        self._epoch_seen: tuple[int, int] | None = None  # (epoch, last iteration) while unknown
        self.metric_titles = tuple(metric_titles)
        columns = ["Iteration", "Epoch", "TimeElapsed", "LearnRate", "TrainingLoss"]
        if validation:
            columns.append("ValidationLoss")
        for title in metric_titles:
            columns.append(f"Training{title}")
            if validation:
                columns.append(f"Validation{title}")
        self.columns = columns
        self.widths = [max(len(c), 9) for c in columns]
        isatty = getattr(self.stream, "isatty", None)
        self.bar = bool(verbose and isatty is not None and isatty())
        self._bar_drawn = False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _line(self, cells) -> str:
        return "    ".join(c.rjust(w) for c, w in zip(cells, self.widths, strict=True))

    def message(self, text: str) -> None:
        if self.verbose:
            self._clear_bar()
            self._write(text + "\n")

    def header(self) -> None:
        if not self.verbose:
            return
        self._clear_bar()
        self._write(self._line(self.columns) + "\n")
        self._write(self._line(["_" * len(c) for c in self.columns]) + "\n")

    def row(
        self,
        *,
        iteration: int,
        epoch: int,
        elapsed: float,
        learn_rate: float,
        training: dict | None,
        validation: dict | None,
    ) -> None:
        """One table row; ``training``/``validation`` map "loss" and metric titles to values."""
        if not self.verbose:
            return
        training = training or {}
        validation = validation or {}
        cells = [
            str(iteration),
            str(epoch),
            format_time(elapsed),
            _number(learn_rate, 4),
            _number(training.get("loss")),
        ]
        if self.validation:
            cells.append(_number(validation.get("loss")))
        for title in self.metric_titles:
            cells.append(_number(training.get(title)))
            if self.validation:
                cells.append(_number(validation.get(title)))
        self._clear_bar()
        self._write(self._line(cells) + "\n")

    def unknown_length(self) -> None:
        """Say that an epoch of unknown length is running (an iterable without ``len()``)."""
        self.message(
            "Epoch 1 is running; its length is unknown (the data is an iterable without len()) "
            "until it ends. An endless iterable needs steps_per_epoch=N (and validation data "
            "validation_steps=N), as in Keras."
        )

    def tick(self, iteration: int, epoch: int) -> None:
        """Redraw the progress bar (terminals only)."""
        if self.total is None and self.max_epochs:  # learn the epoch's length when one ends
            seen = self._epoch_seen
            if seen is not None and epoch > seen[0] == 1:
                self.total = self.max_epochs * seen[1]
            self._epoch_seen = (epoch, iteration)
        if not self.bar:
            return
        if self.total:
            done = min(iteration / self.total, 1.0)
            filled = int(30 * done)
            text = f"[{'=' * filled}{' ' * (30 - filled)}] {iteration}/{self.total} iterations"
        else:
            text = f"iteration {iteration} (an epoch of unknown length is running)"
        self._write(f"\r{text}, epoch {epoch}")
        self._bar_drawn = True

    def _clear_bar(self) -> None:
        if self._bar_drawn:
            self._write("\r\033[2K")
            self._bar_drawn = False

    def finish(self, stop_reason: str) -> None:
        if not self.verbose:
            return
        self._clear_bar()
        self._write(f"Training stopped: {stop_reason}\n")


def _smooth(values: Sequence[float], weight: float = 0.6) -> list[float]:
    out, last = [], None
    for v in values:
        last = v if last is None or not math.isfinite(last) else weight * last + (1 - weight) * v
        out.append(last)
    return out


def plot_progress(path: str, training, validation, metric_names, metric_titles, stop_reason):
    """Write the training-progress PNG to ``path`` and return its absolute path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [("loss", "Loss")] + list(zip(metric_names, metric_titles, strict=True))
    figure = Figure(figsize=(8, 2.6 * len(panels)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    iterations = list(training["iteration"]) if len(training) else []
    for ax, (name, title) in zip(axes, panels, strict=True):
        if iterations:
            values = [float(v) for v in training[name]]
            ax.plot(iterations, values, color="tab:blue", alpha=0.3, lw=1, label="training")
            ax.plot(iterations, _smooth(values), color="tab:blue", lw=1.5, label="smoothed")
        if validation is not None and len(validation):
            ax.plot(
                list(validation["iteration"]),
                [float(v) for v in validation[name]],
                "--o",
                color="black",
                ms=3,
                lw=1,
                label="validation",
            )
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("Iteration")
    axes[0].set_title(f"Training progress ({stop_reason})")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    figure.savefig(path, dpi=100)
    return os.path.abspath(path)


def by_title(row: dict, metrics) -> dict:
    """A history row keyed by the table's titles (loss, then each metric's title)."""
    out = {"loss": row.get("loss")}
    for m in metrics:
        out[m.title] = row.get(m.name)
    return out


def output_fcn_info(stage: str, state, row, metrics, elapsed: float) -> dict:
    """What ``output_fcn`` receives: the stage, the iteration's training row and the
    validation of this iteration (None where there is none)."""
    info = {
        "state": stage,
        "iteration": state.iteration,
        "epoch": state.epoch,
        "time_elapsed": elapsed,
        "learn_rate": row["learn_rate"] if row else None,
        "training_loss": row["loss"] if row else None,
        "validation_loss": None,
    }
    for m in metrics:
        info[f"training_{m.name}"] = row.get(m.name) if row else None
        info[f"validation_{m.name}"] = None
    last = state.validation_rows[-1] if state.validation_rows else None
    if last is not None and last["iteration"] == state.iteration:
        info["validation_loss"] = last["loss"]
        for m in metrics:
            info[f"validation_{m.name}"] = last[m.name]
    return info
