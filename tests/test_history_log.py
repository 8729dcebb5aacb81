"""A checkpointed run's history as JSON lines: read by pandas and ``json``, resumed bit for bit,
repaired after a torn append; the binary ``*.difffnlog`` of earlier runs still reads."""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import checkpoint_run as run
import jax
import numpy as np
import pytest

import difffn as df
from difffn._training import _history_log
from difffn._training._checkpoint import find

BEFORE = Path(__file__).parent / "data" / "before_move"


def the_log(folder: Path) -> Path:
    (log,) = folder.glob("net_history__*.jsonl")
    return log


def test_pandas_reads_the_history_that_trainnet_returned(tmp_path):
    pandas = pytest.importorskip("pandas")
    _, info = run.train(tmp_path)
    frame = pandas.read_json(the_log(tmp_path), lines=True, precise_float=True)
    frame = frame.drop_duplicates(["kind", "row"], keep="last")
    training = frame[frame["kind"] == "training"].sort_values("row")
    validation = frame[frame["kind"] == "validation"].sort_values("row")
    history = info.training_history
    assert list(training["row"]) == list(range(run.ITERATIONS))
    for column in history.columns:  # the same float64 numbers, not close ones
        np.testing.assert_array_equal(training[column].to_numpy(), history[column])
    for column in info.validation_history.columns:
        np.testing.assert_array_equal(
            validation[column].to_numpy(), info.validation_history[column]
        )


def test_each_line_is_a_json_object_with_its_kind_and_row(tmp_path):
    _, info = run.train(tmp_path, checkpoint_frequency=6)
    lines = the_log(tmp_path).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert {r["kind"] for r in records} == {"training", "validation"}
    first = next(r for r in records if r["kind"] == "training")
    assert set(first) == {"kind", "row", *info.training_history.columns}
    assert first["row"] == 0 and first["iteration"] == 1
    assert first["loss"] == info.training_history["loss"][0]


def test_a_resumed_run_returns_the_history_bit_for_bit(tmp_path):
    _, whole = run.train()

    def pause(info):
        return info["iteration"] == 10

    run.train(tmp_path, output_fcn=pause)
    _, resumed = run.train(resume_from=tmp_path)
    for name in ("training_history", "validation_history"):
        a, b = getattr(whole, name), getattr(resumed, name)
        for column in a.columns:
            if column == "time_elapsed":
                continue
            np.testing.assert_array_equal(a[column], b[column])
            # the resumed rows before the pause came back from the log: same bits
        np.testing.assert_array_equal(
            getattr(resumed, name)["time_elapsed"][:3],
            [r["time_elapsed"] for r in _rows(tmp_path, name)[:3]],
        )


def _rows(folder, name):
    kind = "training" if name == "training_history" else "validation"
    records = [json.loads(line) for line in the_log(folder).read_text().splitlines()]
    return sorted((r for r in records if r["kind"] == kind), key=lambda r: r["row"])


def test_nan_infinity_and_every_float_bit_survive(tmp_path):
    path = tmp_path / "rows.jsonl"
    values = [float("nan"), float("inf"), -0.0, 5e-324, 0.1 + 0.2, 1 / 3, 1.7976931348623157e308]
    rows = [{"iteration": k + 1, "loss": v} for k, v in enumerate(values)]
    _history_log.repair(path)
    _history_log.append(path, (0, rows), (0, []))
    back, _, problem = _history_log.read(path, len(rows), 0)
    assert problem is None and [r["iteration"] for r in back] == list(range(1, 8))
    bits = lambda v: struct.pack("<d", v)  # noqa: E731
    assert [bits(r["loss"]) for r in back[1:]] == [bits(v) for v in values[1:]]
    assert np.isnan(back[0]["loss"])


def test_a_torn_line_is_cut_before_the_next_append(tmp_path):
    path = tmp_path / "rows.jsonl"
    _history_log.repair(path)
    _history_log.append(path, (0, [{"iteration": 1, "loss": 1.0}]), (0, []))
    with open(path, "ab") as file:
        file.write(b'{"kind": "training", "row": 1, "itera')  # killed mid-append
    assert _history_log.read(path, 2, 0)[2] == (
        f"the history log {str(path)!r} holds 1 of 2 training rows and 0 of 0 validation rows"
    )
    _history_log.repair(path)
    _history_log.append(path, (1, [{"iteration": 2, "loss": 0.5}]), (0, []))
    rows, _, problem = _history_log.read(path, 2, 0)
    assert problem is None and [r["loss"] for r in rows] == [1.0, 0.5]


def test_a_run_checkpointed_in_the_old_binary_log_resumes_into_json_lines(tmp_path):
    folder = tmp_path / "checkpoints"
    shutil.copytree(BEFORE / "checkpoints", folder)
    sys.path.insert(0, str(BEFORE))
    try:
        import make
    finally:
        sys.path.remove(str(BEFORE))
    first = next(folder.glob("net_checkpoint__3__*.difffn"))
    checkpoint = find(str(first))
    assert checkpoint.history_log.suffix == ".difffnlog"
    old_rows, _, problem = checkpoint.history_rows()
    assert problem is None and [r["iteration"] for r in old_rows] == [1, 2, 3]
    X, T = make.data()
    options = df.TrainingOptions(
        "sgdm",
        max_epochs=2,
        mini_batch_size=8,
        shuffle="never",
        verbose=False,
        checkpoint_path=folder,
        checkpoint_frequency=1,
    )
    _, info = df.trainnet(
        X,
        T,
        make.network(),
        df.losses.crossentropy,
        options,
        key=jax.random.key(1),
        resume_from=first,
    )
    assert list(info.training_history["iteration"]) == [1, 2, 3, 4, 5, 6]
    np.testing.assert_array_equal(info.training_history["loss"][:3], [r["loss"] for r in old_rows])
    records = [json.loads(line) for line in the_log(folder).read_text().splitlines()]
    training = [r for r in records if r["kind"] == "training"]
    assert [r["iteration"] for r in training] == [1, 2, 3, 4, 5, 6]  # the whole history
