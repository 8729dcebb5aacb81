"""``TrainingOptions(log_dir=...)``: every logged scalar as TensorBoard event files.

The events are written by tensorboardX's ``SummaryWriter``: a small, maintained package (numpy,
protobuf, packaging) that writes the event-file format TensorBoard reads, without TensorFlow or
PyTorch. clu's metric writers were the other candidate; they write through TensorFlow's summary
ops, so they would bring TensorFlow into a JAX library for the sake of a log. tensorboardX is the
``tensorboard`` extra (``pip install difffn[tensorboard]``); without it, ``log_dir`` is a
``df.MissingDependencyError`` when the options are made.

Layout (Keras's, so TensorBoard draws training and validation in one chart): ``log_dir/train``
holds ``loss``, one scalar per metric (its name) and ``learn_rate`` at every iteration;
``log_dir/validation`` holds ``loss`` and the metrics at every validation. The step is the
iteration. A resumed run writes its whole history again (the rows its checkpoint restored, then
its own) after a restart marker at step 0 (tensorboardX's ``purge_step``), which tells
TensorBoard's reader to drop the earlier events of that folder: each iteration is drawn once,
whether the first run wrote to the same folder, to another one, or nowhere.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .._core import MissingDependencyError

INSTALL = "pip install 'difffn[tensorboard]' (or pip install tensorboardX)"


def summary_writer_class(who: str = "TrainingOptions(log_dir=...)"):
    """tensorboardX's ``SummaryWriter``, or a named error saying how to install it."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise MissingDependencyError(
            f"{who} writes TensorBoard event files with tensorboardX, which is not installed. "
            f"Fix: {INSTALL}, or leave log_dir out."
        ) from None
    return SummaryWriter


class TensorBoardLog:
    """The event files of one run.

    Args:
      log_dir: the folder (created if missing).
      metric_names: the metrics' names, as in the history's columns.
      resumed: whether the run resumed from a checkpoint (its restored rows are written again).
    """

    def __init__(self, log_dir: str, metric_names: Sequence[str], resumed: bool = False):
        writer = summary_writer_class()
        self.names = ("loss", *metric_names)
        purge = 0 if resumed else None
        os.makedirs(log_dir, exist_ok=True)
        self.train = writer(logdir=os.path.join(log_dir, "train"), purge_step=purge)
        self.validation = writer(logdir=os.path.join(log_dir, "validation"), purge_step=purge)

    def write(self, training_rows: Sequence[dict], validation_rows: Sequence[dict]) -> None:
        """Write history rows (host numbers) at their iterations."""
        for row in training_rows:
            step = int(row["iteration"])
            for name in self.names:
                self.train.add_scalar(name, float(row[name]), step)
            self.train.add_scalar("learn_rate", float(row["learn_rate"]), step)
        for row in validation_rows:
            step = int(row["iteration"])
            for name in self.names:
                self.validation.add_scalar(name, float(row[name]), step)

    def flush(self) -> None:
        self.train.flush()
        self.validation.flush()

    def close(self) -> None:
        self.train.close()
        self.validation.close()
