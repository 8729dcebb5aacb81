"""The training-progress plot (``plots="training-progress"``), drawn while training runs.

MATLAB's training-progress window, as a picture a viewer can refresh: one panel for the loss and
one per metric against the iteration (training, its smoothed curve, validation as dashed
markers), alternate epochs shaded, and an info panel (elapsed time, epoch x of y, iteration x of
y, iterations per epoch, learn rate, hardware, and the status: running, or why training
stopped). The loss axis turns logarithmic when the positive losses span more than two decades.

The picture is redrawn every ``verbose_frequency`` iterations and at the end, but not sooner
than a second, or nine times as long as the last redraw took, after the last one (drawing
takes at most about a tenth of the run). It is written atomically (a new temporary file renamed
over the old one), so a viewer never reads half a file: a ``.png`` path gets the PNG; an
``.html`` path gets a page holding the PNG that reloads itself every few seconds while training
runs (open it in a browser). In a
Jupyter notebook (IPython's kernel), the same picture is shown in the cell's output and replaced
at every redraw.

Stopping: while training runs, creating the file `stop_file` (the plot's path
with the suffix ``.stop``, e.g. ``touch training_progress.stop``) stops training after the
current iteration, with the stop reason ``"Stopped by user"`` (MATLAB's stop button); the file
is removed when training starts and when it stops. A file, not a notebook button: while a cell
runs ``trainnet``, the kernel handles no widget events, so a button's click would arrive only
after training ended.
"""

from __future__ import annotations

import base64
import io
import math
import os
import secrets
import sys
import time
from collections.abc import Sequence

from .._core import MissingDependencyError

STOPPED_BY_USER = "Stopped by user"
MIN_SECONDS = 1.0  # the least time between two redraws while training runs
# redraws wait at least this many times as long as the last one took: drawing costs about a
# tenth of the training time at most (a redraw of a long run takes about half a second on CPU)
WAIT_PER_DRAW = 9.0


def smooth(values: Sequence[float], weight: float = 0.6) -> list[float]:
    """Exponential smoothing (a NaN restarts it)."""
    out, last = [], None
    for v in values:
        last = v if last is None or not math.isfinite(last) else weight * last + (1 - weight) * v
        out.append(last)
    return out


def format_time(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def info_lines(info: dict) -> list[str]:
    """The info panel's lines: ``(label, value)`` text of the run's progress."""
    of = lambda value, total: f"{value} of {total}" if total else f"{value}"  # noqa: E731
    lr = info.get("learn_rate")
    return [
        f"Status: {info.get('stop_reason') or 'Running'}",
        f"Elapsed: {format_time(info.get('elapsed', 0.0))}",
        f"Epoch: {of(info.get('epoch', 0), info.get('max_epochs'))}",
        f"Iteration: {of(info.get('iteration', 0), info.get('max_iterations'))}",
        f"Iterations per epoch: {info.get('iterations_per_epoch') or '?'}",
        f"Learn rate: {'' if lr is None else f'{lr:.4g}'}",
        f"Hardware: {info.get('hardware', '')}",
    ]


def draw(training, validation, metric_names, metric_titles, info: dict):
    """The figure: ``training``/``validation`` are lists of history rows (host numbers).

    Returns a matplotlib ``Figure`` (Agg canvas: no display needed).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [("loss", "Loss"), *zip(metric_names, metric_titles, strict=True)]
    figure = Figure(figsize=(11, 1.2 + 2.4 * len(panels)), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(len(panels), 2, width_ratios=(3.2, 1))
    axes = [figure.add_subplot(grid[k, 0]) for k in range(len(panels))]
    for ax in axes[1:]:
        ax.sharex(axes[0])
    iterations = [int(r["iteration"]) for r in training]
    per_epoch = info.get("iterations_per_epoch")
    last = max(iterations[-1] if iterations else 0, info.get("max_iterations") or 0, 1)
    for k, (name, title) in enumerate(panels):
        ax = axes[k]
        if per_epoch:
            for start in range(per_epoch, last, 2 * per_epoch):  # shade every other epoch
                ax.axvspan(start, min(start + per_epoch, last), color="0.92", lw=0, zorder=0)
        values = [float(r[name]) for r in training]
        if values:
            ax.plot(iterations, values, color="tab:blue", alpha=0.3, lw=1, label="training")
            ax.plot(iterations, smooth(values), color="tab:blue", lw=1.6, label="smoothed")
        if validation:
            ax.plot(
                [int(r["iteration"]) for r in validation],
                [float(r[name]) for r in validation],
                "--o",
                color="black",
                ms=3,
                lw=1,
                label="validation",
            )
        if name == "loss":
            positive = [v for v in values if v > 0 and math.isfinite(v)]
            if positive and max(positive) > 100 * min(positive):
                ax.set_yscale("log")
        ax.set_ylabel(title)
        ax.set_xlim(0, last)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("Iteration")
    axes[0].set_title("Training progress")
    panel = figure.add_subplot(grid[:, 1])
    panel.axis("off")
    panel.set_title("Training info", loc="left")
    panel.text(
        0.0,
        1.0,
        "\n".join(info_lines(info)),
        va="top",
        ha="left",
        family="monospace",
        fontsize="small",
        transform=panel.transAxes,
        linespacing=1.8,
    )
    return figure


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def _html(png: bytes, running: bool) -> bytes:
    refresh = '<meta http-equiv="refresh" content="3">' if running else ""
    data = base64.b64encode(png).decode()
    return (
        f"<!doctype html><html><head><meta charset='utf-8'>{refresh}"
        "<title>Training progress</title></head><body>"
        f"<img alt='training progress' src='data:image/png;base64,{data}'></body></html>"
    ).encode()


def write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to a new temporary file in ``path``'s folder, then rename it over ``path``
    (the file's mode follows the umask, as for any file)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    try:
        with open(temporary, "xb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def _notebook_display():
    """IPython's ``display`` and ``Image`` inside a notebook kernel, else None."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return None
    try:
        from IPython import get_ipython  # pyright: ignore[reportMissingImports]
        from IPython.display import Image, display  # pyright: ignore[reportMissingImports]
    except ImportError:
        return None
    ip = get_ipython()
    if ip is None or "IPKernelApp" not in getattr(ip, "config", {}):
        return None
    return display, Image


class LivePlot:
    """The plot of one run, redrawn while it trains.

    Args:
      path: the ``.png`` (or ``.html``) file.
      metric_names, metric_titles: the metrics' history columns and panel titles.
      min_seconds: redraws closer together than this are skipped (the end always draws).
    """

    def __init__(
        self,
        path: str,
        metric_names: Sequence[str],
        metric_titles: Sequence[str],
        *,
        min_seconds: float | None = None,
    ):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise MissingDependencyError(
                "TrainingOptions(plots='training-progress') draws with matplotlib, which is not "
                "installed. Fix: pip install 'difffn[plot]' (or pip install matplotlib), or "
                "plots='none'."
            ) from None
        self.path = os.path.abspath(path)
        self.html = self.path.lower().endswith((".html", ".htm"))
        self.stop_file = os.path.splitext(self.path)[0] + ".stop"
        self.metric_names = tuple(metric_names)
        self.metric_titles = tuple(metric_titles)
        self.min_seconds = MIN_SECONDS if min_seconds is None else min_seconds
        self.drawn_at = -math.inf
        self.draw_seconds = 0.0  # how long the last redraw took
        self.figure = None  # the newest figure (tests read its artists)
        self._notebook = _notebook_display()
        self._handle = None
        self._remove_stop_file()

    def _remove_stop_file(self) -> None:
        if os.path.exists(self.stop_file):
            os.remove(self.stop_file)

    def stop_requested(self) -> bool:
        """Whether the user created the stop file."""
        return os.path.exists(self.stop_file)

    def update(self, training, validation, info: dict, *, now: float, final: bool = False):
        """Redraw (unless the last redraw was under ``min_seconds`` ago and this is not the
        end); return whether it drew."""
        wait = max(self.min_seconds, WAIT_PER_DRAW * self.draw_seconds)
        if not final and now - self.drawn_at < wait:
            return False
        self.figure = draw(training, validation, self.metric_names, self.metric_titles, info)
        png = _png(self.figure)
        running = not final
        write_atomically(self.path, _html(png, running) if self.html else png)
        if self._notebook is not None:
            display, Image = self._notebook
            if self._handle is None:
                self._handle = display(Image(data=png), display_id=True)
            else:
                self._handle.update(Image(data=png))
        if final:
            self._remove_stop_file()
        self.drawn_at = time.perf_counter()
        self.draw_seconds = self.drawn_at - now
        return True
