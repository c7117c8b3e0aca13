"""Benchmark (`-m perf`): FSDP2's collectives across two emulated nodes, at each network's units.

What docs/benchmarks/2026-11-29-fsdp-collectives-after-compute.md, "FSDP2's collectives between
nodes, timed after compute (2026-11-29)", measured to find why FSDP's model missed across nodes: two
gloo workers, one in each node's namespace on its own cores, run `all_gather_into_tensor`,
`reduce_scatter_tensor` and `all_reduce` at the exact sizes of each calibration network's FSDP units
(each layer-list entry with parameters), median of REPEATS, back to back (between barriers) and each
after COMPUTE_MS of compute (as FSDP issues them). Printed: per network, the all-gather and the
reduce-scatter summed over the units as multiples of the allreduce of the same bytes, both ways.
Needs root (the emulated nodes); about 6 minutes at 100 Mbit/s:

    .venv/bin/python -m pytest tests/benchmarks/test_fsdp_units_across_nodes.py -m perf -s
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.perf

EMULATED_HARDWARE = "emulated_2nodes_100mbit"
NETWORKS = ("mobilenetv2", "resnet18", "vgg16", "resnet50")
COMPUTE_MS, REPEATS, PORT = 20.0, 3, 29555

_WORKER = """
import json, os, statistics, sys, time
import torch, torch.distributed as dist

rank, master, compute_ms, repeats, units, out = (int(sys.argv[1]), sys.argv[2],
    float(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5]), sys.argv[6])
os.environ["GLOO_SOCKET_IFNAME"] = "eth0"  # the node's own link, never loopback
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=2)
left, right = torch.randn(256, 256), torch.randn(256, 256)

def median_seconds(collective, after_compute):
    seconds = []
    for _ in range(repeats):
        if after_compute:
            until = time.perf_counter() + compute_ms / 1e3
            while time.perf_counter() < until:
                left @ right
        else:
            dist.barrier()
        start = time.perf_counter()
        collective()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)

rows = {}
for network, sizes_mb in units.items():
    rows[network] = []
    for megabytes in sizes_mb:
        elements = max(int(megabytes * 1e6 / 4) // 2 * 2, 2)
        whole, shard = torch.randn(elements), torch.randn(elements // 2)
        for after in (False, True):
            rows[network].append({"mb": megabytes, "after_compute": after, **{
                name: median_seconds(collective, after) for name, collective in (
                    ("all_gather", lambda: dist.all_gather_into_tensor(whole, shard)),
                    ("reduce_scatter", lambda: dist.reduce_scatter_tensor(shard, whole)),
                    ("allreduce", lambda: dist.all_reduce(whole)))}})
if rank == 0:
    with open(out, "w") as f:
        json.dump(rows, f)
dist.destroy_process_group()
"""


def _units_mb() -> dict[str, list[float]]:
    """Each network's FSDP units (MB of float32 weights), as `distributions.fsdp` makes them."""
    from workloads.datasets import dataset_spec
    from workloads.networks.layers import build_layer_list

    spec = dataset_spec("cifar10")
    units = {}
    for network in NETWORKS:
        counts = [
            sum(p.numel() for p in layer.parameters()) for layer in build_layer_list(network, spec)
        ]
        units[network] = [count * 4 / 1e6 for count in counts if count]
    return units


def test_fsdp_units_timed_across_emulated_nodes(
    emulated_nodes: object, tmp_path: Path, benchmark
) -> None:  # noqa: ANN001
    nodes = emulated_nodes.nodes  # type: ignore[attr-defined]
    master = f"{nodes[0].address}:{PORT}"
    out, units = tmp_path / "units.json", json.dumps(_units_mb())

    def measure() -> None:
        workers = [
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    node.namespace,
                    "taskset",
                    "-c",
                    ",".join(map(str, node.cores)),
                    sys.executable,
                    "-c",
                    textwrap.dedent(_WORKER),
                    str(rank),
                    master,
                    str(COMPUTE_MS),
                    str(REPEATS),
                    units,
                    str(out),
                ],
                cwd=Path(__file__).parents[2],
            )
            for rank, node in enumerate(nodes[:2])
        ]
        assert [worker.wait(timeout=1800) for worker in workers] == [0, 0]

    benchmark.pedantic(measure, rounds=1, iterations=1)
    for network, rows in json.loads(out.read_text()).items():
        for after in (False, True):
            timed = [row for row in rows if row["after_compute"] is after]
            total = {
                key: sum(row[key] for row in timed)
                for key in ("all_gather", "reduce_scatter", "allreduce")
            }
            shares = {
                key: total[key] / total["allreduce"] for key in ("all_gather", "reduce_scatter")
            }
            when = f"after {COMPUTE_MS:.0f} ms of compute" if after else "back to back"
            benchmark.extra_info[f"{network}, {when}"] = {k: round(v, 3) for k, v in shares.items()}
            print(
                f"{network:12s} {when:26s} all-gather {shares['all_gather']:.2f}x, "
                f"reduce-scatter {shares['reduce_scatter']:.2f}x the allreduce "
                f"({total['allreduce']:.3f} s over {len(timed)} units)"
            )
            assert all(row[key] > 0 for row in timed for key in total)
