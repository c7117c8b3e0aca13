"""Sweeps through a real SLURM cluster: two slurmd "nodes" on this machine
(scripts/slurm_local.sh), launched with `hydra/launcher=submitit_slurm` (distbench's
slurm_cells launcher)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from mlflow.tracking import MlflowClient

from harness.config.schema import Device, DistbenchConfig, HardwareConfig
from harness.distributions.registry import settings
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from harness.records.resume import job_note_path
from harness.records.tracking import CELL_KEY_TAG
from launchers import slurm
from tests.helpers import cell_worker_pids

SLURM_SWEEP = [
    "+sweep=smoke",
    "hydra/launcher=submitit_slurm",
    "hardware=slurm_local_2nodes",
    "hydra.launcher.timeout_min=10",
    "network=mobilenetv2",
    "dataset=mnist",
    "distribution.batch_size=8",
    "run.warmup_batches=1",
    "run.progress=false",
]


def _sweep(output_root: Path, *overrides: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            *SLURM_SWEEP,
            *overrides,
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def _results(output_root: Path) -> list[dict]:
    """Every cell's result.json, in cell order."""
    paths = (output_root / "sweeps").glob("*/*/*/result.json")
    return [
        json.loads(p.read_text())
        for p in sorted(paths, key=lambda p: (p.parent.parent.name, int(p.parent.name)))
    ]


def test_each_cell_gets_its_own_allocation_and_cells_run_one_at_a_time(
    slurm_cluster: None, output_root: Path
) -> None:
    sweep = _sweep(
        output_root, "distribution=sequential,ddp,horovod", "dataset.num_samples=32", "run.epochs=1"
    )
    out, _ = sweep.communicate(timeout=900)
    assert sweep.returncode == 0, out[-3000:]
    results = _results(output_root)
    assert [r["config"]["distribution"]["name"] for r in results] == [
        "sequential",
        "ddp",
        "horovod",
    ]
    assert all(r["status"] == "ok" for r in results), [r["error"] for r in results]
    sequential, ddp, horovod = results
    assert sequential["environment"]["slurm_nodelist"] == "node1"
    assert sequential["metrics"]["world_size"] == 1
    for multi_node in (ddp, horovod):  # one worker on each of the two nodes
        assert multi_node["environment"]["slurm_nodelist"] == "node[1-2]"
        assert multi_node["metrics"]["world_size"] == 2
        assert multi_node["metrics"]["replicas_in_sync"] == 1.0
    # SLURM's singleton dependency: each cell started after the previous one had finished.
    for earlier, later in zip(results, results[1:]):
        assert dt.datetime.fromisoformat(earlier["finished_at"]) <= dt.datetime.fromisoformat(
            later["started_at"]
        )
    # The jobs recorded themselves in MLflow, nested under the sweep's parent run.
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    runs = client.search_runs([client.get_experiment_by_name("smoke").experiment_id])
    parent = [r.info.run_id for r in runs if r.data.tags.get("distbench.kind") == "sweep"]
    cells = [r for r in runs if "status" in r.data.tags]
    assert len(cells) == 3 and {c.data.tags["mlflow.parentRunId"] for c in cells} == set(parent)
    script = next((output_root / "sweeps").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --exclusive" in script and "#SBATCH --dependency=singleton" in script


def test_a_two_node_gpipe_and_pipedream_cell_run_through_slurm(
    slurm_cluster: None, output_root: Path
) -> None:
    """The pipelines across nodes: stage 0 on node1, stage 1 on node2 (activations and
    gradients cross between the nodes' workers)."""
    for pipeline in (
        ["distribution=gpipe", "distribution.micro_batches=4"],
        ["distribution=pipedream", "distribution.stages=1-1"],
    ):
        sweep = _sweep(
            output_root,
            *pipeline,
            "distribution.batch_size=16",
            "dataset.num_samples=32",
            "run.epochs=1",
            "tracking.enabled=false",  # what is asserted is in result.json
        )
        out, _ = sweep.communicate(timeout=900)
        assert sweep.returncode == 0, out[-3000:]
    results = _results(output_root)
    assert [r["status"] for r in results] == ["ok", "ok"], [r["error"] for r in results]
    for result in results:
        assert result["environment"]["slurm_nodelist"] == "node[1-2]"
        assert result["metrics"]["world_size"] == 2
        assert result["metrics"]["pipeline_stages"] == 2


def _wait_for_training(output_root: Path, job_id: str, timeout: float = 180) -> dict[int, int]:
    """The pids of SLURM job `job_id`'s two workers, once rank 0 has finished an epoch."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Hydra's job logging in a SLURM task writes to the task's stdout.
        logs = list((output_root / "sweeps").rglob(f".submitit/{job_id}/{job_id}_0_log.out"))
        if logs and "epoch 1/" in logs[0].read_text():
            workers = cell_worker_pids(output_root, job_id)
            if len(workers) == 2:
                return workers
        time.sleep(0.3)
    raise AssertionError(f"SLURM job {job_id} never started training")


def _job_ids(sweep: subprocess.Popen[str] | Iterable[str], count: int) -> list[str]:
    """The SLURM job ids the launcher prints as it submits the cells (read from the sweep's
    output, or from lines of it)."""
    lines = sweep.stdout if isinstance(sweep, subprocess.Popen) else sweep
    assert lines is not None
    ids: list[str] = []
    for line in lines:
        if "SLURM job" in line:
            ids.append(line.split("SLURM job ")[1].split(",")[0])
            if len(ids) == count:
                return ids
    raise AssertionError("the launcher did not report its jobs")


def test_a_killed_and_a_hanging_multi_node_cell_are_recorded_and_the_sweep_goes_on(
    slurm_cluster: None, output_root: Path
) -> None:
    """Cell 0 loses its rank 0 to SIGKILL (the job leaves no result: the launcher records
    it); cell 1's rank 1 freezes (rank 0 records a timeout, the launcher cancels the job);
    cell 2 runs as usual. Short epochs (4 batches per worker): the first epoch line, which the
    test waits for, comes soon, and the 30 epochs still outlast the test's signal. (Recording
    a failed cell in MLflow is test_a_rerun_records_a_job_that_died_unwatched's.)"""
    sweep = _sweep(
        output_root,
        "distribution=ddp",
        "dataset.num_samples=64",
        "tracking.enabled=false",
        "run.epochs=30,31,1",
        "run.progress_timeout_s=10",
        "hydra.launcher.grace_after_result_s=5",
    )
    try:
        killed, frozen, _ = _job_ids(sweep, 3)
        os.kill(_wait_for_training(output_root, killed)[0], signal.SIGKILL)
        os.kill(_wait_for_training(output_root, frozen)[1], signal.SIGSTOP)
        out, _ = sweep.communicate(timeout=900)
    finally:
        sweep.kill()
    assert sweep.returncode == 1, out[-3000:]  # two of its cells did not end ok
    results = _results(output_root)
    assert [r["status"] for r in results] == ["failed", "timeout", "ok"], [
        r["error"] for r in results
    ]
    assert f"SLURM job {killed} ended" in results[0]["error"]
    assert "--- rank 1: failed" in results[0]["error"]  # the survivor's own report
    assert results[2]["metrics"]["world_size"] == 2
    assert not cell_worker_pids(output_root)  # the frozen worker did not outlive its cell


def test_results_land_when_the_submitting_shell_dies(
    slurm_cluster: None, output_root: Path
) -> None:
    """SIGKILL the sweep right after it submitted its jobs: the jobs still run and record
    themselves (result.json and MLflow), one after another."""
    sweep = _sweep(
        output_root, "distribution=sequential,ddp", "dataset.num_samples=32", "run.epochs=1"
    )
    try:
        job_ids = _job_ids(sweep, 2)
    finally:
        sweep.kill()
    sweep.wait(timeout=60)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # result.json is rewritten once MLflow has the run
        results = _results(output_root)
        if len(results) == 2 and all(r["mlflow_run_id"] for r in results):
            break
        time.sleep(1)
    assert [r["status"] for r in results] == ["ok", "ok"], [r["error"] for r in results]
    assert [r["environment"]["slurm_job_id"] for r in results] == job_ids
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    for result in results:
        assert client.get_run(result["mlflow_run_id"]).data.tags["status"] == "ok"


def _cell_runs(output_root: Path) -> Counter:
    """(cell key, status) -> number of MLflow runs of the smoke experiment's cells."""
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    experiment = client.get_experiment_by_name("smoke")
    return Counter(
        (run.data.tags[CELL_KEY_TAG], run.data.tags["status"])
        for run in client.search_runs([experiment.experiment_id])
        if CELL_KEY_TAG in run.data.tags
    )


def _noted_job_ids(output_root: Path, results: list[dict]) -> list[str]:
    """The job noted for each result's cell (the last one submitted for it)."""
    return [
        json.loads(job_note_path(output_root, r["cell_key"]).read_text())["job_id"] for r in results
    ]


def _kill_sweep_once_submitted(output_root: Path, cells: int, *overrides: str) -> list[str]:
    """Start a sweep and SIGKILL it as soon as it has submitted its `cells` jobs."""
    sweep = _sweep(output_root, *overrides)
    try:
        job_ids = _job_ids(sweep, cells)
    finally:
        sweep.kill()
    sweep.wait(timeout=60)
    time.sleep(1.1)  # Hydra names sweep directories by the second: the re-run gets its own
    return job_ids


def _rerun(output_root: Path, *overrides: str) -> str:
    sweep = _sweep(output_root, *overrides)
    out, _ = sweep.communicate(timeout=900)
    assert sweep.returncode == 0, out[-3000:]
    return out


def test_a_rerun_of_a_killed_sweep_follows_its_queued_jobs_instead_of_submitting_again(
    slurm_cluster: None, output_root: Path
) -> None:
    cells = ["distribution=sequential", "dataset.num_samples=32", "run.epochs=1,2,3"]
    job_ids = _kill_sweep_once_submitted(output_root, 3, *cells)
    out = _rerun(output_root, *cells)  # at once: the earlier jobs are still queued or running
    assert "SLURM job" not in out, out[-3000:]  # nothing submitted a second time
    taken_over = [
        line
        for line in out.splitlines()
        if "following earlier job" in line or "skipped, finished earlier" in line
    ]
    assert len(taken_over) == 3, out[-3000:]
    assert any(f"following earlier job {job_ids[-1]}" in line for line in taken_over)
    results = _results(output_root)  # the earlier sweep's only: the re-run ran nothing itself
    assert [r["status"] for r in results] == ["ok", "ok", "ok"], [r["error"] for r in results]
    assert [r["environment"]["slurm_job_id"] for r in results] == job_ids
    assert _noted_job_ids(output_root, results) == job_ids
    assert _cell_runs(output_root) == Counter({(r["cell_key"], "ok"): 1 for r in results})


def _kill_worker_once_started(output_root: Path, job_id: str, timeout: float = 180) -> None:
    """SIGKILL the (single) worker of SLURM job `job_id` once it runs, then wait for the job to
    end: it leaves no result and no rank report."""
    deadline = time.monotonic() + timeout
    while not (workers := cell_worker_pids(output_root, job_id)):
        assert time.monotonic() < deadline, f"SLURM job {job_id} never started"
        time.sleep(0.2)
    os.kill(workers[0], signal.SIGKILL)
    while not slurm.has_ended(slurm.job_states([job_id])[job_id]):
        assert time.monotonic() < deadline, f"SLURM job {job_id} did not end"
        time.sleep(0.5)


def test_a_rerun_records_a_job_that_died_unwatched_then_runs_its_cell_again(
    slurm_cluster: None, output_root: Path
) -> None:
    """Cell 0's worker is SIGKILLed while the sweep process is dead too: nobody records it
    until the re-run, which records that attempt as failed, submits cell 0 again and follows
    cell 1's earlier job (queued behind cell 0's, one cell at a time)."""
    cells = ["distribution=sequential", "dataset.num_samples=32", "run.epochs=2,1"]
    killed, queued = _kill_sweep_once_submitted(output_root, 2, *cells)
    _kill_worker_once_started(output_root, killed)
    out = _rerun(output_root, *cells)
    assert f"earlier job {killed} ended" in out and "recorded as failed" in out, out[-3000:]
    assert out.count("SLURM job") == 1, out[-3000:]  # cell 0 only is submitted again
    assert (
        f"following earlier job {queued}" in out
        or "cell 1 (sequential 1x1 " in out
        and "skipped" in out
    ), out[-3000:]
    earlier_attempt, earlier_cell_1, rerun_cell_0 = _results(output_root)
    assert earlier_attempt["status"] == "failed"
    assert f"SLURM job {killed} ended" in earlier_attempt["error"]
    assert "while the sweep was not watching" in earlier_attempt["error"]
    assert (earlier_cell_1["status"], rerun_cell_0["status"]) == ("ok", "ok"), [
        earlier_cell_1["error"],
        rerun_cell_0["error"],
    ]
    assert rerun_cell_0["cell_key"] == earlier_attempt["cell_key"]
    assert rerun_cell_0["environment"]["slurm_job_id"] not in (killed, queued)
    assert _cell_runs(output_root) == Counter(
        {
            (earlier_attempt["cell_key"], "failed"): 1,
            (earlier_attempt["cell_key"], "ok"): 1,
            (earlier_cell_1["cell_key"], "ok"): 1,
        }
    )


def test_a_forced_rerun_cancels_the_earlier_jobs_still_queued(
    slurm_cluster: None, output_root: Path
) -> None:
    cells = ["distribution=sequential", "dataset.num_samples=32", "run.epochs=1,2"]
    earlier = _kill_sweep_once_submitted(output_root, 2, *cells)
    out = _rerun(output_root, *cells, "hydra.launcher.force=true")
    assert f"cancelled earlier job {earlier[1]}" in out, out[-3000:]  # queued behind cell 0
    assert out.count("SLURM job") == 2, out[-3000:]
    assert all(slurm.has_ended(state) for state in slurm.job_states(earlier).values())
    earlier_sweep, rerun_sweep = sorted((output_root / "sweeps" / "smoke").iterdir())
    rerun = [json.loads((rerun_sweep / cell / "result.json").read_text()) for cell in "01"]
    assert [r["status"] for r in rerun] == ["ok", "ok"], [r["error"] for r in rerun]
    assert _noted_job_ids(output_root, rerun) == [r["environment"]["slurm_job_id"] for r in rerun]
    assert not set(_noted_job_ids(output_root, rerun)) & set(earlier)
    # Cell 1's earlier job was cancelled before it finished: the cell is ok in MLflow once.
    # (Cell 0's earlier job may have finished before the re-run began: force runs it again.)
    assert _cell_runs(output_root)[(rerun[1]["cell_key"], "ok")] == 1
    assert not (earlier_sweep / "1" / "result.json").exists()


def test_a_sweep_of_two_passes_submits_the_second_once_the_first_has_ended(
    slurm_cluster: None, output_root: Path
) -> None:
    """`hydra.launcher.passes=2` on SLURM: every cell's second run is submitted after the
    first pass's jobs have all ended, each run in its own directory and MLflow run."""
    cells = [
        "distribution=sequential",
        "dataset.num_samples=32",
        "run.epochs=1,2",
        "hydra.launcher.passes=2",
    ]
    out = _rerun(output_root, *cells)
    assert "pass 2: 2 cell(s) measured again" in out, out[-3000:]
    assert out.count("SLURM job") == 4, out[-3000:]
    runs = {
        path.parent.name: json.loads(path.read_text())
        for path in (output_root / "sweeps").glob("*/*/*/result.json")
    }
    assert sorted(runs) == ["0", "0-pass2", "1", "1-pass2"]
    assert all(r["status"] == "ok" for r in runs.values()), [r["error"] for r in runs.values()]
    first_pass_ended = max(dt.datetime.fromisoformat(runs[d]["finished_at"]) for d in "01")
    assert all(
        dt.datetime.fromisoformat(runs[f"{d}-pass2"]["started_at"]) >= first_pass_ended
        for d in "01"
    )
    assert _cell_runs(output_root) == Counter({(runs[d]["cell_key"], "ok"): 2 for d in "01"})
    assert "2 cell(s) already measured, nothing to run" in _rerun(output_root, *cells)


def test_the_probe_measures_the_link_between_two_slurm_nodes(
    slurm_cluster: None, output_root: Path
) -> None:
    from harness.profiles.hardware import HardwareProfile, profile_path

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.probe",
            "hardware=slurm_local_2nodes",
            "hydra/launcher=submitit_slurm",
            "probe.repeats=3",
            "probe.message_bytes=[8,1048576]",
            "probe.rounds=1",  # several rounds: test_emulated_nodes.py's probe
            "tracking.enabled=false",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    profile = HardwareProfile.load(profile_path(output_root, "slurm_local_2nodes"))
    (link,) = profile.links
    assert not link.same_node and profile.nodes == 2
    assert profile.facts["hosts"] == ["node1", "node2"]
    assert link.cost.latency_s > 0 and link.cost.bandwidth_bytes_per_s > 0
    script = next((output_root / "probes").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --exclusive" in script
    # a worker that dies ends the probe's step at once, not its peers' rendezvous timeout
    assert "srun --unbuffered --output" in script and "--kill-on-bad-exit=1" in script


def _cell(**hardware: object) -> DistbenchConfig:
    fields = {"name": "h", "nodes": 2, "workers_per_node": 4, **hardware}
    return DistbenchConfig(
        hardware=HardwareConfig(**fields),  # type: ignore[arg-type]
        distribution=settings("sequential"),
    )


def test_job_parameters_follow_the_cell() -> None:
    ddp = _cell(device=Device.cuda, cpu_threads=8)
    ddp.distribution = settings("ddp")
    size = slurm.cell_job_size(ddp, {"nodes": None, "tasks_per_node": None})
    assert (size.nodes, size.tasks_per_node, size.gpus_per_node) == (2, 4, 4)
    launcher = {
        "name": "distbench-x",
        "exclusive": True,
        "one_cell_at_a_time": True,
        "partition": "gpu",
        "account": "proj",
        "mem_gb": 64,
        "timeout_min": 30,
        "additional_parameters": {"reservation": "r1"},
        "qos": None,
    }
    parameters = slurm.executor_parameters(size, launcher, ddp)
    assert parameters == {
        "nodes": 2,
        "tasks_per_node": 4,
        "gpus_per_node": 4,
        "name": "distbench-x",
        "slurm_exclusive": True,
        "cpus_per_task": 8,
        "slurm_dependency": "singleton",
        "slurm_partition": "gpu",
        "slurm_account": "proj",
        "mem_gb": 64,
        "timeout_min": 30,
        "slurm_additional_parameters": {"reservation": "r1"},
    }
    sequential = _cell(device=Device.cpu)  # the baseline: one task, whatever the hardware
    size = slurm.cell_job_size(sequential, {})
    assert (size.nodes, size.tasks_per_node, size.gpus_per_node) == (1, 1, None)
    parallel = slurm.executor_parameters(
        size, {"name": "n", "exclusive": False, "one_cell_at_a_time": False}, sequential
    )
    assert "slurm_dependency" not in parallel and parallel["slurm_exclusive"] is None


def test_how_a_job_without_a_result_ended_becomes_its_status() -> None:
    from harness.records.results import RunStatus

    assert slurm.status_of_state("TIMEOUT") is RunStatus.timeout
    assert slurm.status_of_state("OUT_OF_MEMORY") is RunStatus.oom
    assert slurm.status_of_state("FAILED") is None  # the rank reports decide
    assert slurm.has_ended("COMPLETED") and slurm.has_ended(slurm.GONE)
    assert not slurm.has_ended("PENDING") and not slurm.has_ended("RUNNING")
