"""Resuming a sweep whose submitting process was killed, and re-running it by force."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

from harness.records.mlflow_store import DEFAULT_STORE_FILE
from harness.records.resume import cell_key
from harness.records.tracking import CELL_KEY_TAG
from tests.helpers import cell_worker_pids
from tests.in_process import in_process_command

# Two cells that differ in their epoch count only; the second is the one interrupted.
SWEEP = [
    "-m",
    "dataset=mnist",
    "network=mobilenetv2",
    "distribution.batch_size=8",
    "dataset.num_samples=16",
    "run.warmup_batches=0",
    "run.progress=false",
    "tracking.experiment=resume",
]
EPOCHS = "run.epochs=1,2"


def _sweep_results(output_root: Path) -> dict[str, list[dict]]:
    """Each sweep directory's result.json files (by the directory's timestamp name)."""
    runs: dict[str, list[dict]] = {}
    for path in sorted((output_root / "sweeps" / "resume").glob("*/*/result.json")):
        runs.setdefault(path.parent.parent.name, []).append(json.loads(path.read_text()))
    return runs


def _cell_runs(output_root: Path) -> Counter:
    """(cell key, status) -> number of MLflow runs of the experiment's cells."""
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    experiment = client.get_experiment_by_name("resume")
    return Counter(
        (run.data.tags[CELL_KEY_TAG], run.data.tags["status"])
        for run in client.search_runs([experiment.experiment_id])
        if CELL_KEY_TAG in run.data.tags
    )


def _kill_once_second_cell_runs(sweep: subprocess.Popen, output_root: Path) -> None:
    """SIGKILL the sweep as soon as its second cell's worker process exists (cell 0 is
    recorded in MLflow by then: it rewrites result.json with its run id before exiting)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        results = [r for rs in _sweep_results(output_root).values() for r in rs]
        if results and results[0]["mlflow_run_id"] and cell_worker_pids(output_root):
            sweep.send_signal(signal.SIGKILL)
            sweep.wait(timeout=60)
            return
        assert sweep.poll() is None, "the sweep ended before it could be interrupted"
        time.sleep(0.1)
    raise AssertionError("the sweep never reached its second cell")


def _no_workers_left(output_root: Path, limit_s: float = 30) -> bool:
    deadline = time.monotonic() + limit_s
    while cell_worker_pids(output_root) and time.monotonic() < deadline:
        time.sleep(0.5)
    return not cell_worker_pids(output_root)


def test_a_killed_sweep_resumes_with_its_unfinished_cells_only(output_root: Path) -> None:
    args = [*SWEEP, EPOCHS, f"run.output_dir={output_root}"]
    sweep = subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=output_root.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        _kill_once_second_cell_runs(sweep, output_root)
    finally:
        sweep.kill()
    # The interrupted cell's workers end with the sweep: nothing runs beside the re-run.
    assert _no_workers_left(output_root)
    (first,) = _sweep_results(output_root).values()
    assert [r["config"]["run"]["epochs"] for r in first] == [1]

    time.sleep(1.1)  # Hydra names sweep directories by the second
    # What the re-run does, not its process, is under test: its launcher runs in this process
    # (the interrupted one above is a real process, killed).
    done = in_process_command("harness", args, cwd=output_root.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cell 0 (sequential 1x1 b8 mobilenetv2-mnist): skipped" in done.stdout
    assert "1 of 2 cells already finished" in done.stdout
    second = _sweep_results(output_root)
    assert len(second) == 2
    rerun = second[max(second)]
    assert [r["config"]["run"]["epochs"] for r in rerun] == [2]  # only the unfinished one ran
    assert all(r["status"] == "ok" for r in rerun), [r["error"] for r in rerun]
    keys = {r["cell_key"] for r in first + rerun}
    assert _cell_runs(output_root) == Counter({(key, "ok"): 1 for key in keys})
    assert len(keys) == 2

    # `hydra.launcher.force=true` runs a finished cell again (here: the first one only).
    forced = in_process_command(
        "harness",
        [*SWEEP, "run.epochs=1", f"run.output_dir={output_root}", "hydra.launcher.force=true"],
        cwd=output_root.parent,
    )
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert "skipped" not in forced.stdout
    assert _cell_runs(output_root)[(first[0]["cell_key"], "ok")] == 2


def test_the_cell_key_ignores_where_outputs_go_but_not_what_is_measured() -> None:
    from harness.commands.compose import compose_config

    base = cell_key(compose_config(["run.output_dir=/a", "dataset.cache_dir=/c"]))
    assert base == cell_key(compose_config(["run.output_dir=/b", "run.progress=false"]))
    assert base != cell_key(compose_config(["run.epochs=4"]))
    assert base != cell_key(compose_config(["tracking.experiment=other"]))


def test_a_sweep_of_two_passes_measures_each_cell_in_two_runs_a_pass_apart(
    output_root: Path,
) -> None:
    """`hydra.launcher.passes=2`: the sweep measures its cells, then all of them again, each
    run in its own directory and MLflow run; a re-run finds both and runs nothing."""
    args = [*SWEEP, "run.epochs=1", f"run.output_dir={output_root}", "hydra.launcher.passes=2"]
    # What the sweeps run and say is under test, not their processes: their launchers run in
    # this process (each cell's worker is still a process of its own).
    swept = in_process_command("harness", args, cwd=output_root.parent)
    assert swept.returncode == 0, swept.stderr[-3000:]
    assert (
        "pass 2: 1 cell(s) measured again, minutes after their run in the pass before "
        "(hydra.launcher.passes=2" in swept.stdout
    ), swept.stdout
    ((sweep_dir, runs),) = _sweep_results(output_root).items()
    assert len(runs) == 2 and all(run["status"] == "ok" for run in runs), runs
    directories = sorted(Path(run["output_dir"]).name for run in runs)
    assert directories == ["0", "0-pass2"]
    first, second = sorted(runs, key=lambda run: run["finished_at"])
    assert Path(second["output_dir"]).name == "0-pass2"
    assert first["cell_key"] == second["cell_key"]  # one cell, measured twice
    assert _cell_runs(output_root) == Counter({(first["cell_key"], "ok"): 2})
    again = in_process_command("harness", args, cwd=output_root.parent)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 cell(s) already measured, nothing to run" in again.stdout, again.stdout
    # Asked for a third pass, the cell makes the one run it lacks, and the sweep says why.
    third = in_process_command(
        "harness", [*args, "hydra.launcher.passes=3"], cwd=output_root.parent
    )
    assert third.returncode == 0, third.stderr[-3000:]
    assert (
        "1 cell(s) measured earlier in fewer than 3 runs that finished ok: each makes the "
        "runs it lacks (hydra.launcher.passes=3)" in third.stdout
    ), third.stdout
    assert third.stdout.count("starting 1 worker process(es)") == 1, third.stdout
    assert _cell_runs(output_root) == Counter({(first["cell_key"], "ok"): 3})


class _Run:
    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir


class _Cell:
    def __init__(self, output_dir: Path) -> None:
        self.run = _Run(output_dir)
        self.run_name = "cell"


class _Prepared:
    """What `runs_to_make` reads of a prepared cell: where its results go, and its config."""

    def __init__(self, output_root: Path, number: int) -> None:
        self.job_num = number
        self.cell = _Cell(output_root)
        self.config = {"run": {"epochs": number}}


def _recorded(output_root: Path, cell: _Prepared, status: str, directory: str) -> None:
    from harness.records.resume import index_result

    index_result(
        output_root,
        cell_key(cell.config),
        {
            "status": status,
            "run_name": "cell",
            "output_dir": str(output_root / directory),
            "finished_at": "2026-11-30T18:00:00+00:00",
        },
    )


def test_passes_make_the_runs_each_cell_lacks_pass_after_pass(tmp_path: Path) -> None:
    """Each cell lacks `passes` runs less those that finished ok: its first missing one is in
    the first pass, so that a sweep run again goes on where it stopped."""
    from launchers.cells import runs_to_make

    fresh, once, failed, full = (_Prepared(tmp_path, number) for number in range(4))
    _recorded(tmp_path, once, "ok", "a")
    _recorded(tmp_path, failed, "ok", "b")
    _recorded(tmp_path, failed, "failed", "c")  # one ok run, and its latest failed
    _recorded(tmp_path, full, "ok", "d")
    _recorded(tmp_path, full, "ok", "e")
    cells = [fresh, once, failed, full]
    assert runs_to_make(cells, {3}, passes=3, force=False) == [  # type: ignore[arg-type]
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
        (2, 1),
        (2, 2),
        (3, 0),
    ]
    # force: every cell not reused makes all its passes anew
    assert runs_to_make(cells, set(), passes=2, force=True) == [  # type: ignore[arg-type]
        (1, 0),
        (1, 1),
        (1, 2),
        (1, 3),
        (2, 0),
        (2, 1),
        (2, 2),
        (2, 3),
    ]
    # one pass: every cell not reused runs once, as a sweep always did; a cell whose count is
    # full but was chosen to run again (at random, or as unsteady) runs once more
    assert runs_to_make(cells, {1}, passes=1, force=False) == [  # type: ignore[arg-type]
        (1, 0),
        (1, 2),
        (1, 3),
    ]


def test_a_cells_index_entry_counts_its_runs_that_finished_ok(tmp_path: Path) -> None:
    from harness.records.resume import finished_runs, index_path

    cell = _Prepared(tmp_path, 0)
    key = cell_key(cell.config)
    assert finished_runs(tmp_path, key) == 0
    _recorded(tmp_path, cell, "ok", "a")
    _recorded(tmp_path, cell, "ok", "a")  # the same result again (rank 0, then its launcher)
    assert finished_runs(tmp_path, key) == 1
    _recorded(tmp_path, cell, "timeout", "b")
    _recorded(tmp_path, cell, "ok", "c")
    assert finished_runs(tmp_path, key) == 2
    # An entry written before the count was kept: one run, if its latest was ok.
    entry = json.loads(index_path(tmp_path, key).read_text())
    del entry["ok_runs"]
    index_path(tmp_path, key).write_text(json.dumps(entry))
    assert finished_runs(tmp_path, key) == 1
    _recorded(tmp_path, cell, "ok", "d")
    assert finished_runs(tmp_path, key) == 2


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    made=st.lists(st.integers(0, 4), max_size=6),
    passes=st.integers(1, 5),
    force=st.booleans(),
    data=st.data(),
)
def test_the_runs_of_any_sweep_make_up_each_cells_passes(
    tmp_path_factory: pytest.TempPathFactory,
    made: list[int],
    passes: int,
    force: bool,
    data: st.DataObject,
) -> None:
    """Whatever runs the cells made earlier, whichever are reused: a reused cell makes none,
    every other as many as it lacks of `passes` (all of them with `force`; one at least), pass
    after pass from the first, each pass in the sweep's order and each cell once in it."""
    from launchers.cells import runs_to_make

    root = tmp_path_factory.mktemp("runs")
    cells = [_Prepared(root, number) for number in range(len(made))]
    for cell, count in zip(cells, made, strict=True):
        for run in range(count):
            _recorded(root, cell, "ok", f"{cell.job_num}-{run}")
    done = data.draw(st.sets(st.sampled_from(range(len(cells))) if cells else st.nothing()))
    runs = runs_to_make(cells, done, passes=passes, force=force)  # type: ignore[arg-type]
    for index, count in enumerate(made):
        wanted = 0 if index in done else passes if force else max(passes - count, 1)
        assert [number for number, cell in runs if cell == index] == list(range(1, wanted + 1))
    numbers = [number for number, _ in runs]
    assert numbers == sorted(numbers)
    for number in set(numbers):
        in_pass = [cell for made_in, cell in runs if made_in == number]
        assert in_pass == sorted(set(in_pass))
