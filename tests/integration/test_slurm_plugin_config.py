"""A launcher config written for Hydra's submitit plugin (hydra-submitit-launcher), kept as a
user keeps it (a `hydra/launcher` group file found through `hydra.searchpath`), runs a sweep
through distbench's slurm_cells launcher: its sizing keys are checks against each cell's
hardware config, `array_parallelism` runs cells side by side on distinct exclusive nodes,
`max_num_timeout` re-queues a job signalled for its time limit, `wait_for_completion` is
accepted. The sweep runs on the real 2-node SLURM cluster of scripts/slurm_local.sh."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.config.schema import ConfigError, Device, DistbenchConfig, HardwareConfig
from harness.distributions.registry import settings
from launchers import slurm
from tests.integration.test_slurm import _job_ids

# As a user of the plugin writes it (its keys, its layout); `defaults: [submitit_slurm]`
# builds on the launcher of that name, which is distbench's.
PLUGIN_CONFIG = """\
# @package hydra.launcher
defaults:
  - submitit_slurm

partition: local
nodes: 2                 # the hardware config's whole allocation (slurm_local_2nodes)
tasks_per_node: 1
cpus_per_task: 1
mem_gb: 1
timeout_min: 10
signal_delay_s: 30
max_num_timeout: 1       # a timed-out job is re-queued once
array_parallelism: 2     # two cells at once, each on its own node
setup:
  - export DISTBENCH_USER_SETUP=1
additional_parameters:
  mail-type: NONE
wait_for_completion: false
"""

CELL = [
    "+sweep=smoke",
    "hardware=slurm_local_2nodes",
    "network=mobilenetv2",
    "dataset=mnist",
    "dataset.num_samples=32",
    "distribution.batch_size=8",
    "run.warmup_batches=1",
    "run.progress=false",
    "tracking.enabled=false",
]


@pytest.fixture(scope="module")
def plugin_config(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The overrides that pick the user's launcher config from its own directory."""
    conf = tmp_path_factory.mktemp("user-conf")
    (conf / "hydra" / "launcher").mkdir(parents=True)
    (conf / "hydra" / "launcher" / "mycluster.yaml").write_text(PLUGIN_CONFIG)
    return [f"hydra.searchpath=[file://{conf}]", "hydra/launcher=mycluster"]


def _harness(output_root: Path, *overrides: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *overrides, f"run.output_dir={output_root}"],
        cwd=output_root.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def _echoed(process: subprocess.Popen[str], seen: list[str]) -> Iterator[str]:
    """The process's output lines, each also kept in `seen`."""
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line)
        yield line


def _job_log(output_root: Path, job_id: str) -> str:
    logs = sorted((output_root / "sweeps").rglob(f".submitit/{job_id}/{job_id}_0_log.*"))
    return "".join(path.read_text(errors="replace") for path in logs)


def _wait_for(condition, what: str, job_id: str, timeout: float = 240) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, (
            f"timed out waiting for {what}; SLURM says:\n{_job_state(job_id)}"
        )
        time.sleep(0.3)


def _job_state(job_id: str) -> str:
    """What SLURM says of the job (state, reason, begin time), for a failure's message."""
    shown = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=60
    )
    return shown.stdout + shown.stderr


def _signal_time_limit(output_root: Path, job_id: str, trained_epochs: int) -> None:
    """Once the job's worker has logged its epoch 1 `trained_epochs` times (once per try),
    send the job's tasks the signal SLURM sends `signal_delay_s` before the time limit (a real
    limit is whole minutes long; the signal is the same)."""
    # The epoch's own line, not its evaluation's ("epoch 1/3: eval accuracy ...").
    trained = re.compile(r"epoch 1/\d+: [\d.]+ s \(")
    _wait_for(
        lambda: len(trained.findall(_job_log(output_root, job_id))) >= trained_epochs,
        f"job {job_id} to train (try {trained_epochs})",
        job_id,
    )
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=60)


def test_a_plugin_config_runs_cells_side_by_side_and_requeues_a_timed_out_job(
    slurm_cluster: None, output_root: Path, plugin_config: list[str]
) -> None:
    """Cell 0 is signalled for its time limit on its first try (re-queued: runs again in the
    same job) and on its last (runs on to the end); cell 1 runs beside it on the other node."""
    sweep = _harness(
        output_root, *CELL, *plugin_config, "distribution=sequential", "run.epochs=3,1"
    )
    seen: list[str] = []
    try:
        signalled, beside = _job_ids(_echoed(sweep, seen), 2)
        _signal_time_limit(output_root, signalled, trained_epochs=1)
        for line in _echoed(sweep, seen):  # the launcher sees the job back in the queue
            if f"SLURM job {signalled} re-queued" in line:
                break
        # SLURM holds a re-queued job for the test cluster's cred_expire + 1 s (11 s) and
        # then starts it. (Moving its StartTime to now is no shortcut: started while the
        # first try's credential is still revoked, the job is killed.)
        _signal_time_limit(output_root, signalled, trained_epochs=2)
        rest, _ = sweep.communicate(timeout=600)
    finally:
        sweep.kill()
    out = "".join(seen) + rest
    assert sweep.returncode == 0, out[-3000:]
    assert "wait_for_completion=false is ignored" in out
    sweep_dir = next((output_root / "sweeps" / "smoke").iterdir())
    results = [json.loads((sweep_dir / cell / "result.json").read_text()) for cell in "01"]
    assert [r["status"] for r in results] == ["ok", "ok"], [r["error"] for r in results]
    # Re-queued in place: the same job measured and recorded the cell once, on its last try.
    assert [r["environment"]["slurm_job_id"] for r in results] == [signalled, beside]
    assert len(list(output_root.rglob("result.json"))) == 2
    log = _job_log(output_root, signalled)
    assert "Requeued job" in log and "on its last try (2 of 2" in log, log[-3000:]
    # array_parallelism=2: the two cells ran at the same time, on distinct nodes.
    assert {r["environment"]["slurm_nodelist"] for r in results} == {"node1", "node2"}
    # (One at a time, cell 1 would have waited for cell 0's job to end, after its last try.)
    assert dt.datetime.fromisoformat(results[1]["started_at"]) < dt.datetime.fromisoformat(
        results[0]["finished_at"]
    )
    # The sbatch script submitit wrote from the user's config.
    script = next(sweep_dir.rglob(f".submitit/{signalled}/{signalled}_submission.sh")).read_text()
    for line in (
        "#SBATCH --partition=local",
        "#SBATCH --mem=1GB",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --time=10",
        "#SBATCH --signal=USR2@30",
        "#SBATCH --requeue",
        "#SBATCH --exclusive",
        "#SBATCH --dependency=singleton",
        "#SBATCH --job-name=distbench-smoke-0",
        "#SBATCH --mail-type=NONE",
        "export DISTBENCH_USER_SETUP=1",
    ):
        assert line in script.splitlines(), script


def test_a_requeue_whose_scontrol_slurm_ends_with_sigterm_ends_the_try_as_requeued(
    tmp_path: Path,
) -> None:
    """SLURM ends a re-queued job's step with SIGTERM, `scontrol requeue` included when it has
    not returned yet: that try ends as re-queued (SystemExit, as submitit's own), not as a
    failure of the cell. Any other failure of the handler is raised as before. (A real
    process ended by SIGTERM stands in for scontrol: no SLURM step is needed to see it.)"""
    import signal as signals

    def requeue_ended_by(signal_number: int) -> Callable[[int, object], None]:
        scontrol = tmp_path / "bin" / "scontrol"  # `scontrol requeue`, ended by the signal
        scontrol.parent.mkdir(exist_ok=True)
        scontrol.write_text(f"#!/bin/sh\nkill -{signal_number} $$\n")
        scontrol.chmod(0o755)
        return slurm.requeued_even_if_slurm_ends_scontrol(  # submitit's handler calls it so
            lambda signum, frame: subprocess.check_call(
                [str(scontrol), "requeue", "22"], timeout=60
            )
        )

    with pytest.raises(SystemExit) as ended:
        requeue_ended_by(signals.SIGTERM)(signals.SIGUSR2, None)
    assert ended.value.code == -1
    with pytest.raises(subprocess.CalledProcessError):  # not SLURM's doing: a failure
        requeue_ended_by(signals.SIGKILL)(signals.SIGUSR2, None)


def test_a_plugin_config_whose_size_contradicts_the_hardware_stops_before_any_job(
    output_root: Path, plugin_config: list[str]
) -> None:
    done = _harness(
        output_root,
        *CELL,
        *plugin_config,
        "distribution=sequential,ddp",
        "hydra.launcher.tasks_per_node=4",
    )
    out, _ = done.communicate(timeout=300)
    assert done.returncode == 2, out[-2000:]
    (line,) = [line for line in out.splitlines() if line.startswith("distbench:")]
    assert "hydra.launcher.tasks_per_node=4 is invalid for cell" in line
    assert "it needs 1" in line and "change hardware.workers_per_node" in line
    assert "Traceback" not in out and not list(output_root.rglob("*_submission.sh"))


def _cell(distribution: str, **hardware: object) -> DistbenchConfig:
    fields = {"name": "gpus", "nodes": 2, "workers_per_node": 4, "device": Device.cuda, **hardware}
    return DistbenchConfig(
        hardware=HardwareConfig(**fields),  # type: ignore[arg-type]
        distribution=settings(distribution),
    )


@pytest.mark.parametrize(
    ("launcher", "accepted"),
    [
        ({"nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4}, True),  # the cell's own size
        ({"gpus_per_task": 1, "cpus_per_task": 8}, True),
        ({"nodes": 1}, "hydra.launcher.nodes=1 is invalid for cell"),
        ({"tasks_per_node": 2}, "it needs 4"),
        ({"gpus_per_node": 8}, "change hardware.workers_per_node (one GPU per worker)"),
        ({"gpus_per_task": 2}, "hydra.launcher.gpus_per_task=2"),
        ({"cpus_per_task": 4}, "change hardware.cpu_threads"),
        (
            {"additional_parameters": {"ntasks-per-node": 4}},
            "additional_parameters.ntasks-per-node is invalid",
        ),
        ({"array_parallelism": 0}, "allowed: 1 or more"),
        ({"one_cell_at_a_time": True, "array_parallelism": 2}, "they contradict"),
    ],
)
def test_the_plugin_sizing_keys_are_checks_against_the_cell(
    launcher: dict, accepted: bool | str
) -> None:
    ddp = _cell("ddp", cpu_threads=8)
    if accepted is True:
        assert slurm.cell_job_size(ddp, launcher) == slurm.CellJobSize(2, 4, 4)
        return
    with pytest.raises(ConfigError) as error:
        slurm.cell_job_size(ddp, launcher)
    assert accepted in str(error.value)


def test_the_baseline_takes_one_worker_of_a_config_sized_for_the_whole_hardware() -> None:
    """A plugin config sized for the hardware (2 nodes x 4 GPUs) also runs the sweep's
    one-worker baseline, which gets one node, one task, one GPU."""
    launcher = {
        "nodes": 2,
        "tasks_per_node": 4,
        "gpus_per_node": 4,
        "name": "n",
        "array_parallelism": 3,
        "max_num_timeout": 2,
        "gpus_per_task": None,
    }
    baseline = _cell("sequential")
    size = slurm.cell_job_size(baseline, launcher)
    assert size == slurm.CellJobSize(1, 1, 1)
    parameters = slurm.executor_parameters(size, launcher, baseline, job_num=4)
    assert parameters["name"] == "n-1"  # cell 4 in the second of three chains
    assert parameters["slurm_dependency"] == "singleton"
    assert parameters["slurm_additional_parameters"] == {"requeue": True}
    per_task = slurm.executor_parameters(size, {**launcher, "gpus_per_task": 1}, baseline)
    assert per_task["gpus_per_node"] is None and per_task["slurm_gpus_per_task"] == 1
    unlimited = slurm.executor_parameters(size, {**launcher, "one_cell_at_a_time": False}, baseline)
    assert "slurm_dependency" not in unlimited and unlimited["name"] == "n"
