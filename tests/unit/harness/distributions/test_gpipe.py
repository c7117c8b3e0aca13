"""GPipe on CPU workers (gloo): gradients equal the sequential model's, and a whole cell runs.

The gradient tests start their workers with tests.helpers.spawn_workers and a gloo group on
127.0.0.1; each worker builds the real trainer from a composed config, runs the schedule over
one batch without stepping, and rank 0 compares every stage's gradients with the sequential
model's on the same batch.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.costs.partition import Stage, StagePlan
from harness.costs.terms import CellFacts, LayerFacts
from harness.distributions.base import TrainingContext
from harness.distributions.gpipe import epoch_terms
from harness.distributions.gpipe.trainer import GPipeTrainer
from harness.measure.metrics import PhaseClock
from harness.predict.facts.store import FactsStore, in_place_key
from harness.profiles.hardware import HardwareProfile
from harness.profiles.stages import InPlaceStages, StageSeconds
from harness.runtime.distributed import Peers
from harness.runtime.workload import build_workload
from harness.system.worker_env import WorkerEnvironment
from tests.helpers import assert_stage_phases, run_module, run_tiny_cell, spawn_workers
from workloads.networks import build_network, to_layer_list

BATCH, MICRO_BATCHES = 8, 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gpipe_overrides(workers: int, recompute: str, balance: str) -> list[str]:
    hardware = "local_2cpu" if workers == 2 else "local_4cpu"
    return [
        "distribution=gpipe",
        f"hardware={hardware}",
        "dataset=mnist",
        "network=vgg11",
        f"distribution.batch_size={BATCH}",
        f"distribution.micro_batches={MICRO_BATCHES}",
        f"distribution.recompute={recompute}",
        f"distribution.balance={balance}",
        "dataset.num_samples=16",
    ]


def worker_context(rank: int, world_size: int, overrides: list[str]) -> TrainingContext:
    """The context `harness.worker.run.measure` would build for this worker, in a spawned
    process."""
    torch.set_num_threads(1)
    config = validate(compose_config(overrides))
    workload = build_workload(config)  # pipelines do not shard the data by worker
    env = WorkerEnvironment(rank=rank, world_size=world_size)
    return TrainingContext(
        config=config,
        workload=workload,
        device=torch.device("cpu"),
        clock=PhaseClock(torch.device("cpu")),
        peers=Peers(env, backend="gloo"),
        heartbeat=lambda: None,
    )


def _gradients_worker(rank: int, world_size: int, port: int, overrides: list[str]) -> None:
    # A bounded timeout: a schedule that deadlocks fails the test instead of hanging it.
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=120),
    )
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


def _compare(
    context: TrainingContext, gathered: list, images: torch.Tensor, labels: torch.Tensor
) -> None:
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
            torch.testing.assert_close(
                grad,
                reference[name].grad,
                rtol=1e-4,
                atol=1e-5,
                msg=lambda m, where=where: f"{where}: {m}",
            )
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
    result = run_tiny_cell(
        output_root, "distribution=gpipe", "hardware=local_2cpu", "distribution.micro_batches=4"
    )
    metrics = result["metrics"]
    assert metrics["world_size"] == 2 and metrics["replicas_in_sync"] == 1.0
    assert metrics["samples_per_epoch"] == 16 and metrics["batches_per_epoch"] == 2
    assert metrics["micro_batches"] == 4 and metrics["micro_batch_size"] == 2
    assert 0 <= metrics["bubble_stage0"] < 1 and 0 <= metrics["bubble_stage1"] < 1
    assert_stage_phases(metrics, stages=2)
    distribution = result["config"]["distribution"]
    assert distribution["micro_batches"] == 4
    assert len(distribution["balance"]) == 2 and sum(distribution["balance"]) == 23


def _plan_facts(in_place: InPlaceStages | None) -> tuple[object, CellFacts]:
    """A two-stage GPipe cell over four equal layers, and its facts (a 1 s step at the
    micro-batch), with or without its stages timed in place."""
    config = validate(
        compose_config([*gpipe_overrides(2, "always", "[16,15]"), "hardware.cpu_threads=1"])
    )
    layer = LayerFacts(
        weights_mb=1.0,
        activation_mb_per_sample=0.001,
        compute_share=0.25,
        forward_share=0.08,
        backward_share=0.16,
        update_share=0.01,
    )
    plan = StagePlan((Stage(0, 2, 1), Stage(2, 2, 1)))
    return config, CellFacts(
        weights_mb=4.0,
        gradient_mb=4.0,
        input_mb_per_sample=0.001,
        layers=[layer] * 4,
        step_seconds=1.0,
        step_batch=2,
        plan=plan,
        stages_in_place=in_place,
    )


def test_stages_timed_in_place_replace_the_layers_shares_in_gpipes_schedule() -> None:
    """Timed in place, a stage's backward holds its recomputation already: the schedule is
    the fill-drain over the timed stages, sum + (micro-batches - 1) x slowest, per phase."""
    timed = InPlaceStages(
        (StageSeconds(0.10, 0.30, 0.01), StageSeconds(0.25, 0.50, 0.02)),
        reference_ms=14.0,
        measured_at="2026-11-29T11:35:28+00:00",
    )
    config, facts = _plan_facts(timed)
    terms = epoch_terms(config, facts, HardwareProfile.from_config(config.hardware))
    per_batch = (0.10 + 0.25 + 3 * 0.25) + (0.30 + 0.50 + 3 * 0.50) + 0.02
    assert terms.compute_s == pytest.approx(terms.steps * per_batch)
    # Without them, the layers' shares of the 1 s step (0.16 s forward, 0.32 s backward and
    # 0.02 s update a stage), the recomputation (every micro-batch) charged on top.
    _, shares = _plan_facts(None)
    untimed = epoch_terms(config, shares, HardwareProfile.from_config(config.hardware))
    assert untimed.compute_s == pytest.approx(
        untimed.steps * ((5 * 0.16) + (5 * (0.16 + 0.32)) + 0.02)
    )
    # At the speed a cell ran at: its reference kernel took 21 ms, 1.5 x the timing's.
    slower = timed.at_speed(21.0)
    assert [s.backward_s for s in slower.stages] == pytest.approx([0.45, 0.75])
    assert timed.at_speed(None) == timed


def test_stages_timed_in_place_carry_their_contention_the_factor_scales_only_the_shares() -> None:
    """Timed in place, the stages computed at once on the cell's cores, as in the cell: the
    contention is in the timing, so the fitted factor must not scale it again (it did, and
    took GPipe's held-out MAPE on `local_2cpu` from the raw equations' 6.7 to 8.8 %); the
    transfers stay the communication factor's. From the layers' shares of one sequential step
    (a worker alone), the compute is the contention factor's, as every model's."""
    timed = InPlaceStages(
        (StageSeconds(0.10, 0.30, 0.01), StageSeconds(0.25, 0.50, 0.02)),
        reference_ms=14.0,
        measured_at="2026-11-29T11:35:28+00:00",
    )
    config, facts = _plan_facts(timed)
    profile = HardwareProfile.from_config(config.hardware)
    terms = epoch_terms(config, facts, profile)
    assert terms.coefficients()["contention"] == 0.0
    assert terms.coefficients()["communication"] == pytest.approx(terms.transfer_s)
    assert terms.fixed_s() == pytest.approx(terms.compute_s)
    assert terms.seconds({"contention": 1.3}) == pytest.approx(terms.seconds())
    _, shares = _plan_facts(None)
    untimed = epoch_terms(config, shares, profile)
    assert untimed.fixed_s() == 0.0
    assert untimed.coefficients()["contention"] == pytest.approx(untimed.compute_s)
    assert untimed.seconds({"contention": 1.3}) == pytest.approx(
        1.3 * untimed.compute_s + untimed.transfer_s
    )


def test_a_facts_file_keeps_stages_timed_in_place_by_plan(tmp_path: Path) -> None:
    config, facts = _plan_facts(None)
    assert facts.plan is not None
    key = in_place_key(config, facts.plan)  # type: ignore[arg-type]
    timed = InPlaceStages((StageSeconds(0.1, 0.3, 0.01),) * 2, 14.0, "2026-11-29T11:35:28+00:00")
    store = FactsStore.load(tmp_path / "facts" / "local_2cpu.json")
    store.record_in_place(key, timed, device_name="a CPU")
    store.save()
    kept = FactsStore.load(tmp_path / "facts" / "local_2cpu.json")
    assert kept.in_place(key) == timed and kept.in_place(key, "a CPU") == timed
    assert kept.in_place(key, "another CPU") is None
    other = StagePlan((Stage(0, 1, 1), Stage(1, 3, 1)))
    assert kept.in_place(in_place_key(config, other)) is None  # type: ignore[arg-type]


def test_a_gpipe_cells_stages_are_timed_in_place(output_root: Path) -> None:
    """`python -m harness.stage_timing`: the cell, shortened, its stages each a process of
    their own on this machine; each stage's forward and backward per micro-batch."""
    from omegaconf import OmegaConf

    config = validate(
        compose_config(
            [
                *gpipe_overrides(2, "always", "[16,15]"),
                "hardware=emulated_2nodes_1gbit",
                f"run.output_dir={output_root}",
            ]
        )
    )
    cell = output_root / "cell.yaml"
    output_root.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.structured(config), cell)
    done = run_module(
        "harness.stage_timing",
        [str(cell), str(output_root / "stages.json")],
        cwd=output_root.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    timed = InPlaceStages.from_json(json.loads((output_root / "stages.json").read_text()))
    assert len(timed.stages) == 2 and timed.reference_ms is not None and timed.reference_ms > 0
    for stage in timed.stages:
        # recomputed: the backward runs the forward again, and its own work
        assert 0 < stage.forward_s < stage.backward_s and stage.update_s > 0
    # On one node, no link shaped (the emulated hardware's nodes need not be up), nothing
    # recorded in MLflow.
    (result,) = (output_root / "stages-cell").glob("**/result.json")
    recorded = json.loads(result.read_text())["config"]
    assert recorded["hardware"]["nodes"] == 1 and recorded["hardware"]["link"] is None
    assert recorded["tracking"]["enabled"] is False
