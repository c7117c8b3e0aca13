"""A result MLflow has not got yet, recorded there once.

A cell's result.json says `pending_sync: true` until MLflow holds its run (harness.records.record):
its store was unreachable when the cell ended, or the local launcher waiting on the cell
records it (`LAUNCHER_RECORDS_ENV`: the launcher holds the store open already, where the cell's
rank 0 would import MLflow and open the store for that one upload, seconds of every cell).
`sync_result` records such a result, with the same artifacts as a cell's own upload, unless a
complete run of it is there already (a run carries the result's identity, tag
`distbench.result_id`; one that broke off half-way is deleted and the result uploaded again),
and only then marks it synced. `harness.sync` calls it for every pending result under an output
root; a local launcher, for the cell that has just ended.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.records.mlflow_store import experiment_id, open_store, tracking_failure
from harness.records.record import staged_artifacts
from harness.records.results import RESULT_FILE, CellResult, RepeatResult, RunStatus, read_result
from harness.records.tracking import record_cell, recorded_run_id
from workloads.datasets.atomic import write_json_atomic

log = logging.getLogger(__name__)


def as_result(data: dict[str, Any]) -> CellResult:
    """A result.json's content as a CellResult (fields it does not know are left out)."""
    known = {field.name for field in dataclasses.fields(CellResult)}
    return CellResult(
        **{
            **{k: v for k, v in data.items() if k in known},
            "status": RunStatus(data["status"]),
            "repeats": [RepeatResult(**r) for r in data.get("repeats", [])],
        }
    )


class SyncBusy(RuntimeError):
    """Another `harness.sync` is uploading this result right now."""


@contextlib.contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """Hold the cell's directory (flock) while its result is looked up and uploaded, so that
    two syncs of the same output root do not take each other's upload for one that broke
    off."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SyncBusy("another harness.sync is uploading it") from None
        yield
    finally:
        os.close(fd)  # releases the lock


def sync_result(path: Path, data: dict[str, Any], uri: str) -> tuple[str, dict[str, Any]]:
    """Record the pending result `data` (read from `path`) in the store at `uri` unless a
    complete run of it is there already; only then mark it synced; return what was done
    ("uploaded" or "already recorded") and the record as written to `path`."""
    result = as_result(data)
    experiment = result.config["tracking"]["experiment"]
    with _exclusive(path.parent):
        client = open_store(uri)
        run_id = recorded_run_id(client, experiment_id(client, experiment, uri), result)
        done = "already recorded"
        if run_id is None:
            # The same files as a cell's own upload (harness.records.record).
            with staged_artifacts(data, path.parent) as artifacts:
                run_id = record_cell(result, uri=uri, experiment=experiment, artifacts=artifacts)
            done = "uploaded"
        # Written to `path` itself, which may not be result.output_dir (a rescued record), and
        # with every field it had, known to this version or not.
        synced = {**data, "mlflow_run_id": run_id, "pending_sync": False, "tracking_error": None}
        write_json_atomic(path, synced)
    return done, synced


def record_pending(output_dir: Path, uri: str) -> dict[str, Any]:
    """Record the pending result in `output_dir` (a cell that has just ended, whose rank 0
    left its upload to this process) in the store at `uri`, as rank 0 would have: on failure
    it stays pending for `python -m harness.sync`, with the reason in its `tracking_error` and
    one warning. Returns the result as it now reads."""
    path = Path(output_dir) / RESULT_FILE
    data = read_result(output_dir)
    log.info("recording the cell in MLflow at %s", uri)
    try:
        _, recorded = sync_result(path, data, uri)
        where = f"{recorded['mlflow_run_id']} at {uri}"
    except Exception as err:  # noqa: BLE001 - the record stays pending for harness.sync
        reason = tracking_failure(err)
        log.warning(
            "MLflow could not record %s (%s); result kept in %s, pending `python -m harness.sync`",
            data.get("run_name"),
            reason,
            path,
        )
        recorded, where = {**data, "tracking_error": reason}, "pending sync"
        write_json_atomic(path, recorded)
    log.info("result: %s; MLflow run %s", path, where)
    return recorded
