"""`pipedream`: PipeDream's pipeline parallelism: 1F1B, weight stashing, replicated stages.

Each worker trains one replica of one stage of the stage plan (`distribution.stages`, e.g.
"2-1": stage 0 on two workers, stage 1 on one). Minibatches (Table 3.3's batch each) are
routed round robin over a stage's replicas and scheduled 1F1B (harness.costs.onefoneb:
warm-up forwards, then one backward and one forward alternately, no flush between
minibatches). Every backward is followed by this stage's weight update, so the weights a
minibatch's forward used may have been updated several times before its backward runs.

Weight stashing: a forward runs on a snapshot of the weights at their current version
(`torch.func.functional_call` on cloned leaf tensors); the optimizer updates the live
parameters in place, never the snapshot, so the backward computes its gradients with exactly
the weights its forward used. A snapshot is shared by the forwards of one version and freed
when their backwards are done. A minibatch whose backward follows with no update in between
(every minibatch of the last stage) needs no copy and runs on the live parameters.
`version_log` records, per minibatch, the version its forward used and the version of the
snapshot its backward differentiated, so tests can check them.

Replicated stages are data parallel: after each backward, the replicas of the stage average
their gradients with an allreduce in their own process group (`dist.new_group`), so they step
identically. Batch division: every replica of every stage must train the same number of
minibatches, so an epoch's batch count is lowered (`drop`) or raised (`oversample`) to a
multiple of the lcm of the replica counts; the run records how many were dropped or added.

Point-to-point messages are non-blocking sends and blocking receives on the cell's process
group, whose timeout bounds every wait; the schedule is checked to be deadlock-free before it
runs (see onefoneb).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from harness.config.accepts import text
from harness.config.schema import ConfigError, DistbenchConfig, require
from harness.costs import memory
from harness.costs.onefoneb import (
    divisible_batches,
)
from harness.costs.partition import (
    LinkModel,
    StagePlan,
    balanced_partition,
    check_balance,
    parse_stages,
    plan_pipedream,
)
from harness.costs.terms import (
    CellFacts,
    EpochTerms,
    FreeParameter,
    burst_bytes,
    memory_stage,
)
from harness.distributions.pipedream import equations
from harness.distributions.pipeline_config import PipelineConfig
from harness.distributions.spec import (
    DistributionSpec,
    StagePlanner,
    WorkerCounts,
    candidate,
    candidate_settings,
    trainer_in,
)
from harness.profiles.collectives import Collective
from harness.profiles.hardware import HardwareProfile
from harness.profiles.network import NetworkProfile

# `distribution.stages` shorthand for one unreplicated stage per worker.
STRAIGHT = "straight"

# PipeDream's own free parameter: after each backward a replica of a replicated stage copies its
# gradients into one message (`torch.cat`, a fresh tensor every minibatch), allreduces it, divides
# it and reads the gradients back out of it, on the cores that compute, and waits for the slower
# replica. On `local_2cpu` that optimizer phase took 2.3-2.5 ms per MB of the stage's weights for
# all four calibration networks (VGG-11: 93 ms a minibatch, DDP's update and wait 36), where the
# probe's allreduce is 0.74 ms per MB and the same allreduce after compute 0.77: the cat alone took
# 17 ms of VGG-11's 36.9 MB
# (docs/benchmarks/2026-11-29-calibrate-local-fsdp-pipedream-flattening.md, "PipeDream's flattening,
# its own term (shipped) (2026-11-29)").
FLATTEN = FreeParameter(
    "pipedream_flatten",
    "ms of a worker's cores per MB of a replicated stage's gradients, each minibatch: the "
    "copies into and out of its replicas' one allreduce message, and their wait for each "
    "other; PipeDream only, 0 where workers have devices of their own",
    0.0,
    10.0,
)


class BatchDivision(str, Enum):
    """What to do when an epoch's batches do not divide among the stages' replicas."""

    drop = "drop"  # lower the batch count to the nearest multiple (the thesis' division)
    oversample = "oversample"  # raise it, re-reading batches from the start of the epoch


@dataclass
class PipeDreamConfig(PipelineConfig):
    """PipeDream: 1F1B scheduling, no flush between batches, weight stashing, and data
    parallelism inside replicated stages. `batch_size` is per minibatch entering the
    pipeline."""

    name: str = "pipedream"
    # Replicas per stage joined by '-', e.g. "2-1-1" (sums to the worker count); "straight" =
    # one stage per worker, none replicated (the true 1F1B pipeline, whatever the worker
    # count); null = planned from the profile (harness.costs.partition.plan_pipedream).
    stages: str | None = field(default=None, metadata=text(255))
    batch_division: BatchDivision = BatchDivision.drop

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.stages is not None and self.stages != STRAIGHT:
            try:
                parse_stages(self.stages)
            except ValueError as err:
                raise ConfigError(
                    f"distribution.stages={self.stages!r} is invalid: {err}"
                ) from None

    def check_cell(self, cell: DistbenchConfig) -> None:
        if self.stages == STRAIGHT:  # spelled out once the worker count is known
            self.stages = "-".join(["1"] * cell.world_size)
        stage_count = None
        if self.stages is not None:
            replicas = parse_stages(self.stages)
            require(
                sum(replicas) == cell.world_size,
                "distribution.stages",
                self.stages,
                f"the replica counts must sum to the {cell.world_size} workers of "
                f"hardware={cell.hardware.name} (e.g. "
                f"{'-'.join(['1'] * cell.world_size)})",
            )
            stage_count = len(replicas)
        self.check_stages(cell, stage_count, "distribution.stages", self.stages)
        if self.stages is not None and self.batch_division is BatchDivision.drop:
            # The trainer would drop every batch of an epoch shorter than the batch count the
            # replicas share evenly; refused here, before any worker starts.
            step = math.lcm(*parse_stages(self.stages))
            cell.check_epoch_holds(
                step,
                f"distribution.stages={self.stages} shares batches "
                f"evenly in multiples of {step}, and "
                f"batch_division=drop needs {step} or more batches of "
                f"{cell.batch_size} per epoch (or "
                f"distribution.batch_division=oversample)",
            )

    def run_name_parts(self, cell: DistbenchConfig) -> list[str]:
        return [f"st{self.stages}"] if self.stages else []

    def parallelism(
        self, cell: DistbenchConfig, resolved: dict[str, Any]
    ) -> tuple[int | list[int], int]:
        replicas = parse_stages(resolved.get("stages") or self.stages or "1")
        return (replicas[0] if len(set(replicas)) == 1 else list(replicas)), len(replicas)


def pipedream_settings(config: DistbenchConfig) -> PipeDreamConfig:
    assert isinstance(config.distribution, PipeDreamConfig), config.distribution
    return config.distribution


def stage_plan(
    config: DistbenchConfig, num_layers: int, profile: NetworkProfile | None
) -> StagePlan:
    """Replicas per stage from `distribution.stages`, else PipeDream's planner on the profile
    (taken at the minibatch); layers per stage from `distribution.balance`, else the planner's
    or the partition that balances the profiled time."""
    settings, workers = pipedream_settings(config), config.world_size
    if settings.stages is not None:
        replicas = parse_stages(settings.stages)
    else:
        assert profile is not None, "PipeDream's planner needs a profile"
        link = LinkModel(config.hardware.intra_node_bandwidth_mbps or LinkModel.bandwidth_mbps)
        planned = plan_pipedream(
            profile.compute_ms(1.0),
            [layer.parameter_mb for layer in profile.layers],
            [layer.activation_mb for layer in profile.layers],
            workers,
            link,
        )
        if settings.balance is None:
            return planned
        replicas = planned.replicas
    if settings.balance is not None:
        balance = check_balance(settings.balance, num_layers, len(replicas))
    else:
        assert profile is not None, "balancing stages needs a profile"
        balance = balanced_partition(profile.compute_ms(1.0), len(replicas))
    return StagePlan.of(balance, replicas)


def needs_profile(config: DistbenchConfig) -> bool:
    """A profile unless both the replicas and the balance are given."""
    settings = pipedream_settings(config)
    return settings.balance is None or settings.stages is None


PLANNER = StagePlanner(plan=stage_plan, needs_profile=needs_profile)


def minibatches(config: DistbenchConfig, replicas: list[int]) -> int:
    """An epoch's minibatches under PipeDream's batch division (a multiple of the lcm of the
    stages' replica counts, lowered or raised)."""
    return divisible_batches(
        config.samples_per_epoch // config.batch_size,
        replicas,
        pipedream_settings(config).batch_division is BatchDivision.oversample,
    )


def pipeline_stages(config: DistbenchConfig, facts: CellFacts) -> list[equations.PipelineStage]:
    """The plan's stages with their share of the probed sequential step."""
    assert facts.plan is not None
    stages = []
    for index, stage in enumerate(facts.plan.stages):
        layers = facts.layers[stage.first : stage.end]
        last = index == len(facts.plan.stages) - 1
        stages.append(
            equations.PipelineStage(
                compute_s=facts.step_seconds * sum(layer.compute_share for layer in layers),
                replicas=stage.replicas,
                weights_mb=sum(layer.weights_mb for layer in layers),
                output_mb=0.0 if last else config.batch_size * layers[-1].activation_mb_per_sample,
            )
        )
    return stages


def epoch_terms(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile | None
) -> EpochTerms:
    """Pipeline depth, then one minibatch per bottleneck interval (`equations`), and on CPU
    workers the replicas' flattening of their gradients (`FLATTEN`)."""
    assert profile is not None and facts.plan is not None
    steps = minibatches(config, facts.plan.replicas)
    split = equations.epoch_split(
        pipeline_stages(config, facts), steps, profile, burst_bytes=burst_bytes(config)
    )
    model_terms: tuple[tuple[FreeParameter, float], ...] = ()
    if config.hardware.device.value != "cuda" and split.flattened_mb > 0:
        model_terms = ((FLATTEN, split.flattened_mb / 1000),)  # FLATTEN is in ms per MB
    return EpochTerms(
        split.compute_s,
        split.allreduce_s,
        split.transfer_s,
        steps,
        concurrent=True,
        model_terms=model_terms,
    )


def held_sends(config: DistbenchConfig, replicas: list[int], index: int) -> int:
    """Minibatches whose sent tensors a worker of stage `index` holds at once: over gloo all
    of its epoch's (a gloo send is complete only once waited for, and the trainer waits at
    the epoch's end), elsewhere none beyond those in flight."""
    backend = config.distribution.backend or (
        "nccl" if config.hardware.device.value == "cuda" else "gloo"
    )
    if backend != "gloo":
        return 0
    return minibatches(config, replicas) // replicas[index]


def memory_per_worker(config: DistbenchConfig, facts: CellFacts) -> list[memory.WorkerMemory]:
    """Each stage replica: its minibatches in flight, its stashed weight versions, a
    replicated stage's allreduce buffer, and what it sent and still holds."""
    assert facts.plan is not None
    replicas = facts.plan.replicas
    workers = []
    for index, stage in enumerate(facts.plan.stages):
        one = equations.pipedream_stage_memory(
            memory_stage(facts, stage.first, stage.end),
            config.batch_size,
            replicas,
            index,
            held_sends=held_sends(config, replicas, index),
            optimizer_states=config.optimizer.state_buffers,
            runtime_mb=facts.runtime_mb,
        )
        workers.extend([one] * stage.replicas)
    return workers


def candidates(asked: DistbenchConfig, counts: WorkerCounts) -> Iterator[DistbenchConfig]:
    """PipeDream's planner's plan, and the straight pipeline (one stage per worker)."""
    for nodes, per_node in counts:
        straight = "-".join(["1"] * nodes * per_node)
        for stages in (None, straight):
            yield candidate(
                asked,
                candidate_settings(asked, PipeDreamConfig, balance=None, stages=stages),
                nodes,
                per_node,
            )


def label(config: DistbenchConfig, plan: StagePlan | None) -> str:
    stages = plan.stage_string() if plan is not None else pipedream_settings(config).stages
    return f"pipedream {stages or 'planned'}"


def pinned_overrides(config: DistbenchConfig, plan: StagePlan | None) -> list[str]:
    """The plan predicted, pinned: the planner could choose another on another machine."""
    if plan is None:
        return []
    return [
        f"distribution.stages={plan.stage_string()}",
        f"distribution.balance=[{','.join(map(str, plan.balance))}]",
    ]


SPEC = DistributionSpec(
    name="pipedream",
    title="PipeDream",
    settings=PipeDreamConfig,
    trainer=trainer_in(f"{__name__}.trainer", "pipedream_trainer"),
    epoch_terms=epoch_terms,
    memory_per_worker=memory_per_worker,
    candidates=candidates,
    label=label,
    pinned_overrides=pinned_overrides,
    stage_planner=PLANNER,
    free_parameters=(FLATTEN,),
    probed_collectives=(
        Collective.point_to_point,
        Collective.allreduce,  # a replicated stage's gradients
    ),
)
