"""The CUDA path on a real GPU: a cell trains on `hardware.device=cuda` and records the CUDA
allocator's peak, a local cell's workers see the GPU, and DDP's and FSDP2's code runs over a
real NCCL process group.

Skipped where torch sees no CUDA device (CI has none), but for the launcher's GPU settings, which
need none; `scripts/gpu_check.sh` runs these and the measured cells of
docs/benchmarks/2026-11-25-cuda-h100-h200.md ("CUDA on one H100, then on one H200 (2026-11-25 to
2026-11-28)") on a GPU machine. One GPU cannot hold two NCCL ranks (NCCL refuses two ranks on one
device), so the NCCL tests open a group of one rank: the collectives run through NCCL's kernels,
with nothing to exchange.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.records.cell import check_cell
from harness.worker.run import run_cell
from launchers.local import gpu_parameters
from tests.helpers import run_module, tiny_overrides

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device (torch sees none here; CI has no GPU): "
    "run scripts/gpu_check.sh on a GPU machine",
)

CUDA_CELL = ("hardware=h100_1gpu", "tracking.enabled=false")


@needs_cuda
def test_a_cuda_cell_trains_and_records_the_allocators_peak(
    output_root: Path, tmp_path: Path
) -> None:
    result = run_cell(
        check_cell(compose_config(tiny_overrides(output_root, *CUDA_CELL))),
        output_dir=tmp_path / "cell",
    )

    assert result["status"] == "ok", result["error"]
    assert result["environment"]["device_type"] == "cuda"
    assert result["environment"]["memory_kind"] == "cuda_max_allocated"
    # MobileNetV2's weights, gradients and momentum alone are 3 x 9 MB; a CPU process's
    # resident set (what a CPU cell records) would be over 500 MB.
    assert 27 < result["metrics"]["peak_memory_mb"] < 500


@needs_cuda
def test_the_allocators_peak_leaves_out_what_runs_left_out() -> None:
    """The steadiness check's reference kernel (192 MB of matrices on CUDA) runs left out of a
    cell's peak (harness.worker.run); tests/unit/harness/measure/test_metrics.py checks the same on
    the CPU."""
    from harness.measure.metrics import PeakMemory

    memory = PeakMemory(torch.device("cuda", 0))
    memory.reset()
    start = memory.peak_mb()
    with memory.left_out():
        block = torch.empty(256 * 2**20 // 4, device="cuda")  # 256 MB
        del block
    assert memory.peak_mb() < start + 64


@pytest.fixture
def nccl_group() -> Iterator[None]:
    """A real NCCL process group of one rank on GPU 0, closed after the test."""
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _steps(model: torch.nn.Module, steps: int = 3) -> list[float]:
    """Train `model` a few SGD steps on a fixed MNIST-shaped batch on GPU 0; the losses."""
    torch.manual_seed(0)
    images = torch.randn(8, 1, 28, 28, device="cuda")
    labels = torch.randint(0, 10, (8,), device="cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _network(name: str) -> torch.nn.Module:
    from workloads.datasets import dataset_spec
    from workloads.networks import build_network

    torch.manual_seed(0)
    return build_network(name, dataset_spec("mnist")).cuda()


def test_a_local_cells_workers_are_given_this_processs_gpus() -> None:
    # submitit hides every GPU from a local job's tasks unless it is given them.
    assert gpu_parameters("1,3") == {"gpus_per_node": 2, "visible_gpus": (1, 3)}
    assert gpu_parameters("") == {}  # none visible here: none there
    assert gpu_parameters("GPU-5d2a,GPU-77e1") == {
        "setup": ["export CUDA_VISIBLE_DEVICES=GPU-5d2a,GPU-77e1"]
    }
    count = torch.cuda.device_count()
    assert gpu_parameters(None) == (
        {"gpus_per_node": count, "visible_gpus": tuple(range(count))} if count else {}
    )


@needs_cuda
def test_a_two_worker_cuda_cell_trains_on_the_gpu(output_root: Path) -> None:
    """Two DDP workers on GPU 0 over gloo (NCCL refuses two ranks on one GPU), started by the
    local launcher as `python -m harness` starts them."""
    done = run_module(
        "harness",
        tiny_overrides(
            output_root,
            *CUDA_CELL,
            "distribution=ddp",
            "hardware.workers_per_node=2",
            "distribution.backend=gloo",
            "run.epochs=1",
        ),
        cwd=output_root.parent,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (output_root / "runs").glob("*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok", result["error"]
    assert result["environment"]["memory_kind"] == "cuda_max_allocated"
    assert result["metrics"]["world_size"] == 2


@needs_cuda
@pytest.mark.usefixtures("nccl_group")
def test_ddp_trains_over_nccl_with_the_harness_hook() -> None:
    from torch.nn.parallel import DistributedDataParallel

    from harness.distributions.ddp.trainer import TimedAllreduce

    plain = _steps(_network("mobilenetv2"))
    model = DistributedDataParallel(_network("mobilenetv2"), device_ids=[0])
    hook = TimedAllreduce()
    model.register_comm_hook(state=None, hook=hook.hook)

    losses = _steps(model)

    assert dist.get_backend() == "nccl"
    assert hook.waited_in_backward() >= 0.0  # the hook's completion callback ran
    # An allreduce over one rank averages nothing: DDP trains as the plain network does, to
    # the rounding of cuDNN's nondeterministic kernels once the weights were updated (3e-4
    # relative seen at the third step).
    assert losses[0] == pytest.approx(plain[0], rel=1e-6)
    assert losses == pytest.approx(plain, rel=1e-2)


@needs_cuda
@pytest.mark.usefixtures("nccl_group")
def test_fsdp2_shards_and_trains_over_nccl() -> None:
    from torch.distributed.tensor import DTensor

    from harness.distributions.fsdp import fsdp_settings
    from harness.distributions.fsdp.trainer import shard_mesh, shard_network
    from workloads.networks import to_layer_list

    config = validate(compose_config(["distribution=fsdp", "network=mobilenetv2", *CUDA_CELL]))
    network = _network("mobilenetv2")
    mesh = shard_mesh(config, "cuda")
    shard_network(network, to_layer_list(config.network.ref, network), mesh, fsdp_settings(config))

    losses = _steps(network)

    assert all(isinstance(p, DTensor) and p.device.type == "cuda" for p in network.parameters())
    assert all(loss == loss for loss in losses) and losses[-1] < losses[0]


@needs_cuda
def test_a_pipeline_profiles_its_cpu_built_layers_on_the_gpu_and_puts_them_back() -> None:
    from harness.distributions.pipeline import profile_network
    from workloads.datasets import dataset_spec
    from workloads.networks import build_network, to_layer_list

    config = validate(
        compose_config(
            [
                "distribution=gpipe",
                "hardware.workers_per_node=2",
                "distribution.batch_size=64",
                *CUDA_CELL,
            ]
        )
    )
    layers = to_layer_list("resnet18", build_network("resnet18", dataset_spec("mnist")))

    profile = profile_network(config, layers, torch.device("cuda", 0))

    assert profile.device == "cuda:0" and len(profile.layers) == len(layers)
    assert {p.device.type for layer in layers for p in layer.parameters()} == {"cpu"}


@needs_cuda
def test_the_runtime_share_on_cuda_is_the_context_and_the_math_libraries_workspaces() -> None:
    """`predict.runtime` on CUDA: the context outside torch's allocator, and the workspaces
    cuBLAS and cuBLASLt keep in it (on an H200 the real cells' peaks held two blocks of
    32 MiB beyond the model: docs/benchmarks/2026-12-01-cuda-allocator-history.md, "The memory
    model against the CUDA allocator's history (one H200, 2026-12-01)")."""
    from harness.worker.runtime_memory import RuntimeProbe

    reading = RuntimeProbe(
        validate(
            compose_config(["dataset=cifar10", "hardware=h100_1gpu", "tracking.enabled=false"])
        )
    ).reading()

    assert reading["context_mb"] > 100  # a CUDA context is hundreds of MB (804 on an H100)
    assert 0 < reading["workspaces_mb"] < 1000
    assert reading["runtime_mb"] == pytest.approx(reading["context_mb"] + reading["workspaces_mb"])
