"""execution_environment="multi-host": 2 processes x 2 host devices joined by jax.distributed on
loopback (tests/multihost_run.py, launched by tests/multiprocess.py), against a 1-process x
4-device run and a 1-device run of the same training."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import run_python
from multiprocess import launch

import difffn as df

SCRIPT = Path(__file__).parent / "multihost_run.py"
TOL = 1e-4  # float32 rounding: the gradient reduction adds in another order


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("multihost")
    single = run_python(SCRIPT, "single", str(out), devices=4, env={"JAX_PLATFORMS": "cpu"})
    assert single.returncode == 0, single.stderr[-3000:]
    results = {}
    for mode in ("multihost", "killed", "resumed"):
        results[mode] = launch(SCRIPT, mode, out, folder=out / f"logs-{mode}", timeout=400)
    for mode in ("multihost", "resumed"):
        for r in results[mode]:
            assert r.returncode == 0, f"{mode}: {r.stderr[-3000:]}"
    return out, results


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
def test_checkpoints_written_once_through_orbax(runs):
    out, _ = runs
    _, facts = _load(out, "multihost")
    steps = sorted(int(s) for s in facts["steps"] if s.isdigit())
    assert steps and steps[-1] == 24 and all(s % 4 == 0 for s in steps)


@pytest.mark.multihost
@pytest.mark.slow
def test_resume_after_sigkill_of_both_processes(runs):
    out, results = runs
    assert [r.returncode for r in results["killed"]] == [-9, -9]
    saved = sorted(int(p.name) for p in (out / "ckpt-killed").iterdir() if p.name.isdigit())
    assert saved and saved[-1] < 24  # killed mid-run, at iteration 14
    multi, multi_facts = _load(out, "multihost")
    resumed, resumed_facts = _load(out, "resumed")
    _assert_close(_group(resumed, "run"), _group(multi, "run"))
    assert resumed_facts["iterations"] == list(range(1, 25))
    np.testing.assert_allclose(resumed_facts["loss"], multi_facts["loss"], atol=TOL)


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
