"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SLURM_SCRIPT = REPO_ROOT / "scripts" / "slurm_local.sh"


def tiny_overrides(output_root: Path, *extra: str) -> list[str]:
    """A cell small enough to train in seconds on 2 CPU cores."""
    return [
        "dataset=mnist",
        "network=mobilenetv2",
        "distribution.batch_size=8",
        "dataset.num_samples=16",
        "run.epochs=2",
        "run.warmup_batches=1",
        "run.progress=false",
        f"run.output_dir={output_root}",
        *extra,
    ]


def run_module(
    module: str, args: Sequence[str], cwd: Path, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run `python -m module args` as a user would, in `cwd`."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_tiny_cell(output_root: Path, *overrides: str) -> dict:
    """`python -m harness` on a tiny cell (tiny_overrides + `overrides`), as a user runs it;
    the result.json it wrote, after checking that the cell finished with status ok."""
    import json

    done = run_module("harness", tiny_overrides(output_root, *overrides), cwd=output_root.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (output_root / "runs").glob("*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok", result["error"]
    return result


def cell_worker_pids(under: Path, job_id: str | None = None) -> dict[int, int]:
    """rank -> pid of the worker processes (submitit tasks) of cells whose folder is below
    `under` (the test's own: other processes on the machine are not the test's business),
    read from the rank that submitit's local executor or SLURM puts in each worker's
    environment; with `job_id`, only the workers of that SLURM job."""
    ranks = {}
    found = subprocess.run(
        ["pgrep", "-f", f"submitit.core._submit {under}"], capture_output=True, text=True
    ).stdout.split()
    for pid in map(int, found):
        try:
            # Only Python workers: a SLURM batch step's `srun` has the same command line and
            # SLURM_PROCID=0 in its environment, and exists before its worker does.
            if not Path(f"/proc/{pid}/exe").resolve().name.startswith("python"):
                continue
            environ = dict(
                entry.split(b"=", 1)
                for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if b"=" in entry
            )
        except OSError:
            continue
        if job_id is not None and environ.get(b"SLURM_JOB_ID") != job_id.encode():
            continue
        rank = environ.get(b"SUBMITIT_LOCAL_GLOBALID", environ.get(b"SLURM_PROCID"))
        if rank is not None:
            ranks[int(rank)] = pid
    return ranks


# How long `mlflow server` may take to answer (about 20 s on an idle 2-core machine).
MLFLOW_SERVER_START_S = 180


@contextlib.contextmanager
def mlflow_server(backend_store: Path, cwd: Path, *extra: str) -> Iterator[str]:
    """A real `mlflow server` on `backend_store` (SQLite), on loopback and a free port: its URL
    once it answers /health. Stopped, its whole process group, whatever the test does."""
    with starting_mlflow_server(backend_store, cwd, *extra) as ready:
        yield ready()


@contextlib.contextmanager
def starting_mlflow_server(
    backend_store: Path, cwd: Path, *extra: str
) -> Iterator[Callable[[], str]]:
    """mlflow_server, started at once but waited for only when the test calls what this
    yields (which returns its URL once it answers /health): a test can do other work, e.g.
    measure a cell, while the server spends its ~20 s starting."""
    import http.client
    import signal
    import time

    from harness.system.worker_env import free_port

    port = free_port()
    # Without MLflow's job execution (GenAI jobs, which distbench never submits): its job
    # runner and consumers, 8 more Python processes, took about 11 of the server's 16
    # CPU-seconds and half its start-up on a 2-core machine.
    environment = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{backend_store}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *extra,
        ],
        cwd=cwd,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # its own group: its workers stop with it
    started = time.monotonic()

    def ready() -> str:
        while True:
            assert server.poll() is None, f"mlflow server exited: {server.stderr.read()[-2000:]}"
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    return f"http://127.0.0.1:{port}"
            except OSError:
                pass
            assert time.monotonic() < started + MLFLOW_SERVER_START_S, (
                f"mlflow server silent for {MLFLOW_SERVER_START_S} s"
            )
            time.sleep(0.25)

    try:
        yield ready
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


# What every worker started by `spawn_workers` imports: loaded once, in the forkserver.
_WORKER_PRELOAD = [
    "torch",
    "torch.distributed",
    "harness.worker.run",
    "harness.distributions",
    "harness.commands.compose",
    "harness.runtime.workload",
]


def spawn_workers(function: Callable[..., None], args: tuple, nprocs: int) -> None:
    """`function(rank, *args)` in `nprocs` new processes, as torch.multiprocessing.spawn runs
    it (an exception in any worker is raised here), started from a forkserver instead of a
    fresh interpreter each: real, separate processes with their own gloo group, but torch and
    the harness are imported once per test run (in the forkserver, which never ran a torch
    op, so the forked workers share no thread pool or lock state) instead of once per worker,
    several seconds each on 2 CPU cores."""
    import multiprocessing

    import torch.multiprocessing

    # Takes effect when the test run's forkserver starts (at the first call), later calls keep it;
    # the worker's own module is imported by each worker, cheaply once the preload is in.
    multiprocessing.set_forkserver_preload([*_WORKER_PRELOAD, function.__module__])
    torch.multiprocessing.start_processes(
        function, args=args, nprocs=nprocs, join=True, start_method="forkserver"
    )


def assert_stage_phases(metrics: dict, stages: int) -> None:
    """A pipeline cell's record says where each stage spent its epochs: its own phases
    (`<phase>_seconds_per_epoch_stage<k>`), which the workers' means blur."""
    import pytest

    for stage in range(stages):
        phases = {
            phase: metrics[f"{phase}_seconds_per_epoch_stage{stage}"]
            for phase in ("forward", "backward", "optimizer")
        }
        assert phases["forward"] > 0 and phases["backward"] > 0
        assert sum(phases.values()) < metrics["seconds_per_epoch_max"]
    per_stage = [metrics[f"forward_seconds_per_epoch_stage{k}"] for k in range(stages)]
    assert metrics["forward_seconds_per_epoch"] == pytest.approx(sum(per_stage) / stages)


def install_slurm_where_missing() -> str | None:
    """Install SLURM (`scripts/slurm_local.sh install`) where it is missing and this machine
    can (root, apt-get); None once it is installed, else why not. For tests that need SLURM's
    commands without a cluster (a sweep's input is checked against an installed sbatch), which
    may run before any cluster module installed it."""
    if shutil.which("slurmctld") is not None and shutil.which("sbatch") is not None:
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "SLURM is not installed and this machine cannot install it (needs root and apt-get)"
    installed = subprocess.run(
        ["bash", str(SLURM_SCRIPT), "install"], capture_output=True, text=True, timeout=600
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return None
