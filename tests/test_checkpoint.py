"""trainnet's checkpoints and resume_from: files, pruning, exact resumes, damage, a full disk."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import checkpoint_run as run
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from helpers import ROOT, assert_tree_allclose, unwritable_folder
from training_layers import classification_data, classifier_net

import difffn as df
from difffn._training import _checkpoint, _manifest


@pytest.fixture(scope="module")
def uninterrupted():
    """The reference: the checkpoint_run training without interruption or checkpoints."""
    return run.train()


def assert_same_run(result, reference):
    """Bit for bit: the networks (learnables and state) and the loss histories."""
    (net, info), (ref, ref_info) = result, reference
    assert_tree_allclose(net.learnables, ref.learnables, rtol=0, atol=0)
    assert_tree_allclose(net.state, ref.state, rtol=0, atol=0)
    assert info.stop_reason == ref_info.stop_reason
    assert info.output_network_iteration == ref_info.output_network_iteration
    for history in ("training_history", "validation_history"):
        a, b = getattr(info, history), getattr(ref_info, history)
        assert a.columns == b.columns
        for column in a.columns:
            if column != "time_elapsed":
                np.testing.assert_array_equal(a[column], b[column], err_msg=column)


NAME = r"net_checkpoint__\d+__\d{4}_\d\d_\d\d__\d\d_\d\d_\d\d"  # MATLAB's, without .mat


def orbax_arrays(checkpoint: Path) -> dict:
    """A checkpoint's arrays as orbax itself reads them (no target: nested dicts of numpy)."""
    with warnings.catch_warnings():  # "Sharding info not provided": one process, one device
        warnings.simplefilter("ignore", UserWarning)
        return ocp.PyTreeCheckpointer().restore((checkpoint / "arrays").absolute())


def pause_at(iteration):
    return lambda info: info["iteration"] >= iteration


def names(folder):
    return [p.name for p in _checkpoint.checkpoints(folder)]


def iterations(folder):
    return sorted(int(name.split("__")[1]) for name in names(folder))


# -- writing --------------------------------------------------------------------------------------


def test_checkpoints_follow_frequency_and_unit_and_keep_the_newest(tmp_path):
    X, T = classification_data(64)
    base = {"max_epochs": 3, "mini_batch_size": 16, "verbose": False}  # 4 iterations an epoch
    by_iteration, by_epoch = tmp_path / "it", tmp_path / "ep"
    by_iteration.mkdir()
    by_epoch.mkdir()
    options = df.TrainingOptions(
        **base,
        checkpoint_path=by_iteration,
        checkpoint_frequency=3,
        checkpoint_frequency_unit="iteration",
        checkpoint_keep=2,
    )
    net, _ = df.trainnet(X, T, classifier_net(), "crossentropy", options)
    assert iterations(by_iteration) == [9, 12]  # 3 and 6 were written, then pruned
    assert all(re.fullmatch(NAME, n) for n in names(by_iteration))
    assert all((by_iteration / n).is_dir() for n in names(by_iteration))
    payload = _checkpoint.read(by_iteration / names(by_iteration)[0])
    assert (payload["iteration"], payload["epoch"], payload["batch"]) == (12, 3, 4)
    assert payload["history"]["training"] == 12  # rows in the run's history log
    # orbax itself reads a checkpoint's arrays: the learnables, in leaf order
    restored = orbax_arrays(by_iteration / names(by_iteration)[0])
    for got, want in zip(restored["learnables"], net.learnables.values(), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(
        df.SerializationError,
        match=r"is a trainnet checkpoint folder \(orbax\), not a df\.save file\. Fix: continue "
        r"the run with df\.trainnet\(\.\.\., resume_from=path\), or read its arrays with orbax",
    ):
        df.load(by_iteration / names(by_iteration)[0], like=classifier_net())

    options = df.TrainingOptions(**base, checkpoint_path=by_epoch, checkpoint_keep=math.inf)
    df.trainnet(X, T, classifier_net(), "crossentropy", options)
    assert iterations(by_epoch) == [4, 8, 12]
    payload = _checkpoint.read(by_epoch / names(by_epoch)[-1])
    assert (payload["iteration"], payload["epoch"], payload["batch"]) == (4, 1, 0)


def test_checkpoint_keep_is_validated(tmp_path):
    with pytest.raises(
        df.OptionsError, match=r"checkpoint_keep must be a positive int or math.inf"
    ):
        df.TrainingOptions(checkpoint_keep=0)
    assert df.TrainingOptions().checkpoint_keep == 3


def test_files_hold_no_pickle(tmp_path):
    X, T = classification_data(32)
    options = df.TrainingOptions(max_epochs=1, mini_batch_size=16, verbose=False)
    df.trainnet(X, T, classifier_net(), "crossentropy", options.replace(checkpoint_path=tmp_path))
    files = [p for p in (tmp_path / names(tmp_path)[0]).rglob("*") if p.is_file()]
    assert len(files) > 5 and (tmp_path / names(tmp_path)[0] / "difffn_manifest.json") in files
    for path in files:
        blob = path.read_bytes()
        assert b"\x80\x04\x95" not in blob and b"\x80\x05\x95" not in blob, path


# -- exact resumes --------------------------------------------------------------------------------


@pytest.mark.parametrize("pause", [8, 12], ids=["mid-epoch", "end-of-epoch"])
def test_resuming_from_a_file_equals_the_uninterrupted_run(tmp_path, uninterrupted, pause):
    _, info = run.train(tmp_path, output_fcn=pause_at(pause))
    assert info.stop_reason == "Stopped by output_fcn"
    newest = tmp_path / names(tmp_path)[0]
    assert _checkpoint.read(newest)["iteration"] == pause
    assert_same_run(run.train(resume_from=newest), uninterrupted)


@pytest.mark.parametrize("solver", ["adam", "rmsprop"])
def test_every_solver_state_resumes_exactly(tmp_path, solver):
    X, T = classification_data(64)
    options = df.TrainingOptions(
        solver, max_epochs=3, mini_batch_size=16, verbose=False, shuffle="every-epoch"
    )
    reference = df.trainnet(X, T, classifier_net(), "crossentropy", options)
    df.trainnet(
        X,
        T,
        classifier_net(),
        "crossentropy",
        options.replace(
            checkpoint_path=tmp_path, checkpoint_frequency_unit="iteration", output_fcn=pause_at(6)
        ),
    )
    resumed = df.trainnet(X, T, classifier_net(), "crossentropy", options, resume_from=tmp_path)
    assert_same_run(resumed, reference)


def test_iterable_data_resumes_at_the_same_batch(tmp_path):
    X, T = classification_data(70)
    batches = [(X[i : i + 16], T[i : i + 16]) for i in range(0, 70, 16)]  # the last has 6: dropped
    options = df.TrainingOptions(max_epochs=2, verbose=False)
    reference = df.trainnet(batches, classifier_net(), "crossentropy", options)
    df.trainnet(
        batches,
        classifier_net(),
        "crossentropy",
        options.replace(
            checkpoint_path=tmp_path, checkpoint_frequency_unit="iteration", output_fcn=pause_at(4)
        ),
    )
    assert _checkpoint.read(tmp_path / names(tmp_path)[0])["batch"] == 4
    resumed = df.trainnet(batches, classifier_net(), "crossentropy", options, resume_from=tmp_path)
    assert len(resumed[1].training_history) == 8
    assert_same_run(resumed, reference)


def test_a_run_that_ended_returns_its_result(tmp_path, uninterrupted):
    run.train(tmp_path)
    assert_same_run(run.train(resume_from=tmp_path), uninterrupted)


@pytest.mark.parametrize("pause", [19, 22], ids=["first-of-the-last-epoch", "in-the-last-epoch"])
def test_resuming_inside_the_last_epoch_trains_it_to_the_end(tmp_path, uninterrupted, pause):
    run.train(tmp_path, output_fcn=pause_at(pause))
    assert _checkpoint.read(tmp_path / names(tmp_path)[0])["epoch"] == 4  # the last epoch
    result = run.train(resume_from=tmp_path)
    assert len(result[1].training_history) == run.ITERATIONS
    assert_same_run(result, uninterrupted)  # learnables and BatchNorm statistics bit for bit


def test_resuming_a_one_epoch_run(tmp_path):
    reference = run.train(max_epochs=1)
    run.train(tmp_path, max_epochs=1, output_fcn=pause_at(3))
    result = run.train(resume_from=tmp_path, max_epochs=1)
    assert len(result[1].training_history) == 6
    assert_same_run(result, reference)


def test_resuming_a_finished_run_returns_its_result_without_training(tmp_path, uninterrupted):
    run.train(tmp_path, checkpoint_frequency=5)  # checkpoints at 5, 10, 15, 20, and the end
    assert iterations(tmp_path) == [15, 20, 24]
    assert _checkpoint.read(tmp_path / names(tmp_path)[0])["stop_reason"] == "Max epochs completed"
    trained = []
    result = run.train(resume_from=tmp_path, output_fcn=lambda info: trained.append(info["state"]))
    assert "iteration" not in trained
    assert_same_run(result, uninterrupted)
    assert iterations(tmp_path) == [15, 20, 24]  # nothing new written


def test_sigkill_mid_run_then_resume_from_the_folder(tmp_path, uninterrupted):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    env = dict(os.environ)
    env.pop("JAX_ENABLE_X64", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    script = [sys.executable, str(ROOT / "tests" / "checkpoint_run.py"), str(folder)]
    with open(tmp_path / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen(
            [*script, "--slow", "0.1"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr
        )
        try:
            deadline = time.monotonic() + 120
            while len(names(folder)) < 3 and process.poll() is None:
                assert time.monotonic() < deadline, "no checkpoints after 120 s"
                time.sleep(0.02)
            assert process.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == -signal.SIGKILL
    newest = _checkpoint.read(folder / names(folder)[0])["iteration"]
    assert 3 <= newest < run.ITERATIONS  # killed mid-run
    assert_same_run(run.train(resume_from=folder), uninterrupted)


# -- damage ---------------------------------------------------------------------------------------


def array_file(checkpoint: Path) -> Path:
    """The largest file of a checkpoint's array data (tensorstore chunks written by orbax)."""
    files = [p for p in (checkpoint / "arrays").rglob("*") if p.is_file() and p.parent.name == "d"]
    return max(files, key=lambda p: p.stat().st_size)


def damage(checkpoint: Path, how: str) -> str:
    """Damage one file of a checkpoint folder; return its path in the folder."""
    path = checkpoint / "difffn_manifest.json" if how == "manifest" else array_file(checkpoint)
    blob = path.read_bytes()
    if how == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    elif how == "missing":
        path.unlink()
    else:  # 64 bytes flipped in the middle (the manifest: one byte)
        middle, width = len(blob) // 2, 1 if how == "manifest" else min(64, len(blob) // 4)
        flipped = bytes(b ^ 0xFF for b in blob[middle : middle + width])
        path.write_bytes(blob[:middle] + flipped + blob[middle + width :])
    return path.relative_to(checkpoint).as_posix()


@pytest.mark.parametrize(
    "how, reason",
    [
        ("flipped", r"is corrupted: its checksum does not match"),
        ("truncated", r"is truncated: \d+ bytes, \d+ written"),
        ("missing", r"is missing"),
        ("manifest", r"is damaged"),
    ],
)
def test_a_damaged_newest_checkpoint_is_reported_and_the_previous_one_used(
    tmp_path, uninterrupted, how, reason
):
    run.train(tmp_path, output_fcn=pause_at(10))
    assert iterations(tmp_path) == [8, 9, 10]
    name = re.escape(damage(tmp_path / names(tmp_path)[0], how))
    with pytest.warns(
        df.CheckpointWarning,
        match=rf"skipping the damaged checkpoint net_checkpoint__10__\S+ \(.*{name} {reason}.*\); "
        r"resuming from the previous good one, net_checkpoint__9__",
    ):
        result = run.train(resume_from=tmp_path)
    assert_same_run(result, uninterrupted)


def test_no_valid_checkpoint_lists_what_was_tried(tmp_path):
    run.train(tmp_path, output_fcn=pause_at(2), checkpoint_keep=2)
    for name in names(tmp_path):
        damage(tmp_path / name, "flipped")
    with pytest.raises(
        df.SerializationError,
        match=r"none of its 2 checkpoint\(s\) is valid\. Tried, newest first: "
        r"net_checkpoint__2__.*corrupted.*; net_checkpoint__1__.*corrupted",
    ):
        run.train(resume_from=tmp_path)


def test_missing_and_empty_resume_sources(tmp_path):
    with pytest.raises(df.SerializationError, match=r"resume_from='.*nope' does not exist"):
        run.train(resume_from=tmp_path / "nope")
    with pytest.raises(df.SerializationError, match=r"holds no checkpoints"):
        run.train(resume_from=tmp_path)
    (tmp_path / "file.difffn").write_bytes(b"not a checkpoint")
    with pytest.raises(df.SerializationError, match=r"is not a difffn file"):
        run.train(resume_from=tmp_path / "file.difffn")
    with pytest.raises(
        df.SerializationError, match=r"resume_from must be a checkpoint \(a net_checkpoint__"
    ):
        run.train(resume_from=3)


# -- resuming another run -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def paused(tmp_path_factory):
    folder = tmp_path_factory.mktemp("paused")
    run.train(folder, output_fcn=pause_at(5))
    return folder


def test_resume_with_another_network_is_a_clear_error(paused):
    X, T, _, _ = run.data()
    layers = run.network().layers
    other = df.Network([*layers[:-2], df.layers.FullyConnected(3, name="fc3"), layers[-1]])
    with pytest.raises(
        df.SerializationError,
        match=r"resume_from=.*does not match the network at layer 6: the network has 'fc3'.*"
        r"the file has 'fc2'.*Fix: pass the network the run started from",
    ):
        df.trainnet(X, T, other, "crossentropy", run.options(), resume_from=paused)


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"options": {"mini_batch_size": 32}},
            r"differs in option mini_batch_size: it had 16; this call has 32",
        ),
        (
            {"options": {"initial_learn_rate": 0.1}},
            r"differs in option initial_learn_rate: it had 0.05; this call has 0.1",
        ),
        ({"loss": "mse"}, r"differs in loss: it had 'crossentropy'; this call has 'mse'"),
        ({"data": True}, r"differs in data X\[0\]: it had shape \(96, 4\) float32, hash"),
        (
            {"factor": True},
            r"differs in factors of \.fc1\.weights: it had learn rate 1.0, L2 1.0; this call "
            r"has learn rate 0.5, L2 1.0",
        ),
        ({"key": jax.random.key(8)}, r"the key differs from the key the run"),
    ],
    ids=["batch-size", "learn-rate", "loss", "data", "factor", "key"],
)
def test_resume_with_other_options_data_or_key_is_a_clear_error(paused, changes, message):
    X, T, _, _ = run.data()
    if changes.get("data"):
        X = X + 1
    net = run.network()
    if changes.get("factor"):
        net = df.set_learn_rate_factor(net, "fc1/weights", 0.5)
    options = run.options(**changes.get("options", {}))
    with pytest.raises(df.SerializationError, match=message):
        df.trainnet(
            X,
            T,
            net,
            changes.get("loss", "crossentropy"),
            options,
            key=changes.get("key"),
            resume_from=paused,
        )


def test_what_may_change_when_resuming(paused, uninterrupted):
    # display and checkpoint options are not part of the run's numbers
    result = run.train(
        resume_from=paused, verbose=True, verbose_frequency=100, checkpoint_path=None
    )
    assert_same_run(result, uninterrupted)


# -- a full disk ----------------------------------------------------------------------------------


def test_a_full_disk_warns_keeps_the_older_checkpoints_and_training_goes_on(
    tmp_path, monkeypatch, uninterrupted
):
    real_fsync = os.fsync

    def fsync(fd):
        if disk_full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    disk_full = False

    def fill_the_disk(info):
        nonlocal disk_full
        disk_full = disk_full or info["iteration"] >= 6
        return False

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.warns(
        df.CheckpointWarning,
        match=r"checkpoint of iteration \d+ could not be written \(could not write .*No space "
        r"left on device.*Training goes on; the older checkpoints .* are kept and still valid",
    ) as warned:
        result = run.train(tmp_path, output_fcn=fill_the_disk)
    monkeypatch.undo()
    assert len(warned) == run.ITERATIONS - 5
    assert "checkpoint of iteration 6 could not" in str(warned[0].message)
    assert_same_run(result, uninterrupted)  # training was not lost
    assert iterations(tmp_path) == [3, 4, 5]
    log = history_log(tmp_path).name
    assert sorted(os.listdir(tmp_path)) == sorted([*names(tmp_path), log])  # no temporary files
    for name in names(tmp_path):
        _checkpoint.read(tmp_path / name)
    assert_same_run(run.train(resume_from=tmp_path), uninterrupted)


def test_a_checkpoint_folder_removed_mid_run_warns_and_training_goes_on(tmp_path, uninterrupted):
    folder = tmp_path / "checkpoints"
    folder.mkdir()

    def remove_the_folder(info):
        if info["iteration"] == 20:
            shutil.rmtree(folder)
        return False

    with pytest.warns(df.CheckpointWarning, match=r"the folder .* does not exist") as warned:
        result = run.train(folder, output_fcn=remove_the_folder)
    assert len(warned) == run.ITERATIONS - 19
    assert_same_run(result, uninterrupted)


@pytest.mark.parametrize("where", ["read-only", "proc"])
def test_a_folder_that_refuses_files_warns_and_training_goes_on(tmp_path, uninterrupted, where):
    folder = unwritable_folder(tmp_path) if where == "read-only" else Path("/proc")
    with pytest.warns(
        df.CheckpointWarning,
        match=r"checkpoint of iteration \d+ could not be written \(could not write .*: cannot "
        r"create a file in .*Training goes on.*Fix: free disk space, make the folder writable",
    ) as warned:
        result = run.train(folder)
    assert len(warned) == run.ITERATIONS  # one per checkpoint; none for the result (the last)
    assert_same_run(result, uninterrupted)


def test_a_stream_of_batches_resumes_at_its_position(tmp_path):
    """steps_per_epoch: the stream goes on across epochs; a resume skips what was read."""
    X, T = classification_data(70)
    batches = [(X[i : i + 16], T[i : i + 16]) for i in range(0, 70, 16)]  # the last has 6

    def endless():
        while True:
            yield from batches

    options = df.TrainingOptions(max_epochs=3, steps_per_epoch=3, verbose=False)
    reference = df.trainnet(endless(), classifier_net(), "crossentropy", options)
    paused = options.replace(
        checkpoint_path=tmp_path, checkpoint_frequency_unit="iteration", output_fcn=pause_at(5)
    )
    df.trainnet(endless(), classifier_net(), "crossentropy", paused)
    assert _checkpoint.read(tmp_path / names(tmp_path)[0])["data_position"] == 6  # a 6 dropped
    resumed = df.trainnet(
        endless(), classifier_net(), "crossentropy", options, resume_from=tmp_path
    )
    assert len(resumed[1].training_history) == 9
    assert_same_run(resumed, reference)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p.pop("shuffle_seed"), r"the progress lacks 'shuffle_seed'"),
        (lambda p: p.update(iteration="5"), r"\['iteration'\] should be int, not str"),
        (lambda p: p["key"].update(data="no"), r"\['key'\]\['data'\] should be list"),
        (
            lambda p: p["history"].update(file="../x"),
            r"the history log's name is '\.\./x'; expected a bare file name",
        ),
    ],
    ids=["no-seed", "iteration-type", "key-data", "history-path"],
)
def test_a_well_checksummed_malformed_checkpoint_is_a_named_error(
    paused, tmp_path, change, message
):
    path = tmp_path / names(paused)[0]
    shutil.copytree(paused / names(paused)[0], path)
    (progress,) = (path / "progress").glob("metadata")
    payload = json.loads(progress.read_text())
    change(payload)
    progress.write_text(json.dumps(payload))
    _manifest.write(path)  # good checksums over a bad payload
    with pytest.raises(df.SerializationError, match=rf"is malformed: .*{message}.*Fix:"):
        run.train(resume_from=path)


# -- the history log (issue 12 item 11) -----------------------------------------------------------


def history_log(folder):
    (log,) = folder.glob("net_history__*.jsonl")
    return log


def test_checkpoints_do_not_grow_with_the_history(tmp_path, uninterrupted):
    result = run.train(tmp_path, checkpoint_keep=math.inf)
    # the progress item (JSON) would hold the rows; the arrays' files vary by a few KB with
    # orbax's layout of their chunks, whatever the history
    sizes = {
        int(p.name.split("__")[1]): (p / "progress" / "metadata").stat().st_size
        for p in tmp_path.glob("net_checkpoint*")
    }
    assert sorted(sizes) == list(range(1, run.ITERATIONS + 1))
    assert max(sizes.values()) - min(sizes.values()) < 200  # 24 rows would add kilobytes
    assert_same_run(run.train(resume_from=tmp_path), uninterrupted)
    assert_same_run(result, uninterrupted)
    # the log holds each row once per checkpoint that added it: linear in the run
    log = history_log(tmp_path).stat().st_size
    assert log < 200 * (run.ITERATIONS + 6)


def test_a_lost_history_log_warns_and_training_goes_on_exactly(tmp_path, uninterrupted):
    run.train(tmp_path, output_fcn=pause_at(10))
    history_log(tmp_path).unlink()
    with pytest.warns(
        df.CheckpointWarning,
        match=r"the history log .* cannot be read .*; the history returned lacks the rest\. The "
        r"training state is whole, so training goes on exactly",
    ):
        net, info = run.train(resume_from=tmp_path)
    ref_net, ref_info = uninterrupted
    assert_tree_allclose(net.learnables, ref_net.learnables, rtol=0, atol=0)
    assert_tree_allclose(net.state, ref_net.state, rtol=0, atol=0)
    np.testing.assert_array_equal(info.training_history["iteration"], np.arange(11, 25))


def test_a_torn_history_log_is_repaired_and_stays_readable(tmp_path, uninterrupted):
    """A process killed while appending leaves a torn record: it is cut before the next append."""
    run.train(tmp_path, output_fcn=pause_at(10))
    log = history_log(tmp_path)
    with open(log, "ab") as file:
        file.write(b"\x40\x00\x00\x00\x00\x00\x00\x00half a record")
    run.train(tmp_path, resume_from=tmp_path, output_fcn=pause_at(16))  # appends after the tear
    assert_same_run(run.train(resume_from=tmp_path), uninterrupted)


# -- checkpoints of the release before one format -------------------------------------------------


def test_a_multi_process_checkpoint_of_the_earlier_release_resumes(tmp_path):
    """An orbax ``<step>`` folder written by the earlier release's ShardedWriter (commit
    6c41c82, tests/data/earlier_release/make_sharded.py) resumes in one process."""
    earlier = Path(__file__).parent / "data" / "earlier_release"
    sys.path.insert(0, str(earlier))
    import make_sharded  # noqa: PLC0415  (its network, data and options)

    folder = tmp_path / "sharded"
    shutil.copytree(earlier / "sharded", folder)
    X, T = make_sharded.make.data()
    net = make_sharded.make.network()
    loss = df.losses.crossentropy
    resumed, info = df.trainnet(
        X, T, net, loss, make_sharded.options(), resume_from=folder, key=jax.random.key(1)
    )
    fresh, fresh_info = df.trainnet(X, T, net, loss, make_sharded.options(), key=jax.random.key(1))
    assert info.training_history["iteration"].tolist() == list(range(1, 7))
    checkpoint = _checkpoint.find(folder)  # the rows before iteration 4 are the file's
    assert checkpoint.iteration == 4 and Path(checkpoint.source).name == "4"
    stored = [row["time_elapsed"] for row in checkpoint.payload["training_rows"]]
    assert info.training_history["time_elapsed"][:4].tolist() == stored
    # other CPU kernels may have written the file: the last digits are not compared
    assert_tree_allclose(resumed.learnables, fresh.learnables, rtol=1e-5, atol=1e-7)
