"""`hardware.device_memory_gb` enforced on CPU workers (harness.worker.memory_limit): a cell over
its limit is recorded `oom`, one under it runs; real cells in real processes."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.config.schema import Device, HardwareConfig
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from harness.records.tracking import error_tag
from harness.worker.memory_limit import WorkerOverBudget, device_memory_limit, process_memory
from tests.helpers import cell_worker_pids, run_module

# Small and quick: the over-limit cells run out during their first warm-up batch.
CELL = [
    "dataset=mnist",
    "run.epochs=1",
    "run.warmup_batches=1",
    "run.progress=false",
    "tracking.experiment=memory_limit",
]
# A fresh worker holds about 0.9 GB (RSS) before its cell starts (torch's CUDA build, MLflow,
# Hydra imported; 0.7 GB of it library code); this budget leaves about 0.5 GB: enough for
# MobileNetV2 at batch 8 (peak 1.13 GB here), far too little for VGG-16 at batch 256 (VGG-16
# at batch 128 peaks at 1.58 GB).
TIGHT_GB = 1.4


def _result(output_root: Path) -> dict:
    (path,) = (output_root / "runs").glob("*/result.json")
    return json.loads(path.read_text())


def _mlflow_tags(output_root: Path, run_id: str) -> dict[str, str]:
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    return client.get_run(run_id).data.tags


def _assert_oom(result: dict) -> str:
    """The result says `oom`, headed by one line naming the limit and the allocator's error;
    that line."""
    assert result["status"] == "oom", result["error"]
    headline = result["error"].splitlines()[0]
    assert f"ran out of memory under hardware.device_memory_gb={TIGHT_GB:g} " in headline
    assert "RLIMIT_DATA" in headline
    assert "can't allocate memory" in headline or "MemoryError" in headline
    return headline


def test_a_sequential_cell_over_its_limit_is_oom_and_one_under_it_runs(output_root: Path) -> None:
    limit = f"hardware.device_memory_gb={TIGHT_GB}"
    over = run_module(
        "harness",
        [
            *CELL,
            "network=vgg16",
            "distribution.batch_size=256",
            "dataset.num_samples=256",
            limit,
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
    )
    assert over.returncode == 1, over.stderr[-3000:]  # the cell did not end ok
    result = _result(output_root)
    _assert_oom(result)
    assert "\n" not in result["error"]  # one worker: the error is one line
    assert not result["metrics"]
    tags = _mlflow_tags(output_root, result["mlflow_run_id"])
    assert tags["status"] == "oom" and tags["error"] == result["error"]

    under_root = output_root.parent / "under"
    under = run_module(
        "harness",
        [
            *CELL,
            "network=mobilenetv2",
            "distribution.batch_size=8",
            "dataset.num_samples=16",
            limit,
            "tracking.enabled=false",
            f"run.output_dir={under_root}",
        ],
        cwd=output_root.parent,
    )
    assert under.returncode == 0, under.stderr[-3000:]
    result = _result(under_root)
    assert result["status"] == "ok", result["error"]
    # Its peak resident set stayed within the budget it ran under.
    assert result["metrics"]["peak_memory_mb"] < TIGHT_GB * 1000
    assert f"memory limit: hardware.device_memory_gb={TIGHT_GB:g} " in under.stdout + under.stderr


def test_a_ddp_cell_over_its_limit_is_oom_and_no_worker_hangs(output_root: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            *CELL,
            "hardware=local_2cpu",
            "distribution=ddp",
            "network=vgg16",
            "distribution.batch_size=256",
            "dataset.num_samples=512",
            f"hardware.device_memory_gb={TIGHT_GB}",
            "run.progress_timeout_s=120",
            "tracking.enabled=false",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-3000:]  # the cell did not end ok
    result = _result(output_root)
    _assert_oom(result)  # (the first rank that ran out heads the workers' reports)
    assert "--- rank 0: " in result["error"] and "--- rank 1: " in result["error"]
    # The peers failed fast (no collective waited for run.progress_timeout_s) and are gone.
    assert time.monotonic() - started < 120
    assert not cell_worker_pids(output_root)


def test_the_limit_is_set_for_the_block_and_lifted_after() -> None:
    before = resource.getrlimit(resource.RLIMIT_DATA)
    hardware = HardwareConfig(device_memory_gb=100.0)
    with device_memory_limit(hardware) as limit:
        assert limit is not None
        soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
        assert soft == limit.data_limit_bytes
        # VmData now + (budget - RSS now): the resident memory already held counts.
        assert limit.data_limit_bytes == (
            limit.data_at_start_bytes + 100 * 10**9 - limit.rss_at_start_bytes
        )
    assert resource.getrlimit(resource.RLIMIT_DATA) == before

    with pytest.raises(RuntimeError), device_memory_limit(hardware):
        raise RuntimeError("a failing cell")
    assert resource.getrlimit(resource.RLIMIT_DATA) == before


def test_nothing_is_enforced_on_cuda_or_without_a_size() -> None:
    before = resource.getrlimit(resource.RLIMIT_DATA)
    for hardware in (
        HardwareConfig(device=Device.cuda, device_memory_gb=1.0),
        HardwareConfig(device_memory_gb=None),
    ):
        with device_memory_limit(hardware) as limit:
            assert limit is None
            assert resource.getrlimit(resource.RLIMIT_DATA) == before


def test_a_worker_already_over_its_budget_is_oom_at_once() -> None:
    tiny = process_memory()["VmRSS"] / 2 / 10**9
    with (
        pytest.raises(WorkerOverBudget, match="more than hardware.device_memory_gb"),
        device_memory_limit(HardwareConfig(device_memory_gb=tiny)),
    ):
        pass


def test_a_long_error_keeps_its_headline_in_mlflow() -> None:
    error = "rank 1 ran out of memory\n" + "x" * 10_000 + "\nthe end"
    tag = error_tag(error)
    assert len(tag) <= 5000
    assert tag.startswith("rank 1 ran out of memory\n") and tag.endswith("the end")
    assert error_tag("short\nerror") == "short\nerror"
