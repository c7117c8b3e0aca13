"""Profiler and partitioners: hand-made profiles with known optimal splits, a real profile of a
small layer stack, the `harness.plan` command, and replica groups in a cell's measurement."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from harness.costs.partition import (
    LinkModel,
    StagePlan,
    balanced_partition,
    check_balance,
    parse_stages,
    plan_pipedream,
)
from harness.distributions.base import EpochMeasurement
from harness.measure.profiler import profile_layers
from harness.worker.run import Measurement, WorkerMeasurement
from tests.helpers import run_module


@pytest.mark.parametrize(
    ("costs", "stages", "expected"),
    [
        ([1, 1, 1, 1], 2, [2, 2]),
        ([4, 1, 1, 1, 1], 2, [1, 4]),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, [5, 2, 2]),  # the only split with max stage cost 17
        ([5, 1, 1, 1, 1, 1], 3, [1, 1, 4]),  # max 5 whatever the rest; the earliest cut wins
        ([3, 3, 3], 3, [1, 1, 1]),
        ([2, 7, 2], 1, [3]),
    ],
)
def test_balanced_partition_minimises_the_slowest_stage(
    costs: list[float], stages: int, expected: list[int]
) -> None:
    assert balanced_partition(costs, stages) == expected


def test_balanced_partition_refuses_more_stages_than_layers() -> None:
    with pytest.raises(ValueError, match="cannot split 2 layers into 3 stages"):
        balanced_partition([1, 1], 3)


def test_pipedream_planner_replicates_what_is_cheap_to_replicate() -> None:
    # Without weights to allreduce, replicating the whole network on all workers is best.
    plan = plan_pipedream([6, 1, 1], [0, 0, 0], [0, 0, 0], workers=3)
    assert (plan.stage_string(), plan.balance) == ("3", [3])
    # Heavy weights on the last layer make its replication expensive: the compute-heavy,
    # weight-free first layer gets two replicas, the rest one (3 ms per minibatch, the only
    # plan that fast).
    plan = plan_pipedream(
        [6, 1, 1], [0, 0, 3000], [0, 0, 0], workers=3, link=LinkModel(bandwidth_mbps=1000)
    )
    assert (plan.stage_string(), plan.balance) == ("2-1", [1, 2])
    # Large activations make every stage boundary expensive: one stage again.
    plan = plan_pipedream(
        [6, 1, 1], [0, 0, 3000], [5000, 5000, 0], workers=3, link=LinkModel(bandwidth_mbps=1000)
    )
    assert plan.stage_string() == "3"


def test_stage_plan_assigns_workers_stage_by_stage() -> None:
    plan = StagePlan.of([4, 3, 2], [2, 1, 3])
    assert [plan.stage_of(rank) for rank in range(6)] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (2, 0),
        (2, 1),
        (2, 2),
    ]
    assert plan.ranks_of(2) == [3, 4, 5] and plan.replica_lcm == 6
    assert plan.describe() == "2x[0:4]-1x[4:7]-3x[7:9]"
    assert parse_stages("2-1-3") == [2, 1, 3]
    for bad in ("", "2-0", "a-1", "2--1"):
        with pytest.raises(ValueError, match="allowed"):
            parse_stages(bad)
    with pytest.raises(ValueError, match="sum to the network's 9 layers"):
        check_balance([4, 4], 9, 2)


def test_profiler_records_time_and_sizes_per_layer_and_leaves_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(inplace=True), nn.Linear(256, 8)]
    before = [t.clone() for layer in layers for t in layer.state_dict().values()]
    profile = profile_layers(layers, torch.randn(16, 64), warmup=1, repeats=3)
    assert [layer.type for layer in profile.layers] == ["Linear", "BatchNorm1d", "ReLU", "Linear"]
    assert all(layer.forward_ms > 0 and layer.backward_ms > 0 for layer in profile.layers)
    assert profile.layers[0].update_ms > 0 and profile.layers[2].update_ms == 0  # ReLU: none
    assert profile.layers[0].compute_ms(0.5) == pytest.approx(
        profile.layers[0].forward_ms
        + profile.layers[0].backward_ms
        + 0.5 * profile.layers[0].update_ms
    )
    assert profile.layers[0].activation_mb == pytest.approx(16 * 256 * 4 / 1e6)
    assert profile.layers[0].parameter_mb == pytest.approx((64 * 256 + 256) * 4 / 1e6)
    assert profile.layers[2].parameter_mb == 0
    after = [t for layer in layers for t in layer.state_dict().values()]
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # BN statistics restored
    assert all(p.grad is None for layer in layers for p in layer.parameters())


def test_the_profiler_runs_a_steady_layer_fewer_times_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a spread, a layer's runs stop after 3 timed ones within it: 2 + 3 forwards instead
    of 2 + 5. The profiler's clock reads 2.5 ms more at each reading (a run reads it three
    times: 5 ms a run), so that the runs are steady whatever else the machine runs (a 5 ms
    sleep in each run was not, on a busy CI machine: one run in three came 50 % late), and the
    warm-up, under a second, makes all its runs."""
    import harness.measure.profiler

    calls = []
    readings = itertools.count()
    monkeypatch.setattr(
        harness.measure.profiler, "device_time", lambda device: 0.0025 * next(readings)
    )

    class Steady(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(1)
            return super().forward(x)

    layer = Steady(64, 8)
    profile_layers([layer], torch.randn(16, 64), warmup=2, repeats=5)
    assert len(calls) == 7
    calls.clear()
    profile_layers([layer], torch.randn(16, 64), warmup=2, repeats=5, spread=0.5)
    assert len(calls) == 5


def _worker(digest: str, group: int, extra: dict[str, float]) -> WorkerMeasurement:
    epoch = EpochMeasurement(seconds=1.0, samples=8, batches=2)
    return WorkerMeasurement(
        epochs=[epoch],
        peak_memory_mb=1.0,
        memory_kind="test",
        parameter_digest=digest,
        replica_group=group,
        extra_metrics=extra,
        seeds=[0],
    )


def test_replicas_are_compared_within_their_stage_only() -> None:
    in_sync = Measurement(
        [
            _worker("a", 0, {"bubble_stage0": 0.2}),
            _worker("a", 0, {"bubble_stage0": 0.4}),
            _worker("b", 1, {"bubble_stage1": 0.1}),
        ]
    )
    metrics = in_sync.metrics()
    assert metrics["replicas_in_sync"] == 1.0
    assert metrics["bubble_stage0"] == pytest.approx(0.3) and metrics["bubble_stage1"] == 0.1
    drifted = Measurement([_worker("a", 0, {}), _worker("c", 0, {}), _worker("b", 1, {})])
    assert drifted.metrics()["replicas_in_sync"] == 0.0


def test_plan_command_prints_a_balanced_plan_as_json(tmp_path: Path) -> None:
    done = run_module(
        "harness.plan",
        [
            "distribution=gpipe",
            "hardware=local_2cpu",
            "network=vgg11",
            "dataset=mnist",
            "distribution.batch_size=8",
            "distribution.micro_batches=2",
        ],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["workers"] == 2 and plan["num_layers"] == 31 and plan["stages"] == "1-1"
    assert sum(plan["balance"]) == 31 and plan["profile_batch_size"] == 4
    assert len(plan["profile"]["layers"]) == 31
    # GPipe balances forward + backward plus its one update per batch of 2 micro-batches.
    costs = [
        layer["forward_ms"] + layer["backward_ms"] + layer["update_ms"] / 2
        for layer in plan["profile"]["layers"]
    ]
    assert plan["balance"] == balanced_partition(costs, 2)
    done = run_module(
        "harness.plan",
        [
            "distribution=pipedream",
            "hardware=local_2cpu",
            "network=vgg11",
            "dataset=mnist",
            "distribution.batch_size=4",
        ],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)  # PipeDream's planner chose the replica counts
    assert sum(parse_stages(planned["stages"])) == 2 and sum(planned["balance"]) == 31
    done = run_module(
        "harness.plan",
        [
            "distribution=pipedream",
            "hardware=local_2cpu",
            "distribution.stages=1-1",
            "distribution.balance=[30,1]",
        ],
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "distribution.balance=[30, 1] is invalid" in done.stderr
