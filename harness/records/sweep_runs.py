"""A sweep's MLflow parent run: opened by the launcher once it knows some cell will run, the
cells' runs nested under it, closed however the launcher ends, with a summary of its cells
(ok, failed, reused, fastest: `harness.records.sweep_summary`, of the same records as the
launcher's table). One whose launcher was killed outright is closed as KILLED by the next
sweep or sync that can prove the launcher is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from harness.records.mlflow_store import (
    KIND_TAG,
    SWEEP_KIND,
    experiment_id,
    experiment_link,
    open_store,
    store_not_created,
    tracking_failure,
    tracking_uri,
)
from harness.records.sweep_summary import SweepSummary
from harness.system.processes import start_time

log = logging.getLogger(__name__)

# The sweep's parent run id reaches every cell through the environment, which submitit's local
# and SLURM executors pass on to the jobs they start.
PARENT_RUN_ENV = "DISTBENCH_PARENT_RUN_ID"
# Who launched a sweep's parent run (host, pid, the pid's start time and the host's boot), so
# that a later process can tell that the launcher is gone.
LAUNCHER_HOST_TAG = "distbench.launcher_host"
LAUNCHER_PID_TAG = "distbench.launcher_pid"
LAUNCHER_START_TAG = "distbench.launcher_start"
LAUNCHER_BOOT_TAG = "distbench.launcher_boot"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
# A sweep's parent run, once its cells have run: how many ended ok (reused ones included) and
# how many did not, how many were reused from earlier runs, and the fastest (its run name as a
# tag, its seconds per epoch as a metric).
CELLS_OK_METRIC = "cells_ok"
CELLS_FAILED_METRIC = "cells_failed"
CELLS_INTERRUPTED_METRIC = "cells_interrupted"
CELLS_REUSED_METRIC = "cells_reused"
FASTEST_CELL_TAG = "fastest_cell"
FASTEST_SECONDS_METRIC = "fastest_seconds_per_epoch"


@contextlib.contextmanager
def sweep_parent_run(
    config: DictConfig, *, cells_to_run: int, results: Collection[Mapping[str, Any]] = ()
) -> Iterator[str | None]:
    """The sweep's parent run, open while its cells run (they nest under it through
    PARENT_RUN_ENV, which submitit's local and SLURM executors pass on to the jobs), closed
    when the block ends: FINISHED, FAILED on an exception, KILLED on Ctrl-C or an exit.

    `results` is the collection of cell records the launcher fills meanwhile, reused cells
    included, and prints its summary table from: the run's summary is made of it when the run
    closes (`SweepSummary`), so the two agree. (The cells nested under the run are only those
    that ran in this launch.)

    Opened by a launcher after every cell was validated and only if `cells_to_run` > 0, so a
    rejected sweep, or a re-run whose every cell finished earlier, leaves no empty run (and no
    store file). Parent runs left RUNNING by a launcher that was killed outright are closed
    first. If MLflow cannot be reached the sweep still runs (every cell writes result.json);
    its cells are then simply not nested.
    """
    if not config.tracking.enabled:
        yield None
        return
    uri = tracking_uri(config.tracking.uri, config.run.output_dir)
    close_stale_parent_runs(uri)
    run_id = _open_parent_run(config, uri) if cells_to_run > 0 else None
    if run_id is None:
        yield None
        return
    previous = os.environ.get(PARENT_RUN_ENV)
    os.environ[PARENT_RUN_ENV] = run_id
    status = "KILLED"  # unless the block ends normally or raises an Exception
    try:
        yield run_id
        status = "FINISHED"
    except Exception:
        status = "FAILED"
        raise
    finally:
        if previous is None:
            os.environ.pop(PARENT_RUN_ENV, None)
        else:
            os.environ[PARENT_RUN_ENV] = previous
        _close_parent_run(uri, run_id, status, SweepSummary.of(results))


def _close_parent_run(uri: str, run_id: str, status: str, summary: SweepSummary) -> None:
    """End the sweep's parent run with its outcome and the summary of its cells, and say
    where to compare them. A summary that fails is logged; the run is closed all the same."""
    experiment = None
    try:
        client = open_store(uri)
        experiment = client.get_run(run_id).info.experiment_id
        _log_summary(client, run_id, summary)
    except Exception as err:  # noqa: BLE001 - the cells' runs hold it all anyway
        log.warning(
            "could not summarize the sweep in its MLflow run %s (%s)", run_id, tracking_failure(err)
        )
    try:
        open_store(uri).set_terminated(run_id, status=status)
    except Exception as err:  # noqa: BLE001 - the next sweep or sync closes it
        log.warning("could not close the sweep's MLflow run %s (%s)", run_id, tracking_failure(err))
        return
    if experiment is not None:
        serve = (
            ""
            if uri.startswith(("http://", "https://"))
            else f"`mlflow ui --backend-store-uri {uri} --host 127.0.0.1`, then "
        )
        log.info(
            "MLflow: sweep run %s %s: %s. Compare the cells: %s%s",
            run_id,
            status,
            summary.line(),
            serve,
            experiment_link(uri, experiment),
        )


def _log_summary(client: Any, run_id: str, summary: SweepSummary) -> None:
    """The summary on the parent run: metrics and tags (columns of the runs table), and its
    description (the run's page)."""
    from mlflow.entities import Metric, RunTag

    timestamp = int(time.time() * 1000)
    metrics = [
        Metric(CELLS_OK_METRIC, summary.cells_ok, timestamp, 0),
        Metric(CELLS_FAILED_METRIC, summary.cells_failed, timestamp, 0),
        Metric(CELLS_REUSED_METRIC, summary.cells_reused, timestamp, 0),
        Metric(CELLS_INTERRUPTED_METRIC, summary.cells_interrupted, timestamp, 0),
    ]
    tags = [RunTag("mlflow.note.content", f"Sweep: {summary.line()}.")]
    if summary.fastest is not None:
        metrics.append(Metric(FASTEST_SECONDS_METRIC, summary.fastest[1], timestamp, 0))
        tags.append(RunTag(FASTEST_CELL_TAG, summary.fastest[0]))
    client.log_batch(run_id, metrics=metrics, tags=tags)


def _open_parent_run(config: DictConfig, uri: str) -> str | None:
    sweep_dir = Path(str(config.hydra.sweep.dir))
    try:
        client = open_store(uri)
        run = client.create_run(
            experiment_id(client, config.tracking.experiment, uri),
            run_name=f"sweep-{sweep_dir.name}",
            tags={
                "sweep_dir": str(sweep_dir.resolve()),
                "sweep_overrides": " ".join(config.hydra.overrides.task),
                KIND_TAG: SWEEP_KIND,
                **_launcher_tags(),
            },
        )
    except Exception as err:  # noqa: BLE001 - tracking must never stop a sweep
        log.warning(
            "MLflow unreachable at %s (%s); cells will not be nested", uri, tracking_failure(err)
        )
        return None
    log.info(
        "MLflow: sweep parent run %s in experiment %r at %s",
        run.info.run_id,
        config.tracking.experiment,
        uri,
    )
    return run.info.run_id


def _launcher_tags() -> dict[str, str]:
    tags = {
        LAUNCHER_HOST_TAG: socket.gethostname(),
        LAUNCHER_PID_TAG: str(os.getpid()),
        LAUNCHER_START_TAG: str(start_time(os.getpid())),
    }
    boot = _boot_id()
    if boot is not None:
        tags[LAUNCHER_BOOT_TAG] = boot
    return tags


def _boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return None


def launcher_gone(tags: Mapping[str, str]) -> bool:
    """True if the process that launched a parent run provably no longer runs: it ran on this
    host and either the host has rebooted since or its pid is free or taken by a process that
    started at another time. A launcher on another host, or one that left no such tags (older
    runs), cannot be proved gone."""
    if (
        tags.get(LAUNCHER_HOST_TAG) != socket.gethostname()
        or LAUNCHER_PID_TAG not in tags
        or LAUNCHER_START_TAG not in tags
    ):
        return False
    boot = _boot_id()
    if boot is not None and tags.get(LAUNCHER_BOOT_TAG, boot) != boot:
        return True
    return str(start_time(int(tags[LAUNCHER_PID_TAG]))) != tags[LAUNCHER_START_TAG]


def close_stale_parent_runs(uri: str) -> list[str]:
    """Close, as KILLED, every sweep parent run in the store at `uri` that is still RUNNING
    although its launcher is provably gone (killed with SIGKILL, or its host rebooted: no
    finally-block ran); return their ids. A store that does not exist yet is not created; a
    store that cannot be reached is logged and left alone."""
    if store_not_created(uri):
        return []
    closed = []
    try:
        client = open_store(uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        for start in range(0, len(experiments), 100):  # search_runs takes up to 100
            for run in client.search_runs(
                experiments[start : start + 100],
                max_results=1000,
                filter_string=(
                    f"tags.`{KIND_TAG}` = '{SWEEP_KIND}' and attributes.status = 'RUNNING'"
                ),
            ):
                if launcher_gone(run.data.tags):
                    client.set_terminated(run.info.run_id, status="KILLED")
                    closed.append(run.info.run_id)
                    log.warning(
                        "MLflow: closed sweep run %s as KILLED: its launcher (pid %s) is gone",
                        run.info.run_id,
                        run.data.tags[LAUNCHER_PID_TAG],
                    )
    except Exception as err:  # noqa: BLE001 - tidying must never stop a sweep or a sync
        log.warning("could not check %s for sweep runs left open (%s)", uri, tracking_failure(err))
    return closed
