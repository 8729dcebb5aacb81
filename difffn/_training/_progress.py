"""What people see while training runs: the verbose table, a progress bar, the progress plot.

The table has MATLAB's columns: ``Iteration``, ``Epoch``, ``TimeElapsed`` (hh:mm:ss),
``LearnRate``, ``TrainingLoss``, ``ValidationLoss`` (with validation data), then
``Training<Metric>`` / ``Validation<Metric>`` per metric, and ends with the stop reason.

The progress bar shows iterations done of all, epoch x/y, the rate (it/s), the time left, the
loss and metrics of the last table row (the host reads them from the device only then) and the
learn rate. It is drawn by rich, chosen over tqdm because flax already depends on it (no new
dependency), and because one rich console prints the table's lines above a live bar on a
terminal and in a notebook (with ipywidgets, as rich's own Jupyter support needs). Output that
is not a terminal (a file, a pipe, a CI log) gets a plain ``Progress: ...`` line every tenth of
the run instead: no carriage returns, no escape codes. The plot (``plots="training-progress"``)
is ``_live_plot``'s.
"""

from __future__ import annotations

import math
import sys
import time
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
    """Prints the verbose table and the progress bar for one training run.

    The bar is rich's (`_Bar`) on a terminal and in a notebook with ipywidgets; on any
    other stream (a file, a pipe, a CI log, a notebook without ipywidgets) it is a plain line
    every tenth of the run (`progress_line`), with no control characters.
    """

    def __init__(
        self,
        *,
        verbose: bool,
        metric_titles: Sequence[str],
        validation: bool,
        total_iterations: int | None,
        max_epochs: int | None = None,
        stream=None,
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
        self.mode = front_end(self.stream) if verbose else "none"
        self._bar: _Bar | None = None
        self._values: dict[str, float | None] = {}
        self._clock = Rate()
        self._plain_every = max(1, math.ceil((self.total or 500) / 10))
        self._last: tuple[int, int, float | None] | None = None  # the last tick's arguments

    def _write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.print(text)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def _line(self, cells) -> str:
        return "    ".join(c.rjust(w) for c, w in zip(cells, self.widths, strict=True))

    def message(self, text: str) -> None:
        if self.verbose:
            self._write(text)

    def header(self) -> None:
        if not self.verbose:
            return
        self._write(self._line(self.columns))
        self._write(self._line(["_" * len(c) for c in self.columns]))

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
        if training:
            self._values = {"loss": training.get("loss")}
            self._values.update({t: training.get(t) for t in self.metric_titles})
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
        self._write(self._line(cells))

    def unknown_length(self) -> None:
        """Say that an epoch of unknown length is running (an iterable without ``len()``)."""
        self.message(
            "Epoch 1 is running; its length is unknown (the data is an iterable without len()) "
            "until it ends. An endless iterable needs steps_per_epoch=N (and validation data "
            "validation_steps=N), as in Keras."
        )

    def tick(self, iteration: int, epoch: int, learn_rate: float | None = None) -> None:
        """After each iteration: redraw the bar (a terminal, a notebook), or a plain line every
        tenth of the run (any other stream)."""
        if self.total is None and self.max_epochs:  # learn the epoch's length when one ends
            seen = self._epoch_seen
            if seen is not None and epoch > seen[0] == 1:
                self.total = self.max_epochs * seen[1]
                if self._bar is not None:
                    self._bar.set_total(self.total)
            self._epoch_seen = (epoch, iteration)
        if self.mode == "none":
            return
        self._last = (iteration, epoch, learn_rate)
        rate, left = self._clock.update(iteration, self.total)
        status = progress_status(epoch, self.max_epochs, rate, left, self._values, learn_rate)
        if self.total is None:
            status = f"(an epoch of unknown length is running) {status}"
        if self.mode == "plain":
            if iteration % self._plain_every == 0 or iteration == self.total:
                done = f"{iteration}/{self.total}" if self.total else str(iteration)
                self.stream.write(f"Progress: iteration {done}, {status}\n")
                self.stream.flush()
            return
        if self._bar is None:
            self._bar = _Bar(self.stream, self.total, notebook=self.mode == "notebook")
        self._bar.update(iteration, status)

    def finish(self, stop_reason: str) -> None:
        if not self.verbose:
            return
        if self._bar is not None and self._last is not None:
            iteration, epoch, learn_rate = self._last
            rate, left = self._clock.update(iteration, self.total)
            status = progress_status(epoch, self.max_epochs, rate, left, self._values, learn_rate)
            self._bar.update(iteration, status, force=True)
            self._bar.close()
            self._bar = None
        self._write(f"Training stopped: {stop_reason}")


def front_end(stream) -> str:
    """Where the progress goes: ``"terminal"`` and ``"notebook"`` get rich's live bar,
    ``"plain"`` gets lines of text."""
    if stream is sys.stdout or stream is getattr(sys, "__stdout__", None):
        from rich.console import Console

        if Console(file=stream).is_jupyter:
            try:
                # rich draws live output in notebooks with it
                import ipywidgets  # noqa: F401  # pyright: ignore[reportMissingImports]
            except ImportError:
                return "plain"
            return "notebook"
    isatty = getattr(stream, "isatty", None)
    return "terminal" if isatty is not None and isatty() else "plain"


class Rate:
    """Iterations per second and time left, from the first tick this process saw (a resumed
    run's rate is this process's, not the checkpointed one's)."""

    def __init__(self):
        self.first: tuple[int, float] | None = None

    def update(self, iteration: int, total: int | None) -> tuple[float | None, float | None]:
        now = time.perf_counter()
        if self.first is None:
            self.first = (iteration, now)
            return None, None
        done, seconds = iteration - self.first[0], now - self.first[1]
        if done <= 0 or seconds <= 0:
            return None, None
        rate = done / seconds
        left = (total - iteration) / rate if total else None
        return rate, left


def progress_status(epoch, max_epochs, rate, left, values, learn_rate) -> str:
    """``epoch 2/5, 31.2 it/s, 00:00:04 left, loss 0.123, Accuracy 91.2, learn rate 0.01``."""
    parts = [f"epoch {epoch}/{max_epochs}" if max_epochs else f"epoch {epoch}"]
    if rate is None:
        parts.append("-- it/s")
    else:
        parts.append(f"{rate:,.0f} it/s" if rate >= 100 else f"{rate:.3g} it/s")
    if left is not None:
        parts.append(f"{format_time(left)} left")
    for name, value in values.items():
        if value is not None:
            parts.append(f"{name} {_number(value, 4)}")
    if learn_rate is not None:
        parts.append(f"learn rate {_number(learn_rate, 4)}")
    return ", ".join(parts)


class _Bar:
    """rich's live progress bar; table lines are printed above it."""

    def __init__(self, stream, total: int | None, *, notebook: bool):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = Console(file=stream, force_terminal=not notebook, force_jupyter=notebook)
        self.progress = Progress(
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}", markup=False),
            console=console,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.task = self.progress.add_task("training", total=total, status="")
        self.drawn = -math.inf
        self.progress.start()

    def update(self, iteration: int, status: str, force: bool = False) -> None:
        self.progress.update(self.task, completed=iteration, status=status)
        now = time.perf_counter()
        if force or now - self.drawn >= 0.1:  # redraw at most ten times a second
            self.progress.refresh()
            self.drawn = now

    def set_total(self, total: int) -> None:
        self.progress.update(self.task, total=total)

    def print(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        self.progress.stop()


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
