"""A cell's outcome when it did not end `ok`: its status from every worker's report, and its
record when its own process could not write one (killed, timed out, crashed outside Python).
Rank 0 merges its peers' reports here; a launcher whose cell left no result records it here.
Imported by the launchers: nothing here loads torch until a record is written."""

from __future__ import annotations

import copy
import datetime as dt
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.records.cell import CheckedCell
from harness.records.record import record
from harness.records.results import CellResult, RunStatus, read_rank_reports, read_worker_presence
from harness.system.processes import ended_here

if TYPE_CHECKING:
    import torch


def merge_rank_reports(
    output_dir: Path, world_size: int, status: RunStatus, error: str | None, wait_s: float = 10.0
) -> tuple[RunStatus, str]:
    """Rank 0's view of a failed cell, completed with what the other workers reported.

    A peer that failed writes its report before it exits, which is what breaks rank 0's
    collectives; a short wait covers the rest, but not for a peer seen to have ended without
    one (killed by a signal: its presence file names its process, `ended_here`). The root
    cause is the first failure that is not merely a consequence (a broken connection, a
    timed-out collective) of another.
    """
    deadline = time.monotonic() + wait_s
    reports = read_rank_reports(output_dir)
    while True:
        # seen gone before the reports are read again: a peer writes its report before it ends
        gone = {
            rank
            for rank in range(world_size)
            if rank not in reports and _ended(read_worker_presence(output_dir, rank))
        }
        reports = read_rank_reports(output_dir)
        awaited = [rank for rank in range(world_size) if rank not in reports and rank not in gone]
        if not awaited or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    status, lines = summarize_rank_reports(reports, world_size, status)
    if status is RunStatus.oom:  # headed by the first line of the (first) rank that ran out
        first = next(
            (
                r["error"]
                for _, r in sorted(reports.items())
                if r["status"] == RunStatus.oom.value and r["error"]
            ),
            None,
        )
        lines.insert(0, (first or error or "out of memory").splitlines()[0])
    return status, "\n".join(lines)


def _ended(presence: dict[str, Any] | None) -> bool:
    return presence is not None and ended_here(presence)


def summarize_rank_reports(
    reports: dict[int, dict[str, Any]], world_size: int, status: RunStatus
) -> tuple[RunStatus, list[str]]:
    """The cell's status from its workers' reports (a diverged loss, else a timeout, else an
    oom, outranks `status`: the others' failures follow from it) and one section per rank, a
    missing report said so. Rank 0 (merge_rank_reports) and a launcher whose cell left no
    result both summarise so."""
    statuses = {RunStatus(report["status"]) for report in reports.values()}
    # diverged last: a worker whose loss diverged stops, and its peers' failures follow.
    for candidate in (RunStatus.oom, RunStatus.timeout, RunStatus.diverged):
        if candidate in statuses:
            status = candidate
    lines = []
    for rank in range(max([world_size, *(rank + 1 for rank in reports)])):
        report = reports.get(rank)
        lines.append(
            f"--- rank {rank}: "
            + (
                f"{report['status']}\n{report['error']}"
                if report
                else "no report (killed by a signal, or crashed outside Python)"
            )
        )
    return status, lines


def record_failure(
    cell: CheckedCell, output_dir: Path, status: RunStatus, error: str, started: str | None = None
) -> dict[str, Any]:
    """Record a cell whose process could not record itself (killed, timed out, crashed hard)."""
    import torch  # the record's environment names the CPU (and torch's version)

    result = new_result(cell, output_dir, started or now(), torch.device("cpu"), status, error)
    record(result, cell.config)
    return result.to_dict()


def new_result(
    cell: CheckedCell,
    output_dir: Path,
    started: str,
    device: torch.device,
    status: RunStatus,
    error: str | None,
) -> CellResult:
    """A cell's record before (or without) its measurement: its resolved config, the machine it
    ran on, its status and error."""
    from harness.runtime.environment import (
        capture_environment,  # torch's facts: a worker's, or asked
    )

    resolved = copy.deepcopy(cell.resolved)  # the record's own: the measurement adds to it
    resolved["distribution"]["batch_size"] = cell.config.batch_size  # what Table 3.3 resolved to
    return CellResult(
        status=status,
        run_name=cell.config.run_name,
        output_dir=str(output_dir.resolve()),
        started_at=started,
        finished_at=now(),
        config=resolved,
        environment=capture_environment(device),
        error=error,
        cell_key=cell.key,
    )


def now() -> str:
    # Milliseconds: MLflow shows the cell's run from started_at to finished_at (its Duration).
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
