"""The suite says at its end when it took longer than its time budget on CI: whoever adds the test
that crosses it sees it in the run that crossed it."""

from __future__ import annotations

import time

import pytest

from tests import conftest
from tests.helpers import REPO_ROOT


class _Reporter:
    """What pytest's terminal reporter is asked for."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_sep(self, sep: str, title: str, **markup: bool) -> None:
        self.lines.append(title)

    def write_line(self, line: str, **markup: bool) -> None:
        self.lines.append(line)


def test_a_suite_over_its_budget_says_so_and_one_within_says_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reporter = _Reporter()
    monkeypatch.setattr(conftest, "_SUITE_STARTED", time.monotonic() - conftest.SUITE_BUDGET_S - 90)
    conftest.pytest_terminal_summary(reporter)  # type: ignore[arg-type]
    assert reporter.lines[0] == "over the suite's time budget"
    budget_min = conftest.SUITE_BUDGET_S / 60
    took = f"took {budget_min + 1.5:.1f} min, over the suite's budget of {budget_min:.0f} min"
    assert took in reporter.lines[1]
    within = _Reporter()
    monkeypatch.setattr(conftest, "_SUITE_STARTED", time.monotonic())
    conftest.pytest_terminal_summary(within)  # type: ignore[arg-type]
    assert within.lines == []


def test_the_modules_the_suite_orders_by_name_exist() -> None:
    """A module renamed or moved would silently lose its place in the order (tests/conftest.py:
    the cluster modules in one process, the longest modules first)."""
    named = (*conftest.CLUSTER_MODULES, *conftest.LONGEST_MODULES)
    assert [name for name in named if not (REPO_ROOT / name).is_file()] == []
