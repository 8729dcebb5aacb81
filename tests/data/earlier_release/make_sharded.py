"""Writes ``sharded/``: the orbax ``<step>`` folders of a multi-process run of the release before
one checkpoint format (commit 6c41c82, whose ``ShardedWriter`` wrote them).

Run once with that commit's difffn on the path (a one-process ``jax.distributed`` job):

    git archive 6c41c82 difffn | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old python tests/data/earlier_release/make_sharded.py

``tests/test_checkpoint.py`` resumes them with the current code. Do not rerun it on a later
commit: the point of the files is that the earlier release wrote them.
"""

import socket
import sys
from pathlib import Path

import jax

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "before_move"))

import make  # noqa: E402  (the network and data of tests/data/before_move)

import difffn as df  # noqa: E402


def options(folder=None):
    return df.TrainingOptions(
        "sgdm",
        max_epochs=2,
        mini_batch_size=8,
        shuffle="every-epoch",
        verbose=False,
        checkpoint_path=folder,
        checkpoint_frequency=1,
        checkpoint_frequency_unit="iteration",
        checkpoint_keep=1,
    )


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=1, process_id=0)
    folder = HERE / "sharded"
    folder.mkdir()
    X, T = make.data()
    pause = options(folder).replace(
        execution_environment="multi-host", output_fcn=lambda info: info["iteration"] >= 4
    )
    df.trainnet(X, T, make.network(), df.losses.crossentropy, pause, key=jax.random.key(1))
    print(sorted(p.name for p in folder.iterdir()))
