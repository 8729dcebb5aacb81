"""``CheckReport``: the named results of ``check_layer``/``check_function``, printed like MATLAB.

Each test ends in one of four states, as in MATLAB's test framework:

* ``Passed``;
* ``Failed``: the layer or function is wrong, and the diagnostic says what, where and how to fix it;
* ``Incomplete``: the test could not be carried out (something it relies on failed, or the
  numbers could not be trusted), and the diagnostic says why;
* ``Skipped``: the test does not apply (no GPU, no backward, no state...), with the reason.
"""

from __future__ import annotations

import os
import textwrap
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import jax

PASSED, FAILED, INCOMPLETE, SKIPPED = "Passed", "Failed", "Incomplete", "Skipped"
STATUSES = (PASSED, FAILED, INCOMPLETE, SKIPPED)
_MARKS = {PASSED: ".", FAILED: "F", INCOMPLETE: "I", SKIPPED: "S"}


@dataclass(frozen=True)
class CheckResult:
    """One named test of a check.

    Attributes:
      name: the test, e.g. ``"predict_runs"`` or ``"gradients_are_correct[left_slope]"``.
      status: ``"Passed"``, ``"Failed"``, ``"Incomplete"`` or ``"Skipped"``.
      diagnostic: what went wrong and how to fix it (``Failed``), why the test could not run
        (``Incomplete``, ``Skipped``), or a note (``Passed``; often empty).
      duration: seconds spent on the test.
    """

    name: str
    status: str
    diagnostic: str = ""
    duration: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"CheckResult status must be one of {STATUSES}, got {self.status!r}")


class CheckReport:
    """The results of [`df.check_layer`][difffn.check_layer] or
    [`df.check_function`][difffn.check_function].

    ``print(report)`` shows one line per test (``.`` passed, ``F`` failed, ``I`` incomplete,
    ``S`` skipped), then MATLAB's ``Test Summary:`` with the counts and the elapsed time, then the
    diagnostic of every failed or incomplete test.

    Attributes:
      subject: what was checked, e.g. ``"SReLULayer (layer 'srelu')"``.
      inputs: how it was called, e.g. ``"Layout((128, 24, 24, 20), 'BSSC')"``.
      results: the `CheckResult` of every test, in the order they ran.
      elapsed: seconds the whole check took.
    """

    subject: str
    inputs: str
    results: tuple[CheckResult, ...]
    elapsed: float
    notes: tuple[str, ...]

    def __init__(
        self,
        subject: str,
        inputs: str,
        results: Iterable[CheckResult],
        elapsed: float,
        notes: Iterable[str] = (),
    ) -> None:
        self.subject = subject
        self.inputs = inputs
        self.results = tuple(results)
        self.elapsed = float(elapsed)
        self.notes = tuple(notes)

    def _count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def passed(self) -> int:
        """Number of tests that passed."""
        return self._count(PASSED)

    @property
    def failed(self) -> int:
        """Number of tests that failed."""
        return self._count(FAILED)

    @property
    def incomplete(self) -> int:
        """Number of tests that could not be completed."""
        return self._count(INCOMPLETE)

    @property
    def skipped(self) -> int:
        """Number of tests that do not apply (with the reason in their diagnostic)."""
        return self._count(SKIPPED)

    @property
    def ok(self) -> bool:
        """True when no test failed and none was left incomplete (MATLAB's ``assertSuccess``)."""
        return self.failed == 0 and self.incomplete == 0

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        """The failed and incomplete results."""
        return tuple(r for r in self.results if r.status in (FAILED, INCOMPLETE))

    def __getitem__(self, name: str) -> CheckResult:
        """The result of the test called ``name``."""
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no test named {name!r}; tests: {[r.name for r in self.results]}")

    def __iter__(self) -> Iterator[Any]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def summary(self) -> str:
        """``"N Passed, N Failed, N Incomplete, N Skipped."``"""
        return (
            f"{self.passed} Passed, {self.failed} Failed, {self.incomplete} Incomplete, "
            f"{self.skipped} Skipped."
        )

    def __str__(self) -> str:
        width = max((len(r.name) for r in self.results), default=0)
        lines = [f"Checking {self.subject}" + (f" with {self.inputs}" if self.inputs else "")]
        lines += list(self.notes)
        lines.append("")
        for r in self.results:
            line = f" {_MARKS[r.status]}  {r.name}"
            if r.status == SKIPPED and r.diagnostic:
                line = f"{line:<{width + 5}}  (Skipped: {r.diagnostic.splitlines()[0]})"
            lines.append(line)
        lines += [
            "__________",
            "",
            "Test Summary:",
            f"\t {self.summary()}",
            f"\t Time elapsed: {self.elapsed:.4g} seconds.",
        ]
        problems = self.failures
        if problems:
            lines += ["", "Failure Summary:"]
            for r in problems:
                lines.append(f"\n {r.status.upper()}: {r.name}")
                lines.append(textwrap.indent(r.diagnostic or "(no diagnostic)", "    "))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"CheckReport({self.subject}: {self.passed} passed, {self.failed} failed, "
            f"{self.incomplete} incomplete, {self.skipped} skipped)"
        )


# -- building a report ----------------------------------------------------------------------------


class Outcome(Exception):
    """Raised (or returned) by a test body to end it with a status and a diagnostic."""

    def __init__(self, status: str, diagnostic: str = ""):
        super().__init__(diagnostic)
        self.status = status
        self.diagnostic = diagnostic


def passed(note: str = "") -> Outcome:
    return Outcome(PASSED, note)


def failed(diagnostic: str) -> Outcome:
    return Outcome(FAILED, diagnostic)


def incomplete(reason: str) -> Outcome:
    return Outcome(INCOMPLETE, reason)


def skipped(reason: str) -> Outcome:
    return Outcome(SKIPPED, reason)


class Recorder:
    """Runs test bodies, times them, and turns what they return or raise into results."""

    def __init__(self):
        self.results: list[CheckResult] = []
        self.start = time.perf_counter()

    def run(self, name: str, body, *args, **kwargs) -> CheckResult:
        """Run ``body``; it returns an `Outcome` (``None`` means Passed) or raises one.

        Any other exception fails the test, with the exception described.
        """
        start = time.perf_counter()
        try:
            outcome = body(*args, **kwargs)
        except Outcome as raised:
            outcome = raised
        except Exception as error:  # noqa: BLE001 - a user method raised: that is the finding
            outcome = failed(describe_exception(error))
        if outcome is None:
            outcome = passed()
        result = CheckResult(name, outcome.status, outcome.diagnostic, time.perf_counter() - start)
        self.results.append(result)
        return result

    def add(self, name: str, outcome: Outcome, *, duration: float = 0.0) -> CheckResult:
        """Record an outcome decided without running a body (``duration``: its share of time)."""
        result = CheckResult(name, outcome.status, outcome.diagnostic, duration)
        self.results.append(result)
        return result

    def report(self, subject: str, inputs: str, notes=()) -> CheckReport:
        return CheckReport(subject, inputs, self.results, time.perf_counter() - self.start, notes)


_LIBRARY_DIRS = (
    os.path.dirname(os.path.abspath(__file__)),
    os.path.dirname(os.path.abspath(jax.__file__)),
)


def describe_exception(error: BaseException) -> str:
    """``"ValueError: message (raised at my_layer.py:12, in predict)"``: the user's frame named."""
    message = str(error).strip()
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    frames = traceback.extract_tb(error.__traceback__)
    user = [
        f
        for f in frames
        if not os.path.abspath(f.filename).startswith(_LIBRARY_DIRS)
        and "site-packages" not in f.filename
    ]
    if user:
        frame = user[-1]
        text += f"\n(raised at {os.path.basename(frame.filename)}:{frame.lineno}, in {frame.name})"
    return text
