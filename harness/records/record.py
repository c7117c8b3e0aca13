"""Where a cell's record goes, and where it goes when a store refuses it.

A cell's record is its result.json (the source of truth), the config.yaml beside it, its MLPerf
event log, a copy in MLflow and an index entry (harness.records.resume). The measurement must
outlive any one of those stores: a disk that fills up or turns read-only mid-cell, an MLflow server
that is down. So:

- files in the cell's directory are written atomically (never an empty or partial file);
- result.json says `pending_sync: true` until MLflow has the run, so an interruption anywhere
  in between leaves it for `harness.sync` (which finds an existing run by the result's identity
  instead of uploading it twice);
- the cell's process uploads MLflow's copy, unless a local launcher waits on the cell: it holds
  the store open already, so rank 0 leaves the upload to it (`LAUNCHER_RECORDS_ENV`,
  harness.records.pending) and the cell ends seconds sooner;
- MLflow's copy is uploaded from a staging directory, so it does not depend on the cell's
  directory being writable, and carries the event logs kept in memory (harness.records.eventlog: one
  per repeat, mllog.txt, mllog-2.txt, ...);
- if the cell's directory could not take the record, one line on stderr says why and where
  the record is: MLflow, else a rescue directory under the system's temporary directory (from
  which `harness.sync run.output_dir=<it>` uploads it later), else stdout.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from omegaconf import OmegaConf

from harness.config.schema import DistbenchConfig
from harness.measure.spread import spread_text
from harness.measure.steadiness import unsteady_note
from harness.records.mlflow_store import tracking_failure, tracking_uri
from harness.records.results import MLLOG_GLOB, RESULT_FILE, CellResult, RunStatus, write_result
from harness.records.resume import index_result
from harness.records.tracking import record_cell
from workloads.datasets.atomic import write_text_atomic

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
# Where a record goes when neither its directory nor MLflow takes it.
RESCUE_DIR = "distbench-rescued"
# Set to 1 by a local launcher for the workers of a cell it waits on: rank 0 then leaves the
# cell's MLflow upload to it (harness.records.pending.record_pending), which holds the store open
# already; rank 0 would import MLflow and open the store for that one upload.
LAUNCHER_RECORDS_ENV = "DISTBENCH_LAUNCHER_RECORDS"


EventLogs = Mapping[str, str]  # the cell's MLPerf logs kept in memory: file name -> text


def record(
    result: CellResult,
    config: DistbenchConfig,
    event_logs: EventLogs | None = None,
) -> None:
    """Record a finished (or failed) cell everywhere it can go; sets `result.mlflow_run_id`,
    `tracking_error`, `pending_sync` and, when the cell's directory refused it,
    `storage_error`. `event_logs`: the cell's MLPerf logs as EventLog.text() kept them."""
    tracked = config.tracking.enabled
    result.pending_sync = tracked  # until MLflow has the run
    unsaved = _write_files(result)
    if unsaved is not None:  # said in MLflow's copy too: a launcher finds the record there
        result.storage_error = _one_line(unsaved)
    uri = tracking_uri(config.tracking.uri, config.run.output_dir) if tracked else None
    left_to_launcher = uri is not None and unsaved is None and _launcher_records(result, event_logs)
    if left_to_launcher:
        log.info(
            "recording the cell: its launcher uploads it to MLflow at %s once its "
            "workers have ended",
            uri,
        )
    elif uri is not None:  # seconds, more for a store that is created now
        log.info("recording the cell in MLflow at %s", uri)
        _upload(result, uri, config.tracking.experiment, event_logs)
    if unsaved is None:
        try:  # again, now with the run id or the reason MLflow could not take it
            write_result(result)
            if result.cell_key is not None:  # a keyless result has no index entry to point at
                index_result(config.run.output_dir, result.cell_key, result.to_dict())
        except OSError as err:
            unsaved = err
            result.storage_error = _one_line(err)
    if unsaved is not None:
        _say(f"distbench: {_where_it_went(result, uri, event_logs)}", sys.stderr)
    _log_summary(result, uri, left_to_launcher=left_to_launcher)


def _launcher_records(result: CellResult, event_logs: EventLogs | None) -> bool:
    """Whether the local launcher waiting on this cell records it in MLflow
    (`LAUNCHER_RECORDS_ENV`, harness.records.pending): only from a record whose every file is in the
    cell's directory, where the launcher reads them; else this process uploads it."""
    if os.environ.get(LAUNCHER_RECORDS_ENV) != "1":
        return False
    folder = Path(result.output_dir)
    try:
        return all(
            (folder / name).read_text() == text for name, text in (event_logs or {}).items() if text
        )
    except OSError:
        return False


def keep_logging_when_the_disk_fails() -> None:
    """A disk that fills up or turns read-only mid-cell must not end the cell through its log
    files: logging prints a traceback for every line a FileHandler cannot write, and raises
    when one (re)opens its file lazily (Hydra's job log does). Such lines are dropped instead;
    the console keeps them, and the cell's record reports the disk once."""
    logging.raiseExceptions = False  # a failed write: handleError stays silent
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and not hasattr(handler, "_distbench_emit"):
            handler._distbench_emit = handler.emit  # type: ignore[attr-defined]
            handler.emit = functools.partial(_emit_or_drop, handler)  # type: ignore[method-assign]


def _emit_or_drop(handler: logging.FileHandler, record: logging.LogRecord) -> None:
    try:
        handler._distbench_emit(record)  # type: ignore[attr-defined]
    except OSError:
        handler.handleError(record)


def _write_files(result: CellResult) -> OSError | None:
    """config.yaml and result.json in the cell's directory (the event logs are already there
    unless the disk refused them); the error if the directory refused them."""
    output_dir = Path(result.output_dir)
    try:
        write_text_atomic(output_dir / CONFIG_FILE, OmegaConf.to_yaml(result.config))
        write_result(result)
    except OSError as err:
        log.debug("could not write the record in %s", output_dir, exc_info=True)
        return err
    return None


def _upload(
    result: CellResult,
    uri: str,
    experiment: str,
    event_logs: EventLogs | None,
) -> None:
    try:
        with staged_artifacts(result.to_dict(), Path(result.output_dir), event_logs) as artifacts:
            result.mlflow_run_id = record_cell(
                result, uri=uri, experiment=experiment, artifacts=artifacts
            )
    except Exception as err:  # noqa: BLE001 - the record stays pending for harness.sync
        result.tracking_error = tracking_failure(err)
        log.warning(
            "MLflow could not record %s (%s); result kept in %s, pending `python -m harness.sync`",
            result.run_name,
            result.tracking_error,
            Path(result.output_dir) / RESULT_FILE,
        )
        return
    result.pending_sync, result.tracking_error = False, None


@contextlib.contextmanager
def staged_artifacts(
    data: dict[str, Any], source_dir: Path, event_logs: EventLogs | None = None
) -> Iterator[list[Path]]:
    """The record `data` (a result.json's content) as its MLflow run keeps it, in a staging
    directory: result.json as it reads once the run is in the store (not pending, no tracking
    error, no run id), config.yaml, the event logs (`event_logs`, else `source_dir`'s). None
    if even the temporary directory refuses them (the run still has every param, metric,
    tag)."""
    try:
        staging = tempfile.TemporaryDirectory(prefix="distbench-record-")
    except OSError:
        yield []
        return
    with staging as folder:
        try:
            files = write_record_files(
                Path(folder),
                {**data, "pending_sync": False, "tracking_error": None, "mlflow_run_id": None},
                source_dir,
                event_logs,
            )
        except OSError:
            files = []
        yield files


def write_record_files(
    folder: Path, data: dict[str, Any], source_dir: Path, event_logs: EventLogs | None = None
) -> list[Path]:
    """The record's files in `folder`: result.json holding `data`, config.yaml from its config,
    the MLPerf logs, one per repeat (`event_logs`, else those in `source_dir`, if any)."""
    files = {
        CONFIG_FILE: OmegaConf.to_yaml(data["config"]),
        RESULT_FILE: json.dumps(data, indent=2, sort_keys=True, default=str) + "\n",
    }
    logs = event_logs if event_logs is not None else _read_logs(source_dir)
    files.update({name: text for name, text in logs.items() if text})
    for name, text in files.items():
        write_text_atomic(folder / name, text)
    return [folder / name for name in files]


def _read_logs(folder: Path) -> dict[str, str]:
    """The MLPerf logs in `folder` that can be read, by file name."""
    logs = {}
    try:
        paths = sorted(folder.glob(MLLOG_GLOB))
    except OSError:
        return {}
    for path in paths:
        try:
            logs[path.name] = path.read_text()
        except OSError:
            continue
    return logs


def _where_it_went(result: CellResult, uri: str | None, event_logs: EventLogs | None) -> str:
    """The one line for a record its directory refused, after putting it where it can go."""
    refused = f"could not write {Path(result.output_dir) / RESULT_FILE} ({result.storage_error})"
    if result.mlflow_run_id is not None:
        return f"{refused}; the result is in MLflow run {result.mlflow_run_id} at {uri}"
    rescue = Path(tempfile.gettempdir()) / RESCUE_DIR / Path(result.output_dir).name
    try:
        write_record_files(rescue, result.to_dict(), Path(result.output_dir), event_logs)
    except OSError:
        _say(json.dumps(result.to_dict(), sort_keys=True, default=str), sys.stdout)
        return f"{refused}, nor anywhere else; the result is printed on stdout"
    sync = (
        f"; `python -m harness.sync run.output_dir={rescue.parent}` uploads it to MLflow"
        if result.pending_sync
        else ""
    )
    return f"{refused}; the result is in {rescue / RESULT_FILE}{sync}"


def _say(line: str, stream: TextIO) -> None:
    """Print `line`, unless the stream is a file on the very disk that refused the record
    (a worker's log under its cell's directory)."""
    try:
        print(line, file=stream, flush=True)
    except OSError:
        pass


def _one_line(err: OSError) -> str:
    return f"{type(err).__name__}: {err.strerror or err}"


def _log_quality(result: CellResult) -> None:
    """The summary's second line: what the training reached (run.eval, run.target_accuracy)."""
    metrics = result.metrics
    if "eval_accuracy" in metrics:
        log.info(
            "%s: eval accuracy %.4f, eval loss %.4f after the last epoch",
            result.run_name,
            metrics["eval_accuracy"],
            metrics["eval_loss"],
        )
    if metrics.get("reached_target"):
        log.info(
            "%s: reached the target accuracy in %.2f s (run_start to run_stop), %.1f epoch(s)",
            result.run_name,
            metrics["time_to_target_s"],
            metrics["epochs_to_target"],
        )
    elif "reached_target" in metrics:
        log.info(
            "%s: did not reach the target accuracy %s in %d epoch(s) (status stays ok)",
            result.run_name,
            result.config["run"]["target_accuracy"],
            result.config["run"]["epochs"],
        )


def _log_summary(
    result: CellResult,
    uri: str | None,
    *,
    left_to_launcher: bool = False,
) -> None:
    if result.status is RunStatus.ok:
        metrics = result.metrics
        tokens = metrics.get("tokens_per_second", metrics["images_per_second"])
        throughput = (
            f"{metrics['images_per_second']:.1f} images/s"
            if tokens == metrics["images_per_second"]  # images: one per sample
            else f"{metrics['images_per_second']:.1f} samples/s, {tokens:.0f} tokens/s"
        )
        workers = int(metrics.get("world_size", 1))
        # One epoch time per cell: its slowest worker's (a worker's own log shows its own).
        rule = f", the slowest of {workers} workers'" if workers > 1 else ""
        log.info(
            "%s: %.3f s/epoch%s (%s), %s, peak memory %.0f MB%s",
            result.run_name,
            metrics["seconds_per_epoch"],
            rule,
            spread_text(metrics),
            throughput,
            metrics["peak_memory_mb"],
            unsteady_note(metrics, result.environment.get("steadiness")),
        )
        _log_quality(result)
    if uri is None:
        where = "off (tracking.enabled=false)"
    elif left_to_launcher:
        where = "to come: the launcher records it"
    else:
        where = "pending sync" if result.pending_sync else f"{result.mlflow_run_id} at {uri}"
    log.info("result: %s/result.json; MLflow run %s", result.output_dir, where)
