"""Rank 0 of a failed cell waits for its peers' reports
(harness.records.outcome.merge_rank_reports), but not for a peer it can see has ended without
one: every other worker leaves a presence file naming its process (its pid space, pid and start
time) as it starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import harness.records.outcome
from harness.records.outcome import merge_rank_reports
from harness.records.results import RunStatus, write_rank_report, write_worker_presence
from harness.system.processes import ended_here, this_process
from tests.helpers import REPO_ROOT


def _counted_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """From now on, the waits of merge_rank_reports counted instead of slept (on a clock of
    their own: this patches the time module, so after the subprocesses have run)."""
    waited: list[float] = []
    clock = [0.0]

    def sleep(seconds: float) -> None:
        waited.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(harness.records.outcome.time, "sleep", sleep)
    monkeypatch.setattr(harness.records.outcome.time, "monotonic", lambda: clock[0])
    return waited


def _ended_worker(output_dir: Path, rank: int, *, report: bool) -> None:
    """A worker process that wrote its presence (and maybe its report), then ended."""
    script = (
        "import sys; from pathlib import Path; "
        "from harness.system.processes import this_process; "
        "from harness.records.results import RunStatus, write_rank_report, "
        "write_worker_presence; "
        f"write_worker_presence(Path(sys.argv[1]), {rank}, this_process())"
        + (
            f"; write_rank_report(Path(sys.argv[1]), {rank}, RunStatus.oom, 'out of memory')"
            if report
            else ""
        )
    )
    subprocess.run(
        [sys.executable, "-c", script, str(output_dir)], cwd=REPO_ROOT, check=True, timeout=60
    )


def test_a_peer_seen_to_have_ended_without_a_report_is_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_rank_report(tmp_path, 0, RunStatus.failed, "connection closed by peer")
    _ended_worker(tmp_path, 1, report=False)
    _ended_worker(tmp_path, 2, report=True)
    sleeps = _counted_sleeps(monkeypatch)
    status, error = merge_rank_reports(tmp_path, 3, RunStatus.failed, "connection closed")
    assert sleeps == []
    assert status is RunStatus.oom  # rank 2's report, written before it ended, is read
    assert "--- rank 1: no report" in error and "--- rank 2: oom" in error


def test_a_peer_still_running_or_out_of_sight_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_rank_report(tmp_path, 0, RunStatus.failed, "connection closed by peer")
    write_worker_presence(tmp_path, 1, this_process())  # alive: this very process
    write_worker_presence(tmp_path, 2, {**this_process(), "pid_space": "another machine"})
    sleeps = _counted_sleeps(monkeypatch)
    status, error = merge_rank_reports(tmp_path, 4, RunStatus.failed, "x", wait_s=3)
    assert sum(sleeps) >= 3  # the whole wait: rank 1 runs, rank 2 and 3 cannot be seen
    assert status is RunStatus.failed and "--- rank 3: no report" in error


def test_a_process_is_ended_here_only_where_it_can_be_seen() -> None:
    me = this_process()
    assert not ended_here(me)
    assert ended_here({**me, "started": me["started"] - 1})  # its pid now names another
    assert not ended_here({**me, "pid_space": None})
    assert not ended_here({**me, "pid_space": "another machine", "started": 0.0})
