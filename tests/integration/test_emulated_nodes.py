"""Cells across nodes emulated on this machine (launchers.emulated): two network namespaces with
their own addresses and cores, joined by a link shaped to 200 Mbit/s, and a real SLURM cluster
whose slurmd runs inside each node. Skipped, with the reason, where namespaces cannot be made.

What the loopback SLURM cluster (tests/integration/test_slurm.py) cannot show: that a cell's traffic
leaves its node over the node's own link and address, that nothing of it listens beyond that address
and loopback, and that the probe sees the link's real rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.profiles.hardware import HardwareProfile
from tests.helpers import cell_worker_pids

EMULATED_HARDWARE = "emulated_2nodes_200mbit"  # the conftest fixture brings it up
RATE_BYTES_PER_S = 200e6 / 8
SWEEP = [
    "-m",
    "hydra/launcher=submitit_slurm",
    f"hardware={EMULATED_HARDWARE}",
    "hydra.launcher.timeout_min=10",
    "network=mobilenetv2",
    "dataset=mnist",
    "distribution.batch_size=8",
    "dataset.num_samples=32",
    "run.epochs=1",
    "run.warmup_batches=1",
    "run.progress=false",
    "tracking.enabled=false",  # what the tests read is in result.json: no MLflow store to fill
]

pytestmark = pytest.mark.slow


def _harness(
    output_root: Path, module: str, *overrides: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *overrides, f"run.output_dir={output_root}"],
        cwd=output_root.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def _results(output_root: Path) -> list[dict]:
    paths = (output_root / "sweeps").glob("*/*/*/result.json")
    return [
        json.loads(p.read_text())
        for p in sorted(paths, key=lambda p: (p.parent.parent.name, int(p.parent.name)))
    ]


def test_cells_across_emulated_nodes_talk_over_the_shaped_link_only(
    emulated_nodes: object, output_root: Path
) -> None:
    """Data parallelism (torch's gloo, Horovod's gloo) and a pipeline across the two nodes:
    every cell's bytes cross the nodes' links; each node's loopback carries only rank 0's
    rendezvous client talking to its own store (kilobytes)."""
    done = _harness(output_root, "harness", *SWEEP, "distribution=ddp,horovod,gpipe")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = _results(output_root)
    assert [r["config"]["distribution"]["name"] for r in results] == ["ddp", "horovod", "gpipe"]
    for result in results:
        metrics, environment = result["metrics"], result["environment"]
        assert result["status"] == "ok", result["error"]
        assert environment["slurm_nodelist"] == "enode[1-2]"
        assert environment["link"] == "tbf rate 200mbit burst 256kb latency 50ms on eth0"
        assert metrics["link_sent_mb"] > 1.0, metrics  # a MobileNetV2's gradients, activations
        assert metrics["loopback_sent_mb"] < 0.1, metrics
    ddp, horovod, _ = results
    # Data parallelism allreduces the same gradients, whichever library does it.
    assert horovod["metrics"]["link_sent_mb"] == pytest.approx(
        ddp["metrics"]["link_sent_mb"], rel=0.3
    )


def test_the_probe_measures_the_shaped_rate(emulated_nodes: object, output_root: Path) -> None:
    done = _harness(
        output_root,
        "harness.probe",
        "hydra/launcher=submitit_slurm",
        f"hardware={EMULATED_HARDWARE}",
        "probe.repeats=3",
        "probe.warmup=1",
        "probe.message_bytes=[8,1048576,4194304]",
        "probe.rounds=2",
        "tracking.enabled=false",
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (path,) = (output_root / "hardware_profiles").glob("*.json")
    profile = HardwareProfile.load(path)
    (link,) = profile.links
    assert not link.same_node
    assert link.cost.bandwidth_bytes_per_s == pytest.approx(RATE_BYTES_PER_S, rel=0.10)
    assert profile.facts["hosts"] == ["enode1", "enode2"]
    assert (
        profile.facts["link_shaping"] == ["tbf rate 200mbit burst 256kb latency 50ms on eth0"] * 2
    )
    assert "links shaped to 200 Mbit/s (25.0 MB/s): measured" in done.stdout
    # What an allreduce between the nodes takes from a worker's compute beside it: each
    # worker's, measured (2.4 ms per MB on the 1 Gbit/s link: BENCHMARKS.md, "The links, as the
    # probe sees them").
    assert len(profile.facts["compute_lost_ms_per_mb_per_worker"]) == 2
    assert 0 < profile.compute_lost_s_per_mb() < 0.1
    assert "ms of a worker's compute per MB" in done.stdout
    # each worker's loss measured in both rounds, its median kept
    assert "compute lost" in profile.facts["probe_rounds"]["spread"]
    # FSDP's collectives timed after compute, at each size: a 4 MB all-gather puts 2 MB on
    # each worker's link, which the rate lets through in no less than 2 MB / 25 MB/s, less
    # its bucket
    after = profile.facts["collectives_after_compute"]
    assert (after["workers"], after["bytes"]) == (2, [8.0, 1048576.0, 4194304.0])
    gather = profile.collective_after_compute("all_gather", 2)
    scatter = profile.collective_after_compute("reduce_scatter", 2)
    assert gather is not None and scatter is not None
    assert gather.seconds_at(4194304) >= (4194304 / 2 - 256 * 1024) / RATE_BYTES_PER_S
    assert scatter.seconds_at(4194304) >= (4194304 / 2 - 256 * 1024) / RATE_BYTES_PER_S
    assert "ms of compute, an all-gather of 4.2 MB among 2 takes" in done.stdout


def _listening(namespace: str) -> dict[int, set[str]]:
    """pid -> the addresses it listens on (TCP), inside a node's network namespace."""
    shown = subprocess.run(
        ["nsenter", f"--net=/run/netns/{namespace}", "ss", "-Hltnp"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listening: dict[int, set[str]] = {}
    for line in shown.splitlines():
        fields = line.split()
        address = fields[3].rsplit(":", 1)[0].strip("[]")
        for entry in fields[5:]:
            for part in entry.split("pid=")[1:]:
                listening.setdefault(int(part.split(",")[0]), set()).add(address)
    return listening


def test_a_cells_workers_listen_on_their_node_address_and_loopback_only(
    emulated_nodes: object, output_root: Path
) -> None:
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            *SWEEP,
            "distribution=ddp",
            "run.epochs=200",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        workers = _wait_for_workers(output_root)
        addresses = {"distbench-node1": "198.18.0.11", "distbench-node2": "198.18.0.12"}
        seen = {}
        for namespace, address in addresses.items():
            for pid, listened in _listening(namespace).items():
                if pid in workers.values():
                    seen[pid] = listened
                    assert listened <= {address, "127.0.0.1"}, (namespace, pid, listened)
        assert set(seen) == set(workers.values())  # each worker listens (gloo, the store)
    finally:
        sweep.terminate()
        sweep.wait(timeout=120)


def _wait_for_workers(output_root: Path, timeout: float = 120) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = list((output_root / "sweeps").rglob("*_0_log.out"))
        if logs and "epoch 1/" in logs[0].read_text():
            workers = cell_worker_pids(output_root)
            if len(workers) == 2:
                return workers
        time.sleep(0.3)
    raise AssertionError("the cell never started training")


def test_a_new_clusters_job_ids_follow_the_clock_and_stay_below_slurms_limit() -> None:
    """A cluster brought up again must not reuse the job ids a re-run sweep's notes name."""
    from launchers.emulated import first_job_id

    assert first_job_id(1_000_000.0) < first_job_id(1_000_060.0)  # a minute later: higher
    assert all(1 <= first_job_id(t) < 67_043_328 for t in (0.0, 599_999.0, time.time()))


def test_tear_down_and_bring_up_leave_nothing_and_take_under_30_s(emulated_nodes: object) -> None:
    """Last in the module: down, check that nothing is left, then up again (the fixture takes
    it down at the end)."""
    from launchers import emulated

    cluster = emulated.current()
    assert cluster is not None
    started = time.monotonic()
    emulated.down()
    took_down = time.monotonic() - started
    assert emulated.leftovers() == []
    assert (
        "distbench"
        not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )
    assert emulated.daemon_pids("slurmd") == [] and emulated.daemon_pids("slurmctld") == []
    started = time.monotonic()
    emulated.up(cluster)
    took_up = time.monotonic() - started
    assert took_down + took_up < 30, (took_down, took_up)
