"""GPipe on CPU workers (gloo): gradients equal the sequential model's, and a whole cell runs.

The gradient tests start their workers with tests.helpers.spawn_workers and a gloo group on
127.0.0.1; each worker builds the real trainer from a composed config, runs the schedule over
one batch without stepping, and rank 0 compares every stage's gradients with the sequential
model's on the same batch.
"""

from __future__ import annotations

import datetime as dt
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from harness.compose import compose_config
from harness.config import validate
from harness.distributed import WorkerSession
from harness.distributions.base import TrainingContext
from harness.distributions.gpipe.trainer import GPipeTrainer
from harness.metrics import PhaseClock
from harness.worker_env import WorkerEnvironment
from harness.workload import build_workload
from tests.helpers import run_tiny_cell, spawn_workers
from workloads.networks import build_network, to_layer_list

BATCH, MICRO_BATCHES = 8, 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gpipe_overrides(workers: int, recompute: str, balance: str) -> list[str]:
    hardware = "local_2cpu" if workers == 2 else "local_4cpu"
    return ["distribution=gpipe", f"hardware={hardware}", "dataset=mnist",
            "network=vgg11", f"distribution.batch_size={BATCH}",
            f"distribution.micro_batches={MICRO_BATCHES}", f"distribution.recompute={recompute}",
            f"distribution.balance={balance}", "dataset.num_samples=16"]


def worker_context(rank: int, world_size: int, overrides: list[str]) -> TrainingContext:
    """The context `harness.worker.run.measure` would build for this worker, in a spawned
    process."""
    torch.set_num_threads(1)
    config = validate(compose_config(overrides))
    workload = build_workload(config)  # pipelines do not shard the data by worker
    env = WorkerEnvironment(rank=rank, world_size=world_size)
    return TrainingContext(config=config, workload=workload, device=torch.device("cpu"),
                           clock=PhaseClock(torch.device("cpu")),
                           session=WorkerSession(env, backend="gloo"), heartbeat=lambda: None)


def _gradients_worker(rank: int, world_size: int, port: int, overrides: list[str]) -> None:
    # A bounded timeout: a schedule that deadlocks fails the test instead of hanging it.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=dt.timedelta(seconds=120))
    try:
        context = worker_context(rank, world_size, overrides)
        trainer = GPipeTrainer(context)
        row = trainer.batches.indices(0)[0]
        trainer.accumulate_gradients(*trainer._inputs(row))
        stage = trainer.plan.stages[trainer.stage_index]
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, (stage.first, stage.end, _flat(trainer.module)))
        if rank == 0:
            images, labels = trainer.batches.fetch(row)
            _compare(context, gathered, images, labels)
    finally:
        dist.destroy_process_group()


def _flat(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(parameter name, gradient) of a stage, names relative to the stage's first layer."""
    return [(name, p.grad.clone()) for name, p in module.named_parameters()]


def _compare(context: TrainingContext, gathered: list, images: torch.Tensor,
             labels: torch.Tensor) -> None:
    """The sequential model, fresh from the same seed, over the same micro-batches."""
    config = context.config
    torch.manual_seed(config.run.seed)
    model = build_network(config.network.name, context.workload.spec)
    layers = to_layer_list(config.network.name, model)
    sequential = nn.Sequential(*layers)
    criterion = nn.CrossEntropyLoss()
    # GPipe's gradient is the mean over micro-batches of each micro-batch's mean loss (each
    # micro-batch normalises its own BatchNorm statistics, as GPipe's stages do).
    for x, y in zip(images.chunk(MICRO_BATCHES), labels.chunk(MICRO_BATCHES)):
        (criterion(sequential(x), y) / MICRO_BATCHES).backward()
    checked = 0
    for first, end, stage_grads in gathered:
        reference = dict(nn.Sequential(*layers[first:end]).named_parameters())
        assert len(stage_grads) == len(reference) > 0
        for name, grad in stage_grads:
            where = f"stage [{first}:{end}] {name}"
            torch.testing.assert_close(grad, reference[name].grad, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, where=where: f"{where}: {m}")
            checked += 1
    assert checked == len(list(model.parameters()))


@pytest.mark.parametrize("recompute", ["always", "except_last", "never"])
def test_gpipe_gradients_equal_the_sequential_models_on_two_stages(recompute: str) -> None:
    overrides = gpipe_overrides(2, recompute, "[11,20]")
    build_workload(validate(compose_config(overrides)))  # the synthetic cache, once
    spawn_workers(_gradients_worker, args=(2, free_port(), overrides), nprocs=2)


def test_gpipe_gradients_equal_the_sequential_models_on_three_stages() -> None:
    overrides = [*gpipe_overrides(3, "except_last", "[8,5,18]"), "hardware.workers_per_node=3"]
    # The third stage starts with an in-place ReLU, which must not modify its received input.
    build_workload(validate(compose_config(overrides)))
    spawn_workers(_gradients_worker, args=(3, free_port(), overrides), nprocs=3)


def test_a_gpipe_cell_runs_end_to_end_and_records_its_plan(output_root: Path) -> None:
    result = run_tiny_cell(output_root, "distribution=gpipe", "hardware=local_2cpu",
                           "distribution.micro_batches=4")
    metrics = result["metrics"]
    assert metrics["world_size"] == 2 and metrics["replicas_in_sync"] == 1.0
    assert metrics["samples_per_epoch"] == 16 and metrics["batches_per_epoch"] == 2
    assert metrics["micro_batches"] == 4 and metrics["micro_batch_size"] == 2
    assert 0 <= metrics["bubble_stage0"] < 1 and 0 <= metrics["bubble_stage1"] < 1
    # Where each stage spent its epochs: its own phases, which the workers' means blur.
    for stage in (0, 1):
        phases = {phase: metrics[f"{phase}_seconds_per_epoch_stage{stage}"]
                  for phase in ("forward", "backward", "optimizer")}
        assert phases["forward"] > 0 and phases["backward"] > 0
        assert sum(phases.values()) < metrics["seconds_per_epoch_max"]
    assert metrics["forward_seconds_per_epoch"] == pytest.approx(
        (metrics["forward_seconds_per_epoch_stage0"]
         + metrics["forward_seconds_per_epoch_stage1"]) / 2)
    distribution = result["config"]["distribution"]
    assert distribution["micro_batches"] == 4
    assert len(distribution["balance"]) == 2 and sum(distribution["balance"]) == 23
