"""`python -m harness.sync [run.output_dir=...] [tracking.uri=...]`: upload the results that
MLflow did not get when they were measured.

A cell whose MLflow store was unreachable keeps its result.json with `pending_sync: true`.
This command finds those under the output root and records each in the configured store
(`tracking.uri`, else $MLFLOW_TRACKING_URI, else the SQLite store in the output root), in the
experiment the cell was run under, with the same artifacts as the cell's own upload
(config.yaml, result.json, and the MLPerf logs: mllog.txt, and mllog-<k>.txt for repeat k > 1).

A result stays pending until its run is complete in the store: killed at any point, this
command leaves nothing marked synced that is not. It is idempotent: a run carries the result's
identity (tag `distbench.result_id`); a complete run of the result is not uploaded again, only
noted in result.json, and a run of it that broke off half-way (RUNNING, or without its
result.json) is deleted and the result uploaded again. A result.json that cannot be read is
reported and counted as not synced. Sweep parent runs whose launcher was killed outright are
closed (KILLED) on the way.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.cli.arguments import overrides_of, overrides_parser
from harness.cli.bad_input import exit_on_bad_input
from harness.cli.errors import command
from harness.cli.preflight import expand_user
from harness.commands.compose import compose_or_exit
from harness.config.schema import ConfigError
from harness.records.mlflow_store import open_store, tracking_failure, tracking_uri
from harness.records.pending import sync_result
from harness.records.results import RESULT_FILE
from harness.records.sweep_runs import close_stale_parent_runs

log = logging.getLogger(__name__)


def result_files(output_root: Path) -> Iterator[Path]:
    """Every result.json under `output_root`, except MLflow's own copies of uploaded results
    (a SQLite store keeps its artifacts beside it, in mlartifacts/)."""
    root = Path(output_root)
    for path in sorted(root.rglob(RESULT_FILE)):
        if "mlartifacts" not in path.relative_to(root).parts:
            yield path


def read_record(path: Path) -> dict[str, Any]:
    """A result.json's content; ValueError if it is not a JSON object (e.g. truncated)."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    return data


def sync(output_root: Path, uri: str) -> int:
    """Sync every pending result under `output_root`; return how many could not be (an
    unreadable result.json counts as one)."""
    close_stale_parent_runs(uri)
    failures = 0
    for path in result_files(output_root):
        try:
            data = read_record(path)
        except (OSError, ValueError) as err:
            failures += 1
            print(
                f"distbench: could not sync {path}: not a readable result "
                f"({tracking_failure(err)})",
                file=sys.stderr,
            )
            continue
        if not data.get("pending_sync"):
            continue
        try:
            done, _ = sync_result(path, data, uri)
        except Exception as err:  # noqa: BLE001 - one line per result; the rest still syncs
            failures += 1
            print(
                f"distbench: could not sync {path.parent} ({tracking_failure(err)})",
                file=sys.stderr,
            )
            continue
        print(f"{path.parent}: {done}")
    return failures


@command
def check_reachable(uri: str) -> None:
    """Fail (one line naming tracking.uri, exit 3: harness.cli.errors.one_door) when the store
    cannot be opened or answer a query, even with nothing pending: "synced to" must mean it
    could."""
    client = open_store(uri)
    client.search_experiments(max_results=1)


def parser() -> argparse.ArgumentParser:
    return overrides_parser("python -m harness.sync", __doc__)


def main(argv: list[str] | None = None) -> int:
    config = compose_or_exit(overrides_of(parser(), argv))
    with exit_on_bad_input():
        root = expand_user("run.output_dir", config.run.output_dir)
        if not root.is_dir():
            # Nothing to sync from: "synced" would claim results were looked for.
            what = "it is a file" if root.exists() else "no such directory"
            raise ConfigError(
                f"run.output_dir={config.run.output_dir!r} is invalid: {what}; "
                f"allowed: the output root of earlier runs, whose pending "
                f"results are synced"
            )
    uri = tracking_uri(config.tracking.uri, config.run.output_dir)
    check_reachable(uri)
    failures = sync(Path(config.run.output_dir), uri)
    print(f"synced to {uri}" + (f"; {failures} result(s) not synced" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
