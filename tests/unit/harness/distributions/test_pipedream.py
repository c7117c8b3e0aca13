"""PipeDream: the 1F1B schedule and batch division as data, then real CPU workers (gloo).

The spawned tests build the real trainer in each worker (as `harness.worker.run.measure` would),
train, and check batch counts and weight versions; the runs of one world size share one spawn
(`epoch_reports`). Plans are limited to 4 workers here (2-1, 1-2, 3-1, 1-3); a 3-2 plan's
division and schedule are checked without processes.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.func import functional_call

from harness.commands.compose import compose_config
from harness.config.schema import ConfigError, validate
from harness.costs import onefoneb
from harness.costs.onefoneb import (
    DeadlockError,
    Kind,
    Op,
    divisible_batches,
    simulate,
    worker_ops,
)
from harness.distributions.pipedream.trainer import PipeDreamTrainer, _no_update_between
from harness.runtime.workload import build_workload
from harness.worker.run import parameter_digest
from tests.helpers import assert_stage_phases, run_tiny_cell, spawn_workers
from tests.unit.harness.distributions.test_gpipe import free_port, worker_context

BATCH = 4


def _compositions(total: int) -> list[list[int]]:
    if total == 0:
        return [[]]
    return [
        [first, *rest] for first in range(1, total + 1) for rest in _compositions(total - first)
    ]


# -- the schedule as data -----------------------------------------------------------------------
def fwd(minibatch: int) -> Op:
    return Op(Kind.forward, minibatch)


def bwd(minibatch: int) -> Op:
    return Op(Kind.backward, minibatch)


def test_one_f_one_b_warms_up_then_alternates_without_a_flush() -> None:
    assert worker_ops([1, 1, 1], 0, 0, 6) == [
        fwd(0),
        fwd(1),
        fwd(2),
        bwd(0),
        fwd(3),
        bwd(1),
        fwd(4),
        bwd(2),
        fwd(5),
        bwd(3),
        bwd(4),
        bwd(5),
    ]
    assert worker_ops([1, 1, 1], 2, 0, 3) == [fwd(0), bwd(0), fwd(1), bwd(1), fwd(2), bwd(2)]
    # Replica 1 of a 2-replica first stage of 2-1: minibatches 1, 3, 5; 2 in flight.
    assert worker_ops([2, 1], 0, 1, 6) == [fwd(1), fwd(3), bwd(1), fwd(5), bwd(3), bwd(5)]


def test_only_minibatches_with_an_update_before_their_backward_stash_weights() -> None:
    # First stage of three: minibatch 0 is the only one no other backward overtakes.
    assert _no_update_between(worker_ops([1, 1, 1], 0, 0, 6)) == {0}
    assert _no_update_between(worker_ops([1, 1, 1], 2, 0, 6)) == set(range(6))  # last stage


@pytest.mark.parametrize(
    ("replicas", "batches", "drop", "oversample"),
    [
        ([3, 2], 13, 12, 18),
        ([3, 2], 12, 12, 12),
        ([2, 1], 7, 6, 8),
        ([1, 2], 7, 6, 8),
        ([1, 3], 7, 6, 9),
        ([1, 1], 7, 7, 7),
        ([3, 2], 5, 0, 6),
    ],
)
def test_batch_division_lowers_or_raises_to_what_every_replica_shares(
    replicas: list[int], batches: int, drop: int, oversample: int
) -> None:
    assert divisible_batches(batches, replicas, oversample=False) == drop
    assert divisible_batches(batches, replicas, oversample=True) == oversample
    for count in (drop, oversample):
        for r in replicas:  # every replica of every stage: the same count
            assert {len(onefoneb.minibatches_of(j, r, count)) for j in range(r)} == {count // r}


def test_no_stage_plan_up_to_eight_workers_deadlocks() -> None:
    checked = 0
    for workers in range(1, 9):
        for replicas in _compositions(workers):
            step = math.lcm(*replicas)
            for batches in (step, 2 * step, 5 * step):
                simulate(replicas, batches)
                checked += 1
    assert checked == 3 * (2**8 - 1)


def test_the_simulation_detects_a_schedule_that_would_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Backwards before forwards on the first stage: it would wait for a gradient of a
    # minibatch it never sent forward.
    def backwards_first(replicas: list[int], stage: int, replica: int, batches: int) -> list[Op]:
        ops = [Op(Kind.forward, m) for m in range(batches)]
        backs = [Op(Kind.backward, m) for m in range(batches)]
        return (
            backs + ops
            if stage == 0
            else ops[:1] + backs[:1] + [op for pair in zip(ops[1:], backs[1:]) for op in pair]
        )

    monkeypatch.setattr(onefoneb, "worker_ops", backwards_first)
    with pytest.raises(DeadlockError, match="stage 0 replica 0"):
        simulate([1, 1], 2)


# -- configuration --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (
            ["distribution.stages=2-1"],
            "distribution.stages='2-1' is invalid: the replica counts must sum to the 2 workers",
        ),
        (["distribution.stages=2-x"], "distribution.stages='2-x' is invalid: allowed: replica"),
        (
            ["distribution.stages=1-1", "distribution.balance=[3]"],
            "distribution.balance=[3] is invalid: needs one layer count per stage (2)",
        ),
    ],
)
def test_stage_plans_that_do_not_fit_are_refused(overrides: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate(compose_config(["distribution=pipedream", "hardware=local_2cpu", *overrides]))
    assert fragment in str(error.value)


# -- real workers ----------------------------------------------------------------------------------
def pipedream_overrides(stages: str, division: str, samples: int) -> list[str]:
    workers = sum(map(int, stages.split("-")))
    return [
        "distribution=pipedream",
        "hardware=local_4cpu",
        f"hardware.workers_per_node={workers}",
        "dataset=mnist",
        "network=vgg11",
        f"distribution.batch_size={BATCH}",
        f"distribution.stages={stages}",
        f"distribution.batch_division={division}",
        f"dataset.num_samples={samples}",
    ]


def _epochs_worker(rank: int, world_size: int, port: int, runs: list[list[str]], out: str) -> None:
    """Each run of `runs` (overrides of one world size) in turn: its own trainer, two epochs,
    a report; one gloo group for them all."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=120),
    )
    try:
        reports = []
        for overrides in runs:
            trainer = PipeDreamTrainer(worker_context(rank, world_size, overrides))
            epochs = [trainer.train_epoch(epoch) for epoch in range(2)]
            reports.append(
                {
                    "stage": trainer.stage,
                    "replica": trainer.replica,
                    "batches": [e.batches for e in epochs],
                    "samples": [e.samples for e in epochs],
                    "metrics": trainer.extra_metrics(),
                    "digest": parameter_digest(trainer.module),
                    "versions": [
                        [r.minibatch, r.forward_version, r.backward_version, r.latest_version]
                        for r in trainer.version_log
                    ],
                }
            )
            dist.barrier()  # every message of this run received before the next run sends
        Path(out, f"rank{rank}.json").write_text(json.dumps(reports))
    finally:
        dist.destroy_process_group()


# (stages, batch division, batches trained per epoch) of the batch division test
DIVISIONS = [
    ("2-1", "drop", 6),
    ("2-1", "oversample", 8),
    ("1-2", "drop", 6),
    ("1-2", "oversample", 8),
    ("1-3", "drop", 6),
    ("3-1", "oversample", 9),
    ("2-1-1", "drop", 6),
    ("3-2", "drop", 6),
    ("3-2", "oversample", 12),  # 5 processes: lcm(3, 2) = 6
]
DIVIDED_SAMPLES = 7 * BATCH  # 7 batches per epoch
STASHING = ("1-1-1", "drop", 6 * BATCH)  # the weight stashing test's run


@pytest.fixture(scope="module")
def epoch_reports(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, str, int], list[dict]]:
    """Every worker's report (by rank) of two epochs of each run of the batch division and
    weight stashing tests, by (stages, division, samples). The runs of one world size train
    one after another in one spawn (as tests/integration/test_trajectories.py runs its
    models): three spawns instead of one per run, each worker's process and gloo group
    started once."""
    runs = [(stages, division, DIVIDED_SAMPLES) for stages, division, _ in DIVISIONS]
    runs.append(STASHING)
    by_size: dict[int, list[tuple[str, str, int]]] = {}
    for run in runs:
        by_size.setdefault(sum(map(int, run[0].split("-"))), []).append(run)
    cached = set()
    reports = {}
    for workers, sized in by_size.items():
        overrides = [pipedream_overrides(*run) for run in sized]
        for run, cell in zip(sized, overrides):
            if run[2] not in cached:  # the synthetic cache, once per sample count
                build_workload(validate(compose_config(cell)))
                cached.add(run[2])
        out = tmp_path_factory.mktemp(f"pipedream-{workers}")
        spawn_workers(
            _epochs_worker, args=(workers, free_port(), overrides, str(out)), nprocs=workers
        )
        by_rank = [json.loads((out / f"rank{r}.json").read_text()) for r in range(workers)]
        for index, run in enumerate(sized):
            reports[run] = [ranks[index] for ranks in by_rank]
    return reports


@pytest.mark.parametrize(("stages", "division", "expected"), DIVISIONS)
def test_replicated_stages_train_the_divided_batch_count(
    epoch_reports: dict, stages: str, division: str, expected: int
) -> None:
    reports = epoch_reports[(stages, division, DIVIDED_SAMPLES)]
    replicas = list(map(int, stages.split("-")))
    for report in reports:
        mine = expected // replicas[report["stage"]]
        assert report["batches"] == [expected, expected]
        assert len(report["versions"]) == 2 * mine  # backwards this replica ran, 2 epochs
        assert {v[0] % replicas[report["stage"]] for v in report["versions"]} == {
            report["replica"]
        }  # round robin
        assert report["metrics"]["batches_dropped"] == max(0, 7 - expected)
        assert report["metrics"]["batches_added"] == max(0, expected - 7)
    assert sum(r["samples"][0] for r in reports if r["stage"] == 0) == expected * BATCH
    for stage in range(len(replicas)):  # data parallel inside a stage: replicas stay equal
        assert len({r["digest"] for r in reports if r["stage"] == stage}) == 1


def test_weight_stashing_gives_each_backward_its_forwards_weights(epoch_reports: dict) -> None:
    reports = epoch_reports[STASHING]
    for report in reports:
        warmup = 3 - report["stage"]
        for minibatch, forward, backward, latest in report["versions"][:6]:  # first epoch
            assert backward == forward  # the backward differentiated the stashed snapshot
            assert latest == minibatch  # one update per earlier minibatch on this stage
            # 1F1B: minibatch k's forward runs after k - warmup + 1 updates.
            assert forward == max(0, minibatch - warmup + 1)
    first = reports[0]["versions"]
    assert any(latest > forward for _, forward, _, latest in first)  # stashing mattered


def _stashed_gradient_worker(rank: int, world_size: int, port: int, overrides: list[str]) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=120),
    )
    try:
        trainer = PipeDreamTrainer(worker_context(rank, world_size, overrides))
        captured: dict[int, tuple] = {}
        if trainer.stage == 0:
            _spy_on_backwards(trainer, captured)
        trainer.train_epoch(0)
        for minibatch, (inputs, stashed, live, upstream, used) in captured.items():
            if all(torch.equal(stashed[name], live[name]) for name in stashed):
                continue  # no update came between this minibatch's forward and backward
            with_stashed = _gradients(trainer, stashed, inputs, upstream)
            with_live = _gradients(trainer, live, inputs, upstream)
            for name, gradient in used.items():
                torch.testing.assert_close(gradient, with_stashed[name], rtol=1e-5, atol=1e-6)
            assert any(not torch.allclose(used[n], with_live[n]) for n in used), minibatch
            captured[minibatch] = ()
        assert trainer.stage != 0 or sum(not c for c in captured.values()) >= 2
    finally:
        dist.destroy_process_group()


def _spy_on_backwards(trainer: PipeDreamTrainer, captured: dict[int, tuple]) -> None:
    """Record, per backward: the input, the stashed and the live weights, the gradient that
    arrived from the next stage and the weight gradients the update was given."""
    backward, recv, step = trainer._backward, trainer._recv, trainer._step

    def spying_backward(op: Op) -> None:
        flight = trainer._in_flight[op.minibatch]
        record = [
            flight.inputs.detach().clone(),
            {k: v.detach().clone() for k, v in flight.snapshot.weights.items()},
            {k: p.detach().clone() for k, p in trainer.module.named_parameters()},
        ]

        def spying_recv(*args: object, **kwargs: object) -> torch.Tensor:
            tensor = recv(*args, **kwargs)
            record.append(tensor.clone())
            return tensor

        def spying_step(gradients: dict[str, torch.Tensor]) -> None:
            record.append({k: g.clone() for k, g in gradients.items()})
            step(gradients)

        trainer._recv, trainer._step = spying_recv, spying_step
        try:
            backward(op)
        finally:
            trainer._recv, trainer._step = recv, step
        captured[op.minibatch] = tuple(record)

    trainer._backward = spying_backward


def _gradients(
    trainer: PipeDreamTrainer,
    weights: dict[str, torch.Tensor],
    inputs: torch.Tensor,
    upstream: torch.Tensor,
) -> dict[str, torch.Tensor]:
    leaves = {k: w.clone().requires_grad_() for k, w in weights.items()}
    torch.autograd.backward(functional_call(trainer.module, leaves, (inputs,)), upstream)
    return {k: w.grad for k, w in leaves.items()}


def test_weight_stashing_computes_the_gradient_of_the_stashed_weights() -> None:
    """Numerically: the first stage's update gets the gradient of the weights its forward
    used, which differ from the live ones by then."""
    overrides = pipedream_overrides("1-1", "drop", samples=6 * BATCH)
    build_workload(validate(compose_config(overrides)))
    spawn_workers(_stashed_gradient_worker, args=(2, free_port(), overrides), nprocs=2)


def test_a_pipedream_cell_runs_end_to_end_and_records_its_plan(output_root: Path) -> None:
    result = run_tiny_cell(
        output_root,
        "distribution=pipedream",
        "hardware=local_2cpu",
        "distribution.stages=1-1",
        "dataset.num_samples=24",
    )
    metrics = result["metrics"]
    assert metrics["world_size"] == 2 and metrics["replicas_in_sync"] == 1.0
    assert metrics["samples_per_epoch"] == 24 and metrics["batches_per_epoch"] == 3
    assert metrics["batches_dropped"] == 0 and metrics["micro_batch_size"] == 8
    assert 0 <= metrics["bubble_stage0"] < 1 and 0 <= metrics["bubble_stage1"] < 1
    assert_stage_phases(metrics, stages=2)
    assert result["config"]["distribution"]["stages"] == "1-1"
    assert sum(result["config"]["distribution"]["balance"]) == 23
