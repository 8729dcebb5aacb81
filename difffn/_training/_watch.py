"""What watches a run besides the verbose table: the live plot and the TensorBoard events.

The trainer calls `update` where the host already waits for the device (the
iterations that log a table row or validate, and the end), with the training rows that are host
numbers by then; `stop_requested` after every compiled call, an iteration or several (a
file's existence: the live plot's stop flag); `close` at the end. Only the primary process watches.
"""

from __future__ import annotations

import os
import time

import jax

from ._live_plot import STOPPED_BY_USER, LivePlot
from ._tensorboard import TensorBoardLog

__all__ = ["STOPPED_BY_USER", "Watch", "hardware"]


def hardware() -> str:
    """``"cpu (1 device)"``, ``"gpu: NVIDIA H100 (8 devices)"``: what the run computes on."""
    devices = jax.devices()
    kind = devices[0].platform
    name = getattr(devices[0], "device_kind", "")
    label = f"{kind}: {name}" if name and kind != "cpu" else kind
    return f"{label} ({len(devices)} device{'s' if len(devices) != 1 else ''})"


class Watch:
    """The live plot and the TensorBoard log of one run (either may be absent).

    Args:
      options: the run's ``TrainingOptions``.
      metrics: the run's metrics.
      iterations_per_epoch: None when unknown (an iterable without a length).
      resumed_at: the iteration a resumed run continues from (0: a new run).
      primary: whether this process writes (process 0).
    """

    def __init__(self, options, metrics, *, iterations_per_epoch, resumed_at, primary):
        self.metric_names = [m.name for m in metrics]
        self.plot = None
        self.log = None
        self.info = {
            "max_epochs": options.max_epochs,
            "iterations_per_epoch": iterations_per_epoch,
            "max_iterations": (
                options.max_epochs * iterations_per_epoch if iterations_per_epoch else None
            ),
            "hardware": hardware(),
        }
        self.sent = (0, 0)  # training and validation rows the TensorBoard log has
        if not primary:
            return
        if options.plots == "training-progress":
            path = options.plots_path or os.path.join(os.getcwd(), "training_progress.png")
            self.plot = LivePlot(path, self.metric_names, [m.title for m in metrics])
        if options.log_dir is not None:
            self.log = TensorBoardLog(options.log_dir, self.metric_names, resumed=resumed_at > 0)

    @property
    def active(self) -> bool:
        return self.plot is not None or self.log is not None

    def stop_requested(self) -> bool:
        return self.plot is not None and self.plot.stop_requested()

    def update(self, state, flushed: int, *, elapsed: float, final: bool = False) -> None:
        """Send the rows up to ``flushed`` (host numbers) to the log, and redraw the plot."""
        if not self.active:
            return
        training = state.training_rows[: min(flushed, len(state.training_rows))]
        validation = state.validation_rows
        if self.log is not None:
            t, v = self.sent
            t, v = min(t, len(training)), min(v, len(validation))  # rows a NaN loss cut off
            self.log.write(training[t:], validation[v:])
            self.sent = (len(training), len(validation))
            if final:
                self.log.flush()
        if self.plot is not None:
            info = dict(
                self.info,
                elapsed=elapsed,
                epoch=state.epoch,
                iteration=state.iteration,
                learn_rate=training[-1]["learn_rate"] if training else None,
                stop_reason=state.stop_reason if final else None,
            )
            self.plot.update(training, validation, info, now=time.perf_counter(), final=final)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
