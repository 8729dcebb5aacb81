"""The ``difffn`` command line: ``difffn check MODULE:FACTORY --layout SIZES:FMT``.

The end-to-end tests run ``python -m difffn._cli`` (through ``runpy``, as ``-m`` does) in a fresh
process; the usage errors run ``main`` in this one.
"""

from __future__ import annotations

import re

import pytest
from helpers import run_python

import difffn as df
from difffn._cli import main, parse_layout

CHECK = "import runpy; runpy.run_module('difffn._cli', run_name='__main__', alter_sys=True)"


def test_check_of_a_valid_layer_prints_the_report_and_exits_0():
    result = run_python(
        CHECK, "check", "tests.layers_for_checks:make_srelu", "--layout", "?,6,6,3:BSSC"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.startswith(
        "Checking SReLULayer (layer 'srelu') with Layout((None, 6, 6, 3), 'BSSC')"
    )
    assert " .  gradients_are_correct[left_slope]" in out
    assert "Test Summary:" in out and " 0 Failed, 0 Incomplete," in out


def test_check_of_a_wrong_backward_exits_1_and_names_the_learnables():
    result = run_python(
        CHECK,
        "check",
        "tests.layers_for_checks:make_srelu_swapped",
        "--layout",
        "4,6,6,3:BSSC",
        "--export",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert " F  gradients_are_correct[left_threshold]" in out
    assert "FAILED: gradients_are_correct[left_slope]" in out
    assert " 2 Failed, 1 Incomplete," in out  # second order waits for first order
    assert " .  export_matches_predict" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "tests.layers_for_checks:nothing", "--layout", "4,3:BC"], "has no attribute"),
        (["check", "no_such_module_here:f", "--layout", "4,3:BC"], "cannot import module"),
        (["check", "tests.layers_for_checks", "--layout", "4,3:BC"], "is not MODULE:FACTORY"),
        (
            [
                "check",
                "tests.layers_for_checks:make_srelu",
                "--layout",
                "4,3:BC",
                "--layout",
                "4,3:BC",
            ],
            "but got 2 layout",
        ),
        (["check", "tests.layers_for_checks:channel_shape", "--layout", "4,3:BC"], "channel_shape"),
    ],
    ids=["attribute", "module", "no-colon", "layouts", "not-a-factory"],
)
def test_usage_errors_exit_2_with_a_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("text", ["4,3", "4,x:BC", "4,3:BSC"])
def test_a_bad_layout_is_an_argparse_error(text, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "tests.layers_for_checks:make_srelu", "--layout", text])
    assert exit_info.value.code == 2
    assert "--layout" in capsys.readouterr().err


def test_parse_layout():
    assert parse_layout("128,24,24,20:BSSC") == df.Layout((128, 24, 24, 20), "BSSC")
    assert parse_layout("?, 8, None:BTC") == df.Layout((None, 8, None), "BTC")


def test_demo_subcommand_runs_the_main_example_with_small_settings(tmp_path):
    result = run_python(
        "import sys; from difffn._cli import main; sys.exit(main(['demo', '--small']))",
        env={"MPLBACKEND": "Agg", "DIFFFN_OUTPUT_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Test Summary:" in result.stdout and "test accuracy:" in result.stdout
    # the example shows the summary, draws the network and the live plot, logs to TensorBoard
    assert re.search(r"^5  fc +FullyConnected +\?,7,7,32:BSSC +\?,10:BC ", result.stdout, re.M)
    assert re.search(r"^\d[\d,]* learnable parameters \([\d,]+ bytes", result.stdout, re.M)
    for name in ("elu_digits_network.png", "elu_digits_training_progress.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert list((tmp_path / "elu_digits_logs" / "train").glob("events.out.tfevents.*"))
