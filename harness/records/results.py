"""The record of one grid cell, written atomically as result.json: the source of truth.

MLflow gets a copy; if MLflow is unreachable, result.json still holds everything.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from workloads.datasets.atomic import write_json_atomic

RESULT_FILE = "result.json"
# every repeat's MLPerf log in a cell directory (harness.records.eventlog)
MLLOG_GLOB = "mllog*.txt"

log = logging.getLogger(__name__)


class RunStatus(str, Enum):
    ok = "ok"
    oom = "oom"  # did not fit in memory: a result, not a crash
    failed = "failed"  # any other error; `error` holds the text
    timeout = "timeout"  # ended by the cell time limit
    diverged = "diverged"  # the loss became NaN or infinite; `error` says where
    interrupted = "interrupted"  # ended by SIGINT/SIGTERM; keeps the epochs it finished


@dataclass(frozen=True)
class RepeatResult:
    """One repeat of a cell's measurement (`run.repeats`)."""

    repeat: int  # from 0
    seed: int  # what seeded every RNG and the data order for this repeat
    seconds_per_epoch: float  # the mean of its epochs
    epoch_seconds: list[float]
    # The last evaluation's accuracy (0..1); None when run.eval is off.
    eval_accuracy: float | None = None
    # run.target_accuracy only: whether an evaluation reached it, and then MLPerf's score,
    # run_start to run_stop (training and evaluations), and the epochs it took.
    reached_target: bool | None = None
    time_to_target_s: float | None = None
    epochs_to_target: int | None = None


@dataclass
class CellResult:
    status: RunStatus
    run_name: str
    output_dir: str
    started_at: str  # ISO 8601, UTC
    finished_at: str
    config: dict[str, Any]  # the resolved config, batch size included
    environment: dict[str, str]
    metrics: dict[str, float] = field(default_factory=dict)
    epoch_seconds: list[float] = field(default_factory=list)  # every repeat's, in order
    repeats: list[RepeatResult] = field(default_factory=list)
    phase_seconds: dict[str, list[float]] = field(default_factory=dict)  # per phase, per epoch
    # Per epoch, every repeat's in order like epoch_seconds: the mean training loss of the
    # epoch's batches, and the evaluation after it (empty when run.eval is off).
    train_loss: list[float] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    eval_accuracy: list[float] = field(default_factory=list)
    error: str | None = None
    mlflow_run_id: str | None = None
    tracking_error: str | None = None  # why MLflow could not record it, if it could not
    # True while MLflow has not got this result (it was unreachable); `python -m harness.sync`
    # uploads it later and clears the flag.
    pending_sync: bool = False
    cell_key: str | None = None  # the cell's identity across re-runs (harness.records.resume)
    # Why the cell's directory could not take this record (a full or read-only disk), if it
    # could not: the record went to MLflow or a rescue directory instead (harness.records.record).
    storage_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data


def write_result(result: CellResult) -> Path:
    """Write `result` to <output_dir>/result.json atomically and return the path."""
    path = Path(result.output_dir) / RESULT_FILE
    write_json_atomic(path, result.to_dict())
    return path


def read_result(output_dir: Path) -> dict[str, Any]:
    return json.loads((Path(output_dir) / RESULT_FILE).read_text())


def rank_report_path(output_dir: Path, rank: int) -> Path:
    return Path(output_dir) / "ranks" / f"rank{rank}.json"


def write_rank_report(output_dir: Path, rank: int, status: RunStatus, error: str | None) -> None:
    """One worker's own account of how it ended: the channel that still works when the
    process group is broken (a peer crashed, hung or was killed). A disk that refuses it is
    logged, not raised: the cell is then recorded from what rank 0 and the launcher saw."""
    try:
        write_json_atomic(
            rank_report_path(output_dir, rank),
            {"rank": rank, "status": status.value, "error": error},
        )
    except OSError as err:
        log.warning("could not write the report of rank %d in %s (%s)", rank, output_dir, err)


def worker_presence_path(output_dir: Path, rank: int) -> Path:
    return Path(output_dir) / "ranks" / f"worker{rank}.json"


def write_worker_presence(output_dir: Path, rank: int, process: dict[str, Any]) -> None:
    """Which process a worker is (`process`: its machine's boot id, pid and start time), written
    as it starts: rank 0, waiting for the reports of a failed cell, stops waiting for a peer
    it can see has ended without one (harness.records.outcome.merge_rank_reports). Best effort, as
    the reports are."""
    try:
        write_json_atomic(worker_presence_path(output_dir, rank), {"rank": rank, **process})
    except OSError as err:
        log.warning("could not write the presence of rank %d in %s (%s)", rank, output_dir, err)


def read_worker_presence(output_dir: Path, rank: int) -> dict[str, Any] | None:
    try:
        found = json.loads(worker_presence_path(output_dir, rank).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def group_formed_path(output_dir: Path) -> Path:
    return Path(output_dir) / "ranks" / "group_formed.json"


def write_group_formed(output_dir: Path, world_size: int) -> None:
    """Written by rank 0 once the cell's process group has formed: from then on a worker that
    dies breaks a collective and rank 0 records the cell itself, with what it measured. Before,
    the others wait at the rendezvous for the dead one, and the launcher, which sees this file
    missing, ends the cell at once instead (`launchers.local.wait_for_cell`). Best effort: a
    disk that refuses it leaves the launcher waiting, as it did without it."""
    try:
        write_json_atomic(group_formed_path(output_dir), {"world_size": world_size})
    except OSError as err:
        log.warning("could not note the process group's forming in %s (%s)", output_dir, err)


def group_formed(output_dir: Path) -> bool:
    """Whether rank 0 noted that the cell's process group formed (`write_group_formed`)."""
    return group_formed_path(output_dir).exists()


def read_rank_reports(output_dir: Path) -> dict[int, dict[str, Any]]:
    """The reports the workers of a cell left, by rank."""
    reports = {}
    for path in sorted((Path(output_dir) / "ranks").glob("rank*.json")):
        report = json.loads(path.read_text())
        reports[int(report["rank"])] = report
    return reports
