"""Where a cell's servers listen: a single-machine cell opens no socket beyond loopback.

Its workers' rendezvous store (rank 0's TCPStore), gloo's pair sockets, Horovod's rendezvous
server and its gloo controller are all reachable from this machine only. The test starts real
2-worker cells and reads, while they train, the listening TCP sockets of every one of their
processes (psutil reads the kernel's socket table and matches it to each process's sockets).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.system.processes import descendants
from tests.helpers import cell_worker_pids

LOOPBACK = {"127.0.0.1", "::1"}
# Long enough to be still training when the sockets are read (the cell is killed then); short
# epochs (2 batches per worker), so that the first, which the test waits for, ends soon.
_LONG_CELL = [
    "hardware=local_2cpu",
    "network=mobilenetv2",
    "dataset=mnist",
    "distribution.batch_size=8",
    "dataset.num_samples=32",
    "run.epochs=800",
    "run.warmup_batches=0",
    "run.progress=false",
]


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on (none if it is gone)."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return set()
    return {(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}


def _tree(pid: int) -> set[int]:
    """`pid` and every process below it."""
    return {pid} | {process.pid for process in descendants(pid)}


def _wait_for_training(
    output_root: Path, cell: subprocess.Popen[bytes], timeout: float = 150
) -> None:
    """Until both workers run and rank 0 has finished an epoch (every server is up by then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert cell.poll() is None, "the cell ended before its sockets were read"
        logs = list((output_root / "runs").glob("*/.submitit/*/*_0_log.err"))
        if logs and "epoch 1/" in logs[0].read_text() and len(cell_worker_pids(output_root)) == 2:
            return
        time.sleep(0.2)
    raise AssertionError("the 2-worker cell never started training")


@pytest.mark.slow
@pytest.mark.parametrize("distribution", ["ddp", "horovod"])
def test_a_single_machine_cell_listens_on_loopback_only(
    output_root: Path, distribution: str
) -> None:
    cell = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            *_LONG_CELL,
            f"distribution={distribution}",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    listening: dict[int, set[tuple[str, int]]] = {}
    try:
        _wait_for_training(output_root, cell)
        workers = cell_worker_pids(output_root)
        for _ in range(5):  # a few reads, in case a server opens or closes mid-training
            for pid in {*_tree(cell.pid), *workers.values()}:
                listening.setdefault(pid, set()).update(listening_addresses(pid))
            time.sleep(0.2)
    finally:
        cell.kill()  # its workers follow the launcher (launchers/local.py follow_launcher)
        cell.wait(timeout=30)
        deadline = time.monotonic() + 30
        while cell_worker_pids(output_root) and time.monotonic() < deadline:
            time.sleep(0.2)
    # Each worker listens (gloo's pairs; rank 0 also the store): the reads saw the servers.
    assert all(listening.get(pid) for pid in workers.values()), listening
    beyond = {
        pid: sorted(a for a in addresses if a[0] not in LOOPBACK)
        for pid, addresses in listening.items()
    }
    assert not any(beyond.values()), f"listening beyond loopback: {beyond}"
    assert not cell_worker_pids(output_root)
