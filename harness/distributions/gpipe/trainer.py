"""How `gpipe` trains (its spec, what it costs and offers: the package's __init__). Imported
by a worker only: predicting and the commands never load a trainer."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.utils.checkpoint import checkpoint

from harness.distributions.base import EpochMeasurement, Trainer, TrainingContext
from harness.distributions.gpipe import PLANNER, Recompute, gpipe_settings
from harness.distributions.pipeline import (
    LABEL_TAG,
    PipelineBatches,
    StageEpochs,
    layer_list,
    shared_plan,
    stage_module,
)
from harness.distributions.state import InitialState, assemble_network, epoch_losses
from harness.measure.metrics import PhaseClock, device_time, synchronize
from workloads.task import TaskLoss


class RecomputingStage(nn.Module):
    """A stage's layers whose forward is checkpointed for the micro-batches `policy` names."""

    def __init__(self, layers: nn.Module, policy: Recompute, micro_batches: int) -> None:
        super().__init__()
        self.layers = layers
        self.policy = policy
        self.micro_batches = micro_batches
        self.micro_batch = 0  # set by TimedStage before each micro-batch's forward

    def recomputes(self, micro_batch: int) -> bool:
        if self.policy is Recompute.always:
            return True
        if self.policy is Recompute.except_last:
            return micro_batch < self.micro_batches - 1
        return False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.recomputes(self.micro_batch):
            return checkpoint(self.layers, x, use_reentrant=False)
        return self.layers(x)


class TimedStage(PipelineStage):
    """A PipelineStage that tells its module which micro-batch runs, and charges forward and
    backward compute to the phase clock (what is left of the epoch is the bubble)."""

    def __init__(self, module: RecomputingStage, clock: PhaseClock, **kwargs: Any) -> None:
        super().__init__(module, **kwargs)
        self.recomputing = module
        self.clock = clock

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        self.recomputing.micro_batch = fwd_chunk_id
        with self.clock.phase("forward"):
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        with self.clock.phase("backward"):
            return super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)


class GPipeTrainer(Trainer):
    """One GPipe stage on this worker."""

    def __init__(self, context: TrainingContext) -> None:
        config, env = context.config, context.peers.env
        if not env.is_distributed:
            raise ValueError(
                "distribution.name=gpipe needs 2 or more workers "
                "(hardware.nodes x hardware.workers_per_node)"
            )
        self.device = context.device
        self.network = context.workload.model
        self.peers = context.peers
        self.clock = context.clock
        self.heartbeat = context.heartbeat
        settings = gpipe_settings(config)
        self.micro_batches = settings.micro_batch_count(config)
        self.plan = shared_plan(context, layer_list(context), PLANNER)
        self.stage_index, _ = self.plan.stage_of(env.rank)
        self.num_stages = len(self.plan.stages)
        self.is_first = self.stage_index == 0
        self.is_last = self.stage_index == self.num_stages - 1
        self.last_rank = env.world_size - 1
        self.module = stage_module(context, self.plan, self.stage_index)
        self.stage = TimedStage(
            RecomputingStage(self.module, settings.recompute, self.micro_batches),
            self.clock,
            stage_index=self.stage_index,
            num_stages=self.num_stages,
            device=self.device,
        )
        self.criterion = TaskLoss()
        self.target_shape = context.workload.spec.target_shape  # () for a label, (T,) for tokens
        # Every stage gets the loss (only the last computes it; without one the schedule runs
        # no backward). scale_grads: the micro-batches' mean losses are averaged, so the
        # gradient is that of the whole batch's mean loss, as the sequential model computes it.
        self.schedule = ScheduleGPipe(
            self.stage, self.micro_batches, loss_fn=self.criterion, scale_grads=True
        )
        self.optimizer = context.workload.make_optimizer(self.module.parameters())
        self.batches = PipelineBatches(context)
        self.batch_size = config.batch_size
        self.replica_group = self.stage_index  # each stage is its own (single) replica
        self._epochs = StageEpochs()  # this stage's idle share and phases, per epoch
        self._resolved = {"balance": self.plan.balance, "micro_batches": self.micro_batches}
        self.initial = InitialState.capture(self.module, self.optimizer)  # this stage's only

    # -- the Trainer protocol ------------------------------------------------------------
    def warm_up(self, batches: int) -> None:
        if batches <= 0:
            return
        for row in self.batches.indices(0, min(batches, len(self.batches))):
            self.train_batch(row)
            self.heartbeat()
        synchronize(self.device)
        self.clock.reset()

    def train_epoch(self, epoch: int) -> EpochMeasurement:
        self.module.train()
        rows = self.batches.indices(epoch)
        start = device_time(self.device)
        losses: dict[int, torch.Tensor] = {}  # the last stage's, read after the epoch
        for batch, row in enumerate(rows):
            loss = self.train_batch(row)
            if loss is not None:
                losses[batch] = loss
            self.heartbeat()
        seconds = device_time(self.device) - start
        phases = self.clock.reset()
        self._epochs.add(seconds, phases)
        # Samples counted once per cell: the first stage's; the others report 0.
        return EpochMeasurement(
            seconds=seconds,
            samples=len(rows) * self.batch_size if self.is_first else 0,
            batches=len(rows),
            phase_seconds=phases,
            batch_losses=epoch_losses(losses),
        )

    def evaluation_model(self) -> nn.Module:
        """The whole network with every stage's current weights (a collective; memory: see
        state.assemble_network)."""
        return assemble_network(
            self.network, self.module, contributes=True, peers=self.peers, device=self.device
        )

    def reset(self) -> None:
        self.initial.restore(self.module, self.optimizer)

    # -- what the harness records besides the epochs ----------------------------------------
    def extra_metrics(self) -> dict[str, float]:
        metrics = {
            "micro_batches": float(self.micro_batches),
            "micro_batch_size": float(self.batch_size // self.micro_batches),
            "pipeline_stages": float(self.num_stages),
        }
        metrics.update(self._epochs.metrics(self.stage_index))
        return metrics

    def resolved_config(self) -> dict[str, Any]:
        return dict(self._resolved)

    # -- one batch -------------------------------------------------------------------------
    def train_batch(self, row: Any) -> torch.Tensor | None:
        """Forward and backward of every micro-batch of the batch `row` (dataset indices), then
        one optimizer step; on the last stage, the batch's loss (detached, not yet read)."""
        loss = self.accumulate_gradients(*self._inputs(row))
        with self.clock.phase("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad()
        return loss

    def accumulate_gradients(
        self, images: torch.Tensor | None, labels: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Run the GPipe schedule over one batch; the stage's gradients are then the batch's.

        The first stage passes `images`, the last `labels`, the others neither. The last stage
        returns the batch's loss: the mean of its micro-batches' mean losses (micro-batches of
        equal size: the batch's mean loss), detached.
        """
        if self.is_first and self.is_last:
            raise ValueError("a one-stage GPipe is the sequential model")
        if self.is_first:
            self.schedule.step(images)
        elif self.is_last:
            losses: list[torch.Tensor] = []
            self.schedule.step(target=labels, losses=losses)
            return torch.stack([loss.detach() for loss in losses]).mean()
        else:
            self.schedule.step()
        return None

    def _inputs(self, row: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Images on the first stage; the labels travel from there to the last stage."""
        if self.is_first:
            with self.clock.phase("data"):
                images, labels = self.batches.fetch(row)
            dist.send(labels, self.last_rank, tag=LABEL_TAG)
            return images, None
        if self.is_last:
            labels = torch.empty(
                (self.batch_size, *self.target_shape), dtype=torch.int64, device=self.device
            )
            dist.recv(labels, 0, tag=LABEL_TAG)
            return None, labels
        return None, None


def gpipe_trainer(context: TrainingContext) -> GPipeTrainer:
    return GPipeTrainer(context)
