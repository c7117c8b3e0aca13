"""Benchmark (`-m perf`): FSDP2's collectives against an allreduce of the same bytes, over gloo.

harness.distributions.fsdp predicts an all-gather and a reduce-scatter of M bytes as a share
of an allreduce of M bytes among the same workers (the hardware probe measures allreduces):
`GLOO_SHARE` on CPU workers. This measures those shares again: 2 and 4 gloo workers on this
machine, one thread each, several message sizes, median of REPEATS after WARM_UP, each
collective between barriers. Run it on a quiet machine:

    .venv/bin/python -m pytest tests/benchmarks/test_fsdp_collectives.py -m perf -s
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from harness.distributions.fsdp import GLOO_SHARE
from tests.helpers import spawn_workers
from tests.unit.harness.distributions.test_gpipe import free_port

pytestmark = pytest.mark.perf

SIZES_MB = (0.4, 4.0, 16.0)
WARM_UP, REPEATS = 3, 12


def _median_seconds(collective: Callable[..., object], *tensors: torch.Tensor) -> float:
    seconds = []
    for attempt in range(WARM_UP + REPEATS):
        dist.barrier()
        start = time.perf_counter()
        collective(*tensors)
        if attempt >= WARM_UP:
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=120),
    )
    torch.set_num_threads(1)
    try:
        rows = []
        for size_mb in SIZES_MB:
            elements = int(size_mb * 1e6 / 4) // world_size * world_size
            whole, shard = torch.ones(elements), torch.ones(elements // world_size)
            gathered, scattered = torch.empty(elements), torch.empty(elements // world_size)
            allreduce = _median_seconds(dist.all_reduce, whole)
            gather = _median_seconds(dist.all_gather_into_tensor, gathered, shard)
            scatter = _median_seconds(dist.reduce_scatter_tensor, scattered, whole)
            rows.append(
                {
                    "mb": size_mb,
                    "allreduce_ms": allreduce * 1e3,
                    "all_gather": gather / allreduce,
                    "reduce_scatter": scatter / allreduce,
                }
            )
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("workers", [2, 4])
def test_gloo_collective_shares(workers: int, tmp_path: Path) -> None:
    out = tmp_path / "shares.json"
    spawn_workers(_worker, args=(workers, free_port(), str(out)), nprocs=workers)
    rows = json.loads(out.read_text())
    for row in rows:
        print(
            f"{workers} workers, {row['mb']:5.1f} MB: allreduce {row['allreduce_ms']:.2f} ms, "
            f"all-gather {row['all_gather']:.2f}x, reduce-scatter {row['reduce_scatter']:.2f}x "
            f"(the model: {GLOO_SHARE['all_gather']}x, {GLOO_SHARE['reduce_scatter']}x)"
        )
    assert all(row["all_gather"] > 0 and row["reduce_scatter"] > 0 for row in rows)
