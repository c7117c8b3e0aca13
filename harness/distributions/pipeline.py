"""What GPipe and PipeDream share: one stage plan for all workers, the stage's layers, the
pipeline's batches, and the bubble (idle share) a stage measures.

Pipelines do not shard the data by worker: every batch enters the pipeline whole at the first
stage. Only the first stage's workers read images; they send each batch's labels to the last
stage's worker that computes its loss (a few bytes, and nothing node-local), so the design
runs the same across nodes as on one.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from harness.config.schema import DistbenchConfig
from harness.costs.partition import StagePlan
from harness.distributions.base import TrainingContext
from harness.distributions.spec import StagePlanner
from harness.measure.allocator import keep_freed_memory
from harness.measure.profiler import profile_layers
from harness.profiles.network import NetworkProfile
from workloads.datasets.loader import fetch_batch
from workloads.networks import to_layer_list

log = logging.getLogger(__name__)

LABEL_TAG = 7  # p2p tag of label messages, apart from the activations and gradients


def profile_network(
    config: DistbenchConfig,
    layers: Sequence[nn.Module],
    device: torch.device,
    *,
    spread: float = 0.0,
) -> NetworkProfile:
    """Each layer's forward, backward and update time, at the batch one stage processes at a
    time (the model's step batch), on `device` (fewer runs once steady within `spread`:
    `harness.measure.profiler.profile_layers`). A worker's layers are built on the CPU: on a
    GPU they are profiled there and put back, so that this worker's GPU holds only its own
    stage once the stages are built (a CUDA sample against CPU weights failed on an H100)."""
    keep_freed_memory()  # timed as a worker steps (harness.measure.allocator)
    generator = torch.Generator().manual_seed(config.run.seed)
    sample, _ = config.dataset.spec.example_batch(config.distribution.step_batch(config), generator)
    home = next(
        (tensor.device for layer in layers for tensor in (*layer.parameters(), *layer.buffers())),
        device,
    )
    for layer in layers:
        layer.to(device)
    try:
        return profile_layers(layers, sample.to(device), spread=spread)
    finally:
        for layer in layers:
            layer.to(home)


def shared_plan(
    context: TrainingContext, layers: Sequence[nn.Module], planner: StagePlanner
) -> StagePlan:
    """The stage plan, computed (and profiled, if needed) on rank 0 and broadcast to all.

    Workers time layers differently, so each profiling for itself could yield different plans.
    """
    config, peers = context.config, context.peers
    plan: StagePlan | str | None = None
    if peers.env.is_main:
        try:
            profile = (
                profile_network(config, layers, context.device)
                if planner.needs_profile(config)
                else None
            )
            plan = planner.plan(config, len(layers), profile)
        except ValueError as err:  # e.g. a balance that does not match the layer list
            plan = str(err)
    plan = peers.broadcast_from_main(plan)
    if not isinstance(plan, StagePlan):
        raise ValueError(plan)
    if plan.workers != peers.env.world_size:
        raise ValueError(
            f"the stage plan {plan.describe()} needs {plan.workers} workers, the "
            f"cell has {peers.env.world_size}"
        )
    log.info("rank %d: stage plan %s", peers.env.rank, plan.describe())
    return plan


def stage_module(context: TrainingContext, plan: StagePlan, stage: int) -> nn.Sequential:
    """This stage's layers, taken from the workload's model (seeded alike on every worker)."""
    layers = layer_list(context)
    part = plan.stages[stage]
    first = layers[part.first]
    if stage > 0 and getattr(first, "inplace", False):
        # A stage's input arrives as a leaf tensor that requires grad, which autograd forbids
        # modifying in place; the out-of-place ReLU computes the same.
        first.inplace = False  # type: ignore[assignment]
    return nn.Sequential(*layers[part.first : part.end]).to(context.device)


def layer_list(context: TrainingContext) -> list[nn.Module]:
    """The network's layer list, sharing the workload model's modules."""
    return to_layer_list(context.config.network.ref, context.workload.model)


class PipelineBatches:
    """The epoch's batches in pipeline order: the workload's (unsharded) loader's, reproducible
    from (seed, epoch) like every other model's, optionally cut or extended to `count` batches.

    Extending re-reads the epoch's first batches (oversampling); cutting drops the last ones.
    """

    def __init__(self, context: TrainingContext) -> None:
        self.loader = context.workload.loader
        self.dataset = self.loader.dataset
        self.device = context.device

    def __len__(self) -> int:
        """Full batches in one epoch of the dataset."""
        return len(self.loader)

    def indices(self, epoch: int, count: int | None = None) -> np.ndarray:
        """Dataset indices of the epoch's batches, shape (count, batch_size)."""
        self.loader.set_epoch(epoch)
        rows = self.loader.batch_indices()
        count = len(rows) if count is None else count
        if count <= len(rows):
            return rows[:count]
        return rows[np.arange(count) % len(rows)]

    def fetch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of `indices` on this worker's device: (images, labels)."""
        images, labels = fetch_batch(self.dataset, indices.tolist())
        return (
            images.to(self.device, non_blocking=True),
            labels.to(self.device, non_blocking=True),
        )


@dataclass
class StageEpochs:
    """What one pipeline stage's worker measured of its epochs: the idle share (`bubble`) and
    each phase's seconds, per epoch. Recorded per stage (`metrics`), so that a cell says where each
    stage spent its time, which the workers' mean phases hide (GPipe's misses are one stage's
    compute: docs/benchmarks/2026-11-29-gpipe-stages-in-place.md, "Where GPipe's stages spend their
    time, measured in place (2026-11-29)")."""

    idle: list[float] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)

    def add(self, epoch_seconds: float, phase_seconds: dict[str, float]) -> None:
        idle = bubble(epoch_seconds, phase_seconds)
        if idle is not None:
            self.idle.append(idle)
            self.phases.append(dict(phase_seconds))

    def metrics(self, stage: int) -> dict[str, float]:
        """`bubble_stage<k>` and `<phase>_seconds_per_epoch_stage<k>`, means over the epochs
        (none before an epoch was timed)."""
        if not self.idle:
            return {}
        metrics = {f"bubble_stage{stage}": statistics.fmean(self.idle)}
        for phase in self.phases[0]:
            metrics[f"{phase}_seconds_per_epoch_stage{stage}"] = statistics.fmean(
                epoch[phase] for epoch in self.phases
            )
        return metrics


def bubble(epoch_seconds: float, phase_seconds: dict[str, float]) -> float | None:
    """Idle share of an epoch: the time in no phase (data, forward, backward, optimizer) is
    time this stage waited for its neighbours. None when phases are not timed."""
    if not phase_seconds or epoch_seconds <= 0:
        return None
    return max(0.0, epoch_seconds - sum(phase_seconds.values())) / epoch_seconds
