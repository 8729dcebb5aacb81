"""execution_environment="multi-host": 2 processes x 2 host devices joined by jax.distributed on
loopback (tests/multihost_run.py, launched by tests/multiprocess.py), against a 1-process x
4-device run and a 1-device run of the same training; a process SIGKILLed mid-run (the other
stops within process_timeout, saying how to resume); checkpoints resumed on other topologies
(2 x 2 -> 2 x 2, 1 x 1, 1 x 4 fsdp; 1 x 1 -> 2 x 2 fsdp)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import run_python
from multiprocess import launch

import difffn as df

SCRIPT = Path(__file__).parent / "multihost_run.py"
KILL_AT = 12  # multihost_run.KILL_AT: process 1 dies after this iteration's checkpoint
TOL = 1e-4  # float32 rounding: the gradient reduction adds in another order


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("multihost")
    single = run_python(SCRIPT, "single", str(out), devices=4, env={"JAX_PLATFORMS": "cpu"})
    assert single.returncode == 0, single.stderr[-3000:]
    results = {}
    for mode in ("multihost", "killed", "resumed", "resumed_from_one"):
        if mode == "resumed":  # the newest checkpoint of the killed run, damaged
            shutil.copytree(out / "ckpt-killed", out / "ckpt-damaged")
            newest = max(
                (out / "ckpt-damaged").glob("net_checkpoint__*"),
                key=lambda p: int(p.name.split("__")[1]),
            )
            (out / "damaged.txt").write_text(flip_array_bytes(newest))
        results[mode] = launch(SCRIPT, mode, out, folder=out / f"logs-{mode}", timeout=400)
    for mode in ("multihost", "resumed", "resumed_from_one"):
        for r in results[mode]:
            assert r.returncode == 0, f"{mode}: {r.stderr[-3000:]}"
    results["hung"] = launch(SCRIPT, "hung", out, folder=out / "logs-hung", timeout=400, end_with=0)
    one = run_python(SCRIPT, "resume_one", str(out), devices=4, env={"JAX_PLATFORMS": "cpu"})
    assert one.returncode == 0, one.stderr[-3000:]
    return out, results


def flip_array_bytes(checkpoint: Path) -> str:
    """Flip 64 bytes in the middle of the largest array data file; its path in the checkpoint."""
    files = [p for p in (checkpoint / "arrays").rglob("*") if p.is_file() and p.parent.name == "d"]
    path = max(files, key=lambda p: p.stat().st_size)
    blob = path.read_bytes()
    middle, width = len(blob) // 2, min(64, len(blob) // 4)
    flipped = bytes(b ^ 0xFF for b in blob[middle : middle + width])
    path.write_bytes(blob[:middle] + flipped + blob[middle + width :])
    return path.relative_to(checkpoint).as_posix()


def _load(out: Path, name: str):
    arrays = dict(np.load(out / f"{name}.npz"))
    return arrays, json.loads((out / f"{name}.json").read_text())


def _group(arrays: dict, prefix: str) -> dict:
    return {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(prefix + "/")}


def _assert_close(a: dict, b: dict):
    assert a.keys() == b.keys() and a
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=TOL, rtol=TOL, err_msg=k)


def _assert_same_group(out: Path, prefix: str):
    """The arrays saved under ``prefix`` agree between the two-process run and the single one."""
    single, _ = _load(out, "single")
    multi, _ = _load(out, "multihost")
    _assert_close(_group(multi, prefix), _group(single, prefix))


@pytest.mark.multihost
@pytest.mark.slow
def test_two_processes_train_as_four_devices_and_as_one(runs):
    out, _ = runs
    single, single_facts = _load(out, "single")
    multi, multi_facts = _load(out, "multihost")
    _assert_close(_group(multi, "run"), _group(single, "many"))
    _assert_close(_group(multi, "run"), _group(single, "one"))
    np.testing.assert_allclose(multi_facts["loss"], single_facts["loss"], atol=TOL)
    # validation is global: the loss over the whole validation set, whose last batch (14)
    # does not split over 4 devices
    np.testing.assert_allclose(multi_facts["validation"], single_facts["validation"], atol=TOL)
    assert multi_facts["stop_reason"] == "Max epochs completed"


@pytest.mark.multihost
@pytest.mark.slow
def test_each_process_feeding_its_own_shards(runs):
    out, _ = runs
    _assert_same_group(out, "iterable")


@pytest.mark.multihost
@pytest.mark.slow
def test_an_uneven_mini_batch_is_padded_across_processes(runs):
    # 30 observations over 2 processes x 2 devices: padded to 32, the padding weightless, so
    # the learnables are those of one device on the unpadded batches
    out, _ = runs
    _assert_same_group(out, "uneven")


@pytest.mark.multihost
@pytest.mark.slow
def test_iterable_shares_whose_global_batch_does_not_split_are_padded_per_process(runs):
    # each of 2 processes yields shares of 3: global batches of 6 over 2 x 2 devices. Without
    # batch norm each share is padded to 4 and the step keeps each process's first 3 rows, so
    # the learnables and losses are one device's on the 6-row batches; with batch norm the
    # shares are gathered and run replicated, the same numbers again
    out, results = runs
    for part in ("padded", "replicated", "replicated_state"):
        _assert_same_group(out, f"iterable_uneven/{part}")
    _, single_facts = _load(out, "single")
    _, multi_facts = _load(out, "multihost")
    facts, expected = multi_facts["iterable_uneven"], single_facts["iterable_uneven"]
    for loss in ("padded_loss", "replicated_loss"):
        assert len(facts[loss]) == 4
        np.testing.assert_allclose(facts[loss], expected[loss], atol=TOL, rtol=TOL)
    (padded,) = facts["padded_printed"]
    assert "Mini-batches of 6 observations are padded to 8 (4 per process)" in padded
    (replicated,) = facts["replicated_printed"]
    assert "they run replicated (each device computes the whole batch, gathered from every " in (
        replicated
    )
    # shares of 3 in process 0 and 4 in process 1: refused in both processes, before a step
    assert re.search(
        r"every process must yield batches of one size; their first batches have different "
        r"sizes \(process 0: 3, process 1: 4\)\. Fix: yield batches of the same size",
        facts["unequal"],
    )
    for process, result in enumerate(results["multihost"]):
        assert f"process {process}: unequal shares refused" in result.stdout


def test_prediction_and_metrics_on_the_mesh(runs):
    out, _ = runs
    single, single_facts = _load(out, "single")
    multi, multi_facts = _load(out, "multihost")
    np.testing.assert_allclose(multi["scores"], single["scores"], atol=TOL)
    assert multi_facts["accuracy"] == pytest.approx(single_facts["accuracy"])
    assert multi_facts["shard_accuracy"] == pytest.approx(single_facts["accuracy"])


@pytest.mark.multihost
@pytest.mark.slow
def test_verbose_plots_and_output_fcn_on_process_zero_only(runs):
    out, results = runs
    first, second = results["multihost"]
    assert "TrainingLoss" in first.stdout and "TrainingLoss" not in second.stdout
    assert (out / "plot_0.png").exists() and not (out / "plot_1.png").exists()
    calls = (out / "output_fcn_0.txt").read_text().split("\n")
    assert "iteration 24" in calls
    assert not (out / "output_fcn_1.txt").exists()


@pytest.mark.multihost
@pytest.mark.slow
def test_checkpoints_written_once_through_orbax_with_matlab_names(runs):
    out, _ = runs
    _, facts = _load(out, "multihost")
    steps = sorted(int(s.split("__")[1]) for s in facts["steps"] if s.startswith("net_check"))
    assert steps == [16, 20, 24]  # every 4 iterations, the newest 3 kept
    assert all(not s.startswith(".") for s in facts["steps"])  # no partial folder left


@pytest.mark.multihost
@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_lost_process_stops_the_other_in_bounded_time_saying_how_to_resume(runs, how):
    """Process 1 SIGKILLed (it dies) or SIGSTOPped (it hangs) after a checkpoint."""
    out, results = runs
    survivor, lost = results[how]
    if how == "killed":
        assert lost.returncode == -9, lost.stderr[-3000:]
    # difffn's watchdog, not JAX's coordination service (SIGABRT after 100 s) nor a hang
    assert survivor.returncode == 75, survivor.stderr[-3000:]
    assert "was not stopped" not in survivor.stdout
    delay = survivor.ended - float((out / f"{how}_at.txt").read_text())
    print(f"{how}: process 0 stopped {delay:.1f} s after process 1 (process_timeout=10)")
    assert delay < 60  # bounded: JAX's own heartbeat timeout (100 s) never came into play
    folder = out / f"ckpt-{how}"
    saved = sorted(int(p.name.split("__")[1]) for p in folder.glob("net_checkpoint__*"))
    assert saved and KILL_AT <= saved[-1] < 24  # stopped mid-run
    # The checkpoint named is one that is complete in the folder. Under load it can be the one
    # before the newest: a commit that finishes while the watchdog writes its message (a race in
    # the message only; resume_from=folder takes the newest complete one).
    named = rf"{re.escape(str(folder))}/net_checkpoint__(?:{'|'.join(map(str, saved))})__\S+"
    assert re.search(
        rf"difffn: process 1 of 2 was lost: its heartbeat stopped \d+\.\d s ago "
        rf"\(TrainingOptions process_timeout=10 s\).*process 0 stops now \(exit status 75\)\.\n"
        rf"The last complete checkpoint: {named}\n"
        rf"To continue, start the job again \(every process\) with trainnet\(\.\.\., "
        rf"resume_from={re.escape(repr(str(folder)))}\)",
        survivor.stderr,
    ), survivor.stderr[-3000:]
    assert "Traceback" not in survivor.stderr


@pytest.mark.multihost
@pytest.mark.slow
def test_a_damaged_checkpoint_is_named_in_every_process_and_the_previous_one_used(runs):
    out, _ = runs
    damaged = (out / "damaged.txt").read_text()
    for process in (0, 1):
        (said,) = json.loads((out / f"resumed_warnings_{process}.json").read_text())
        assert re.search(
            rf"skipping the damaged checkpoint net_checkpoint__(\d+)__\S+ \(.*the file "
            rf"{re.escape(damaged)} is corrupted: its checksum does not match.*\); resuming "
            r"from the previous good one, net_checkpoint__\d+__",
            said,
        ), said


@pytest.mark.multihost
@pytest.mark.slow
def test_the_killed_run_resumes_on_the_same_topology_bit_for_bit(runs):
    """From the checkpoint before the damaged newest one: still the uninterrupted run."""
    out, _ = runs
    multi, multi_facts = _load(out, "multihost")
    resumed, resumed_facts = _load(out, "resumed")
    for k, v in _group(multi, "run").items():
        np.testing.assert_array_equal(_group(resumed, "run")[k], v, err_msg=k)
    assert resumed_facts["iterations"] == list(range(1, 25))
    np.testing.assert_array_equal(resumed_facts["loss"], multi_facts["loss"])


@pytest.mark.multihost
@pytest.mark.slow
def test_a_two_process_checkpoint_resumes_on_one_device_and_on_four_with_fsdp(runs):
    out, _ = runs
    single, single_facts = _load(out, "single")
    resumed, _ = _load(out, "resume_one")
    for name in ("one", "fsdp"):  # 2 x 2 replicated -> 1 x 1, and -> 1 x 4 fsdp
        _assert_close(_group(resumed, name), _group(single, "one"))
        np.testing.assert_allclose(
            resumed[f"{name}_loss"], single_facts["loss"], atol=TOL, rtol=TOL
        )


@pytest.mark.multihost
@pytest.mark.slow
def test_a_one_device_checkpoint_resumes_on_two_processes_with_fsdp(runs):
    out, _ = runs
    multi, multi_facts = _load(out, "multihost")
    resumed, facts = _load(out, "resumed_from_one")
    _assert_close(_group(resumed, "run"), _group(multi, "run"))
    assert facts["iterations"] == list(range(1, 25))  # the one-process rows, then its own
    np.testing.assert_allclose(facts["loss"], multi_facts["loss"], atol=TOL, rtol=TOL)


@pytest.mark.parametrize("value", [0, -1.0, "10", float("nan")])
def test_process_timeout_must_be_positive_seconds(value):
    with pytest.raises(
        df.OptionsError, match=r"process_timeout must be a positive real number; got .*Fix:"
    ):
        df.TrainingOptions(execution_environment="multi-host", process_timeout=value)
    assert df.TrainingOptions().process_timeout == 60


@pytest.mark.parametrize("call", ["trainnet", "minibatchpredict"])
def test_multi_host_without_jax_distributed_says_how_to_start(call):
    net = df.Network([df.layers.FeatureInput(2), df.layers.FullyConnected(2)])
    X = np.zeros((4, 2), np.float32)
    with pytest.raises(df.OptionsError, match=r"jax\.distributed\.initialize\(coordinator_addr"):
        if call == "trainnet":
            options = df.TrainingOptions(verbose=False, execution_environment="multi-host")
            df.trainnet(X, np.zeros(4, np.int32), net, "mse", options, key=jax.random.key(0))
        else:
            df.minibatchpredict(
                net.initialize(key=jax.random.key(0)), X, execution_environment="multi-host"
            )
