"""`gpipe`: GPipe pipeline parallelism on `torch.distributed.pipelining`.

One stage per worker (layers from the shared stage plan); each batch, the whole pipeline batch
of Table 3.3, is split into `micro_batches` micro-batches that flow through the stages in
GPipe's fill-drain order (ScheduleGPipe); gradients accumulate over all micro-batches (scaled
to the batch mean) and every stage then steps its optimizer once: a synchronous update.
Activations travel with non-blocking point-to-point sends over the cell's process group, so a
stage computes the next micro-batch while the previous one is on the wire, and nothing in the
design is node-local: stages on different nodes talk as stages on one node do.

Activation recomputation (`distribution.recompute`) wraps the stage's forward in
`torch.utils.checkpoint` for the micro-batches it applies to: `always` (GPipe's design),
`except_last` (the last micro-batch's backward follows its forward directly, so keeping its
activations costs no more peak memory), or `never`. BatchNorm's running statistics are updated
again by the recomputation, as in torchgpipe without its deferred-BN option; the gradients are
exact either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from harness.config.accepts import integer
from harness.config.batch_sizes import largest_divisor, nearest_divisors
from harness.config.schema import DistbenchConfig, require
from harness.costs import memory
from harness.costs.partition import StagePlan, balanced_partition, check_balance
from harness.costs.terms import (
    CellFacts,
    EpochTerms,
    batches_per_epoch,
    burst_bytes,
    memory_stage,
)
from harness.distributions.gpipe import equations
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


class Recompute(str, Enum):
    """Which micro-batches recompute their stage's activations in the backward pass."""

    always = "always"  # every micro-batch (GPipe's design: least activation memory)
    except_last = "except_last"  # the last micro-batch's backward runs right after its forward
    never = "never"  # keep every micro-batch's activations


class GPipeBatch(NamedTuple):
    batch_size: int
    micro_batches: int


# Table 3.3 (docs/thesis.md): dataset -> GPipe's whole batch and its number of micro-batches
TABLE_3_3: dict[str, GPipeBatch] = {
    "mnist": GPipeBatch(3072, 24),
    "cifar10": GPipeBatch(2048, 32),
    "imagenet": GPipeBatch(384, 12),
    "highres": GPipeBatch(48, 12),
    # Not in the thesis' table (it has no language model): 4 micro-batches of the 8 sequences
    # the other models train per worker.
    "tokens": GPipeBatch(32, 4),
    "text": GPipeBatch(32, 4),
}


@dataclass
class GPipeConfig(PipelineConfig):
    """GPipe: one stage per worker; each batch is split into micro-batches that fill and drain
    the pipeline; one synchronous weight update per batch."""

    name: str = "gpipe"
    # Micro-batches per batch; must divide batch_size. null = Table 3.3's count, or with a
    # batch_size given, its largest divisor not above that count (32 on mnist: 16).
    micro_batches: int | None = field(default=None, metadata=integer(1, 2**31 - 1, "micro-batches"))
    recompute: Recompute = Recompute.always

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.micro_batches is None or self.micro_batches > 0,
            "distribution.micro_batches",
            self.micro_batches,
            "must be a positive number, or null (the thesis' Table 3.3 for the dataset)",
        )

    def default_batch_size(self, dataset: str) -> int:
        """The whole pipeline batch of Table 3.3."""
        return TABLE_3_3[dataset].batch_size

    def micro_batch_count(self, cell: DistbenchConfig) -> int:
        """Micro-batches per batch: the setting, else Table 3.3's count for the dataset, lowered
        to the largest divisor of the batch asked for (a batch the table did not plan for,
        `distribution.batch_size=32`, still splits evenly without a micro-batch setting)."""
        if self.micro_batches is not None:
            return self.micro_batches
        return largest_divisor(cell.batch_size, TABLE_3_3[cell.dataset.name.value].micro_batches)

    def step_batch(self, cell: DistbenchConfig) -> int:
        return cell.batch_size // self.micro_batch_count(cell)

    def check_cell(self, cell: DistbenchConfig) -> None:
        require(
            cell.world_size >= 2,
            "hardware.workers_per_node",
            cell.hardware.workers_per_node,
            "GPipe needs 2 or more workers (hardware.nodes x hardware.workers_per_node); "
            "one stage on one worker is distribution=sequential",
        )
        micro = self.micro_batch_count(cell)
        require(
            cell.batch_size >= micro and cell.batch_size % micro == 0,
            "distribution.micro_batches",
            micro,
            f"must divide the GPipe batch (distribution.batch_size={cell.batch_size}) "
            f"into equal micro-batches of 1 sample or more; allowed: "
            f"{nearest_divisors(cell.batch_size, micro)}, or null (the largest divisor "
            f"up to {TABLE_3_3[cell.dataset.name.value].micro_batches})",
        )
        self.check_stages(
            cell, cell.world_size, "hardware.workers_per_node", cell.hardware.workers_per_node
        )

    def batch_multiple(self, cell: DistbenchConfig) -> int:
        """A set micro-batch count must divide the batch; null follows any batch."""
        return self.micro_batches or 1

    def run_name_parts(self, cell: DistbenchConfig) -> list[str]:
        return [f"mb{self.micro_batch_count(cell)}"]

    def own_settings(self, cell: DistbenchConfig) -> dict[str, Any]:
        return {**super().own_settings(cell), "micro_batches": self.micro_batch_count(cell)}

    def parallelism(
        self, cell: DistbenchConfig, resolved: dict[str, Any]
    ) -> tuple[int | list[int], int]:
        return 1, len(resolved.get("balance") or []) or cell.world_size


def gpipe_settings(config: DistbenchConfig) -> GPipeConfig:
    assert isinstance(config.distribution, GPipeConfig), config.distribution
    return config.distribution


def stage_plan(
    config: DistbenchConfig, num_layers: int, profile: NetworkProfile | None
) -> StagePlan:
    """One stage per worker: `distribution.balance`, else the partition that balances the
    profiled time per layer (taken at the micro-batch)."""
    settings, workers = gpipe_settings(config), config.world_size
    if settings.balance is not None:
        balance = check_balance(settings.balance, num_layers, workers)
    else:
        assert profile is not None, "balancing stages needs a profile"
        balance = balanced_partition(profile.compute_ms(updates_per_pass(config)), workers)
    return StagePlan.of(balance, [1] * workers)


def updates_per_pass(config: DistbenchConfig) -> float:
    """GPipe steps its optimizer once per batch of #mb micro-batches."""
    return 1 / gpipe_settings(config).micro_batch_count(config)


PLANNER = StagePlanner(
    plan=stage_plan,
    needs_profile=lambda config: gpipe_settings(config).balance is None,
    updates_per_pass=updates_per_pass,
    timed_in_place=True,
)


def recompute_share(recompute: Recompute, micro_batches: int) -> float:
    """Share of the micro-batches whose forward runs again in the backward pass (GPipe's
    activation checkpointing): all (`always`), all but the last (`except_last`), none."""
    return {
        Recompute.always: 1.0,
        Recompute.never: 0.0,
        Recompute.except_last: (micro_batches - 1) / micro_batches,
    }[recompute]


def epoch_terms(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile | None
) -> EpochTerms:
    """GPipe per batch: the schedule over the plan's real stages (`gpipe.schedule_seconds`,
    Eq. 6.1 generalised to uneven stages and recomputation) and Eq. 6.2's transfers. A stage's work
    is its layers' shares of one sequential step at the micro-batch, or, where an analysis timed the
    plan's stages in place (`CellFacts.stages_in_place`), what each stage took in a process of its
    own: the shares missed that by up to 23 % (docs/benchmarks/2026-11-29-gpipe-stages-in-place.md,
    "Where GPipe's stages spend their time, measured in place (2026-11-29)"). Those processes
    computed at once, on the cores the cell's workers share: the contention is in the timing, and
    the contention factor scales only compute from the shares (a worker alone, the probe)."""
    assert profile is not None and facts.plan is not None
    settings, plan, steps = gpipe_settings(config), facts.plan, batches_per_epoch(config)
    micro_batches = settings.micro_batch_count(config)
    in_place = facts.stages_in_place
    timed = in_place.stages if in_place is not None else ()
    timed_concurrently = len(timed) == len(plan.stages)
    if timed_concurrently:
        # as the stages ran in their own processes, the recomputation in their backward
        stages = [
            equations.StageWork(stage.forward_s, stage.backward_s, stage.update_s)
            for stage in timed
        ]
        recomputed = 0.0
    else:
        t = facts.step_seconds  # one sequential step at the micro-batch size
        stages = [
            equations.StageWork(
                forward_s=t * sum(layer.forward_share for layer in facts.layers[s.first : s.end]),
                backward_s=t * sum(layer.backward_share for layer in facts.layers[s.first : s.end]),
                update_s=t * sum(layer.update_share for layer in facts.layers[s.first : s.end]),
            )
            for s in plan.stages
        ]
        recomputed = recompute_share(settings.recompute, micro_batches)
    compute = equations.schedule_seconds(stages, micro_batches, recomputed)
    boundaries = [
        facts.layers[stage.end - 1].activation_mb_per_sample for stage in plan.stages[:-1]
    ]
    costs = equations.link_costs(
        boundaries, facts.step_batch, profile, burst_bytes=burst_bytes(config)
    )
    return EpochTerms(
        steps * compute,
        0.0,
        steps * equations.communication_seconds(costs, micro_batches),
        steps,
        concurrent=True,
        compute_timed_concurrently=timed_concurrently,
    )


def memory_per_worker(config: DistbenchConfig, facts: CellFacts) -> list[memory.WorkerMemory]:
    """Each stage's weights, the gradients it accumulates, its momentum, and the
    micro-batches' activations under its recompute mode."""
    assert facts.plan is not None
    settings = gpipe_settings(config)
    return [
        equations.gpipe_stage_memory(
            memory_stage(facts, stage.first, stage.end),
            facts.step_batch,
            settings.micro_batch_count(config),
            settings.recompute.value,
            optimizer_states=config.optimizer.state_buffers,
            runtime_mb=facts.runtime_mb,
        )
        for stage in facts.plan.stages
    ]


def candidates(asked: DistbenchConfig, counts: WorkerCounts) -> Iterator[DistbenchConfig]:
    """The asked (else Table 3.3's) micro-batch count, half and double it, where it divides
    the batch; the plans are the candidates' own."""
    table = TABLE_3_3[asked.dataset.name.value]
    batch = asked.distribution.batch_size or table.batch_size
    asked_count = (
        asked.distribution.micro_batches if isinstance(asked.distribution, GPipeConfig) else None
    )
    # Table 3.3's count where it divides the batch asked for, else its largest divisor below
    # that (GPipeConfig.micro_batch_count's rule for null): a batch the table did not plan for
    # (distribution.batch_size=1 of a large language model) still gets GPipe candidates.
    default = asked_count or largest_divisor(batch, table.micro_batches)
    for nodes, per_node in counts:
        for micro_batches in sorted({max(1, default // 2), default, default * 2}):
            if batch % micro_batches == 0:
                yield candidate(
                    asked,
                    candidate_settings(
                        asked, GPipeConfig, balance=None, micro_batches=micro_batches
                    ),
                    nodes,
                    per_node,
                )


def label(config: DistbenchConfig, plan: StagePlan | None) -> str:
    return f"gpipe x{config.world_size} mb{gpipe_settings(config).micro_batch_count(config)}"


def pinned_overrides(config: DistbenchConfig, plan: StagePlan | None) -> list[str]:
    """The micro-batch count, and the balance predicted (one stage per worker)."""
    pinned = [f"distribution.micro_batches={gpipe_settings(config).micro_batch_count(config)}"]
    if plan is not None:
        pinned.append(f"distribution.balance=[{','.join(map(str, plan.balance))}]")
    return pinned


SPEC = DistributionSpec(
    name="gpipe",
    title="GPipe",
    settings=GPipeConfig,
    trainer=trainer_in(f"{__name__}.trainer", "gpipe_trainer"),
    epoch_terms=epoch_terms,
    memory_per_worker=memory_per_worker,
    candidates=candidates,
    label=label,
    pinned_overrides=pinned_overrides,
    stage_planner=PLANNER,
    probed_collectives=(Collective.point_to_point,),
)
