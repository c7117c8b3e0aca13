"""Faults across emulated nodes: a node's link cut mid-allreduce, a link throttled to a trickle
mid-cell, a node's slurmd killed, a node's namespace torn down under a running cell. Each faulted
cell must end within its timeout and be recorded with its reason, no process of it may be left on
any node, the sweep must go on, and a re-run must measure it again.

A benchmark (`-m perf`, several minutes): `.venv/bin/python -m pytest -m perf
tests/benchmarks/test_emulated_faults.py`. Needs root and network namespaces (skipped otherwise,
with the reason); it brings up its own 2-node emulated cluster and takes it down after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

EMULATED_HARDWARE = "emulated_2nodes_200mbit"
PROGRESS_TIMEOUT_S = 20
# Cell 0 trains long enough to be faulted; cell 1 is tiny: the sweep must reach it.
SWEEP = [
    "-m",
    "hydra/launcher=submitit_slurm",
    f"hardware={EMULATED_HARDWARE}",
    "hydra.launcher.timeout_min=10",
    "hydra.launcher.grace_after_result_s=5",
    "hydra.launcher.unavailable_nodes_timeout_s=30",
    "network=mobilenetv2",
    "dataset=mnist",
    "distribution=ddp",
    "distribution.batch_size=8",
    "dataset.num_samples=64",
    "run.warmup_batches=1",
    "run.progress=false",
    "run.eval=false",
    f"run.progress_timeout_s={PROGRESS_TIMEOUT_S}",
    "run.epochs=15,1",
]

pytestmark = pytest.mark.perf


def _start(output_root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *SWEEP, f"run.output_dir={output_root}"],
        cwd=output_root.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def _results(output_root: Path) -> list[dict]:
    paths = (output_root / "sweeps").glob("*/*/*/result.json")
    return [
        json.loads(p.read_text())
        for p in sorted(paths, key=lambda p: (p.parent.parent.name, int(p.parent.name)))
    ]


def _wait_for_training(output_root: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = list((output_root / "sweeps").rglob("*_0_log.out"))
        if logs and "epoch 2/" in logs[0].read_text():
            return
        time.sleep(0.3)
    raise AssertionError("cell 0 never started training")


def _processes_in(namespace: str) -> dict[int, str]:
    """pid -> name of every process in a node's namespace (none once the node is gone)."""
    pids = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True
    ).stdout.split()
    found = {}
    for pid in map(int, pids):
        try:
            found[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
    return found


def _left(keep: frozenset[str]) -> dict[int, str]:
    return {
        pid: name
        for namespace in ("distbench-node1", "distbench-node2")
        for pid, name in _processes_in(namespace).items()
        if name not in keep
    }


def _wait_until_gone(keep: frozenset[str], limit_s: float) -> dict[int, str]:
    """The processes (besides `keep`) still in the nodes after `limit_s` (empty: all gone)."""
    deadline = time.monotonic() + limit_s
    while (left := _left(keep)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


# While a node is cut off, SLURM's own step daemon there (slurmstepd) cannot learn that its job
# ended, and the job's srun on the other node waits for it: SLURM ends both once the node
# answers again. The cell's own processes, its workers, must end by themselves.
SLURM_DAEMONS = frozenset({"slurmd", "slurmstepd", "srun"})


def cut_link() -> None:
    subprocess.run(["ip", "link", "set", "distbench-v2", "down"], check=True)


def throttle_link() -> None:
    subprocess.run(
        [
            "nsenter",
            "--net=/run/netns/distbench-node2",
            "tc",
            "qdisc",
            "replace",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            "8kbit",
            "burst",
            "64kb",
            "latency",
            "50ms",
        ],
        check=True,
    )


def kill_slurmd() -> None:
    for pid in subprocess.run(
        ["ip", "netns", "pids", "distbench-node2"], capture_output=True, text=True
    ).stdout.split():
        if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd":
            os.kill(int(pid), signal.SIGKILL)


def tear_down_node() -> None:
    """The node is gone: every process in it killed, its namespace removed."""
    from launchers.emulated import _kill_processes_in

    _kill_processes_in("distbench-node2")
    subprocess.run(["ip", "netns", "del", "distbench-node2"], check=True)


def reconnect() -> None:
    """The link back up and at its rate (a cut or throttled link heals)."""
    subprocess.run(["ip", "link", "set", "distbench-v2", "up"], capture_output=True)
    subprocess.run(
        [
            "nsenter",
            "--net=/run/netns/distbench-node2",
            "tc",
            "qdisc",
            "replace",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            "200mbit",
            "burst",
            "256kb",
            "latency",
            "50ms",
        ],
        capture_output=True,
    )


def restore(cluster: object) -> None:
    """Bring the emulated cluster back as it was: up() rebuilds what is still broken (a node
    SLURM set DOWN, a namespace that is gone, a slurmd that was killed)."""
    from launchers import emulated

    emulated.up(cluster)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fault",
    [cut_link, throttle_link, kill_slurmd, tear_down_node],
    ids=["link-cut", "link-throttled", "slurmd-killed", "node-torn-down"],
)
def test_a_cross_node_fault_is_recorded_and_the_sweep_goes_on(
    emulated_nodes: object, output_root: Path, fault: Callable[[], None]
) -> None:
    sweep = _start(output_root)
    try:
        _wait_for_training(output_root)
        faulted_at = time.monotonic()
        fault()
        out, _ = sweep.communicate(timeout=900)
        took = time.monotonic() - faulted_at
        workers_left = _wait_until_gone(SLURM_DAEMONS, limit_s=60)
    finally:
        sweep.kill()
        reconnect()
        # The node answering again: SLURM's own daemons of the faulted job end too.
        slurm_left = _wait_until_gone(frozenset({"slurmd"}), limit_s=90)
        restore(emulated_nodes)
    print(f"{fault.__name__}: the sweep ended {took:.0f} s after the fault")
    faulted, *rest = _results(output_root)
    print(f"  cell 0: {faulted['status']}: {(faulted['error'] or '').splitlines()[:1]}")
    assert rest, "the sweep did not go on to its second cell: " + out[-2000:]
    print(f"  cell 1: {rest[0]['status']}: {(rest[0]['error'] or '').splitlines()[:1]}")
    # Within the collectives' timeout, SLURM's node timeout (30 s) and the launcher's wait for
    # unavailable nodes (30 s), with room for the cells' start-up.
    assert took < PROGRESS_TIMEOUT_S + 30 + 30 + 90, took
    if fault is kill_slurmd:
        # The cell's workers need no slurmd: cell 0 may finish and be recorded ok; the node
        # then goes DOWN (no slurmd answers), so cell 1 cannot start.
        assert faulted["status"] in ("ok", "failed", "timeout"), faulted["status"]
        assert rest[0]["status"] == "failed" and "nodes that cannot run it" in rest[0]["error"]
    else:
        assert faulted["status"] in ("failed", "timeout"), faulted["status"]
        assert faulted["error"], "recorded without its reason"
    assert workers_left == {}, f"a cell's process was left on a node: {workers_left}"
    assert slurm_left == {}, f"SLURM left processes of the job on a node: {slurm_left}"
    again = subprocess.run(
        [sys.executable, "-m", "harness", *SWEEP, f"run.output_dir={output_root}"],
        cwd=output_root.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert again.returncode == 0, again.stdout[-3000:]
    latest = _results(output_root)[-2:]
    assert [r["status"] for r in latest] == ["ok", "ok"] or all(
        r["status"] == "ok" for r in _results(output_root)[2:]
    ), again.stdout[-2000:]
