"""The one test list: the documentation's table is it, and reports follow its order."""

from __future__ import annotations

import re

import jax.numpy as jnp
import layers_for_checks as L
from helpers import ROOT

import difffn as df
from difffn._checking import _check_list

IMAGES = df.Layout((None, 6, 6, 3), "BSSC")


def documented_rows() -> list[list[str]]:
    """The rows of the table under ``## The tests`` in docs/checking.md, as cells."""
    text = (ROOT / "docs" / "checking.md").read_text()
    section = text[text.index("## The tests") :]
    section = section[: section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_the_documented_table_lists_the_tests_in_order():
    rows = documented_rows()
    names = [re.fullmatch(r"`(.+)`", row[0]).group(1) for row in rows]
    assert names == [t.documented_name for t in _check_list.TESTS]
    checkers = [re.findall(r"`(\w+)`", row[1]) for row in rows]
    assert checkers == [list(t.checkers) for t in _check_list.TESTS]


def test_the_documented_table_is_the_table_in_code():
    text = (ROOT / "docs" / "checking.md").read_text()
    assert _check_list.markdown_table() in text


def base_name(result_name: str) -> str:
    return result_name.split("[", 1)[0]


def assert_follows_the_list(report, checker):
    order = [t.name for t in _check_list.run_by(checker)]
    names = [base_name(r.name) for r in report.results]
    assert set(names) == set(order), (sorted(set(names) ^ set(order)), str(report))
    positions = [order.index(n) for n in names]
    assert positions == sorted(positions), names
    for test in _check_list.run_by(checker):
        if test.params:
            got = [r.name for r in report.results if base_name(r.name) == test.name]
            assert got == list(test.result_names())


def test_check_layer_reports_in_the_order_of_the_list():
    assert_follows_the_list(df.check_layer(L.PReLULayer(), IMAGES), _check_list.LAYER)
    assert_follows_the_list(df.check_layer(L.RunningMean(), IMAGES), _check_list.LAYER)


def test_check_function_reports_in_the_order_of_the_list():
    report = df.check_function(L.SinCosFunction(), jnp.linspace(-2.0, 2.0, 7))
    assert_follows_the_list(report, _check_list.FUNCTION)


def test_every_test_is_run_by_a_checker():
    for test in _check_list.TESTS:
        assert test.checkers, test.name
        assert set(test.checkers) <= {_check_list.LAYER, _check_list.FUNCTION}
        assert bool(test.params) <= bool(test.placeholder), test.name
