"""What a sweep leaves in MLflow for a person to compare, checked on a real SQLite store without
a browser (tests/integration/test_mlflow_ui.py looks at the same through the UI): cell names that
tell the cells apart, each cell's run spanning its own training, the sweep's parent run ending with
a summary of the cells its table shows (reused ones included), experiments tagged to open on their
training runs in distbench's view.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.records.mlflow_store import (
    DEFAULT_STORE_FILE,
    EXPERIMENT_KIND_TAG,
    TRAINING_EXPERIMENT,
    VIEW_STATE,
    VIEW_TAG,
    experiment_id,
)
from harness.records.results import CellResult, RunStatus
from harness.records.sweep_runs import sweep_parent_run
from harness.records.sweep_summary import SweepSummary, mark_reused
from harness.records.tracking import record_cell


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the tests of this file (each uses its own experiment): creating
    its tables takes seconds."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / DEFAULT_STORE_FILE}"


def _name(*overrides: str) -> str:
    return validate(
        compose_config(
            ["dataset=mnist", "network=mobilenetv2", "distribution.batch_size=8", *overrides]
        )
    ).run_name


def test_cell_names_lead_with_what_tells_the_cells_apart() -> None:
    gpipe = ["distribution=gpipe", "hardware=local_2cpu"]
    # Two GPipe cells that differ only in micro-batches (they had one name).
    assert _name(*gpipe, "distribution.micro_batches=2") == "gpipe 1x2 mb2 b8 mobilenetv2-mnist"
    assert _name(*gpipe, "distribution.micro_batches=4") == "gpipe 1x2 mb4 b8 mobilenetv2-mnist"
    # Workers as nodes x workers per node; sequential trains on one, whatever the hardware.
    assert (
        _name("distribution=ddp", "hardware=local_2cpu", "hardware.nodes=2")
        == "ddp 2x2 b8 mobilenetv2-mnist"
    )
    assert (
        _name("distribution=sequential", "hardware=local_2cpu")
        == "sequential 1x1 b8 mobilenetv2-mnist"
    )
    # PipeDream's stage plan when one is given (else it is planned when the cell starts).
    assert (
        _name(
            "distribution=pipedream",
            "hardware=local_2cpu",
            "hardware.workers_per_node=3",
            "distribution.stages=2-1",
        )
        == "pipedream 1x3 st2-1 b8 mobilenetv2-mnist"
    )
    assert _name("tracking.run_name=mine") == "mine"


def _result(
    output_root: Path,
    name: str,
    status: RunStatus,
    seconds: float | None,
    started: str,
    finished: str,
) -> CellResult:
    """A cell's record as harness.worker.run writes it (the fields MLflow's copy is made of)."""
    metrics = (
        {} if seconds is None else {"seconds_per_epoch": seconds, "images_per_second": 16 / seconds}
    )
    return CellResult(
        status=status,
        run_name=name,
        output_dir=str(output_root / name),
        started_at=started,
        finished_at=finished,
        config={"distribution": {"name": name.split()[0]}},
        environment={},
        metrics=metrics,
        cell_key=name.replace(" ", "")[:16],
    )


def _ms(iso: str) -> int:
    return round(dt.datetime.fromisoformat(iso).timestamp() * 1000)


def test_a_cells_run_spans_its_training_and_its_experiment_opens_on_training_runs(
    output_root: Path, store: str
) -> None:
    uri = store
    started, finished = "2026-11-23T17:05:17.926+00:00", "2026-11-23T17:05:23.992+00:00"
    result = _result(
        output_root, "ddp 1x2 b8 mobilenetv2-mnist", RunStatus.ok, 2.5, started, finished
    )
    run_id = record_cell(result, uri=uri, experiment="runs", artifacts=[])

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert (run.info.start_time, run.info.end_time) == (_ms(started), _ms(finished))
    assert run.info.run_name == "ddp 1x2 b8 mobilenetv2-mnist"
    assert run.data.tags["distbench.kind"] == "cell"  # what distbench's view lists
    tags = client.get_experiment(run.info.experiment_id).tags
    assert tags[EXPERIMENT_KIND_TAG] == TRAINING_EXPERIMENT
    assert json.loads(tags[VIEW_TAG]) == VIEW_STATE


def test_an_existing_experiment_gets_the_tags_it_lacks(store: str) -> None:
    uri = store
    client = MlflowClient(uri)
    plain = client.create_experiment("older")  # as distbench made them before
    chosen = client.create_experiment("chosen", tags={EXPERIMENT_KIND_TAG: "finetuning"})
    assert experiment_id(client, "older", uri) == plain
    assert experiment_id(client, "chosen", uri) == chosen
    assert client.get_experiment(plain).tags[EXPERIMENT_KIND_TAG] == TRAINING_EXPERIMENT
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "finetuning"  # kept
    assert json.loads(client.get_experiment(chosen).tags[VIEW_TAG]) == VIEW_STATE


def test_the_sweeps_run_ends_with_its_outcome_and_summary(
    output_root: Path, store: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The summary is made of the records the launcher gathered, as its table is: a cell
    reused from an earlier run (not nested under this sweep's run) counts, and is the fastest
    here, marked so."""
    uri = store
    config = compose_config(
        [f"run.output_dir={output_root}", f"tracking.uri={uri}", "tracking.experiment=sweep"],
        with_hydra=True,
    )
    times = ("2026-11-23T17:05:00.000+00:00", "2026-11-23T17:05:09.000+00:00")
    cells = [
        ("gpipe 1x2 mb2 b8 mobilenetv2-mnist", RunStatus.ok, 2.5),
        ("gpipe 1x2 mb4 b8 mobilenetv2-mnist", RunStatus.ok, 1.5),
        ("gpipe 1x2 mb8 b8 mobilenetv2-mnist", RunStatus.oom, None),
    ]
    reused = mark_reused(
        _result(output_root, "ddp 1x2 b8 mobilenetv2-mnist", RunStatus.ok, 1.25, *times).to_dict()
    )
    results: list[dict] = [reused]  # as the launcher gathers them
    with (
        caplog.at_level(logging.INFO, logger="harness.records.sweep_runs"),
        sweep_parent_run(config, cells_to_run=len(cells), results=results) as parent_id,
    ):
        for name, status, seconds in cells:
            result = _result(output_root, name, status, seconds, *times)
            record_cell(result, uri=uri, experiment="sweep", artifacts=[])
            results.append(result.to_dict())

    parent = MlflowClient(uri).get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics == {
        "cells_ok": 3,
        "cells_failed": 1,
        "cells_reused": 1,
        "cells_interrupted": 0,
        "fastest_seconds_per_epoch": 1.25,
    }
    assert parent.data.tags["fastest_cell"] == "ddp 1x2 b8 mobilenetv2-mnist"
    summary = (
        "3 cell(s) ok (1 reused), 1 failed; fastest 'ddp 1x2 b8 mobilenetv2-mnist' at "
        "1.250 s/epoch (reused)"
    )
    assert SweepSummary.of(results).line() == summary  # the line under the launcher's table
    assert summary in parent.data.tags["mlflow.note.content"]  # the run page's description
    # The launcher says where to compare them: the store's runs table in distbench's view.
    assert summary in caplog.text
    assert (
        f"`mlflow ui --backend-store-uri {uri} --host 127.0.0.1`, then http://127.0.0.1:5000/#/experiments/"
        f"{parent.info.experiment_id}/runs?viewStateShareKey=distbench"
        f"&workflowType=machine_learning"
    ) in caplog.text
