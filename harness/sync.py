"""`python -m harness.sync [run.output_dir=...] [tracking.uri=...]`: upload the results that
MLflow did not get when they were measured.

A cell whose MLflow store was unreachable keeps its result.json with `pending_sync: true`.
This command finds those under the output root and records each in the configured store
(`tracking.uri`, else $MLFLOW_TRACKING_URI, else the SQLite store in the output root), in the
experiment the cell was run under. It is idempotent: a result whose run is already in the store
(found by its `output_dir` tag) is not uploaded again, only marked as synced.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.compose import compose_or_exit
from harness.results import RESULT_FILE, CellResult, RepeatResult, RunStatus, write_result
from harness.tracking import _client, experiment_id, record_cell, recorded_run_id, \
    tracking_failure, tracking_uri

log = logging.getLogger(__name__)


def pending_results(output_root: Path) -> Iterator[Path]:
    """The result.json files under `output_root` that MLflow has not got yet."""
    for path in sorted(Path(output_root).rglob(RESULT_FILE)):
        if "mlartifacts" in path.parts:  # MLflow's own copies of uploaded results
            continue
        try:
            if json.loads(path.read_text()).get("pending_sync"):
                yield path
        except (OSError, ValueError):
            continue


def as_result(data: dict[str, Any]) -> CellResult:
    """A result.json's content as a CellResult (fields it does not know are left out)."""
    known = {field.name for field in dataclasses.fields(CellResult)}
    return CellResult(**{**{k: v for k, v in data.items() if k in known},
                         "status": RunStatus(data["status"]),
                         "repeats": [RepeatResult(**r) for r in data.get("repeats", [])]})


def sync_result(path: Path, uri: str) -> str:
    """Record one pending result in the store at `uri` unless it is there already; mark it
    synced; return what was done ("uploaded" or "already recorded")."""
    result = as_result(json.loads(path.read_text()))
    experiment = result.config["tracking"]["experiment"]
    client = _client(uri)
    run_id = recorded_run_id(client, experiment_id(client, experiment, uri), result.output_dir)
    done = "already recorded"
    if run_id is None:
        # The uploaded copy of result.json says synced; if the upload fails it is put back.
        failure = result.tracking_error
        result.pending_sync, result.tracking_error = False, None
        write_result(result)
        try:
            run_id = record_cell(result, uri=uri, experiment=experiment,
                                 artifacts=[path.parent / "config.yaml", path])
        except BaseException:
            result.pending_sync, result.tracking_error = True, failure
            write_result(result)
            raise
        done = "uploaded"
    result.mlflow_run_id, result.pending_sync, result.tracking_error = run_id, False, None
    write_result(result)
    return done


def sync(output_root: Path, uri: str) -> int:
    """Sync every pending result under `output_root`; return how many could not be."""
    failures = 0
    for path in pending_results(output_root):
        try:
            done = sync_result(path, uri)
        except Exception as err:  # noqa: BLE001 - one line per result; the rest still syncs
            failures += 1
            print(f"distbench: could not sync {path.parent} ({tracking_failure(err)})",
                  file=sys.stderr)
            continue
        print(f"{path.parent}: {done}")
    return failures


def main(argv: list[str]) -> int:
    config = compose_or_exit(argv)
    uri = tracking_uri(config.tracking.uri, config.run.output_dir)
    failures = sync(Path(config.run.output_dir), uri)
    print(f"synced to {uri}" + (f"; {failures} result(s) still pending" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
