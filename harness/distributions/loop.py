"""The batch loop shared by the models that train whole batches on every worker.

`sequential` runs it on one device; `ddp` runs it on every worker with the network wrapped in
DistributedDataParallel, `horovod` with the optimizer wrapped in Horovod's
DistributedOptimizer; both average gradients while the backward pass runs. Their
`GradientSync` tells the loop how long a batch waited for that communication once its own
compute was done (the `comm_wait` phase).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from harness.distributions.base import EpochMeasurement, Trainer, TrainingContext
from harness.distributions.layer_settings import Precision
from harness.distributions.layer_training import (
    as_input,
    compute_context,
    compute_dtype,
    loss_dtype,
)
from harness.distributions.state import InitialState, epoch_losses
from harness.measure.metrics import PhaseClock, device_time, synchronize
from workloads.task import TaskLoss


class GradientSync(Protocol):
    """How a data-parallel model's gradient averaging shows in the batch loop."""

    def waited_in_backward(self) -> float:
        """Seconds of the last backward pass spent waiting for communication after the
        gradients were computed (DDP waits inside backward); 0 if it does not wait there."""

    def wait(self, optimizer: torch.optim.Optimizer) -> None:
        """Block until the gradients are averaged (Horovod waits here, before the step)."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step, once `wait` has returned."""


class BatchLoopTrainer(Trainer):
    """Forward, backward and optimizer step, one batch at a time, on this worker's device.

    Build it once the replicas agree (after DDP's or Horovod's broadcast): it captures the
    initial state that `reset` returns to (one more copy of the network and of the optimizer's
    state on this worker's device).
    """

    def __init__(
        self,
        context: TrainingContext,
        model: nn.Module,
        wrap_optimizer: Callable[[torch.optim.Optimizer], torch.optim.Optimizer] | None = None,
        gradient_sync: GradientSync | None = None,
        precision: Precision = Precision.fp32,
        precision_cast_elsewhere: bool = False,
    ) -> None:
        self.model = model
        self.network = context.workload.model  # `model` unwrapped (DDP wraps it)
        self.loader = context.workload.loader
        self.optimizer = context.workload.make_optimizer(self.model.parameters())
        if wrap_optimizer is not None:  # e.g. Horovod's DistributedOptimizer
            self.optimizer = wrap_optimizer(self.optimizer)
        self.gradient_sync = gradient_sync
        self.criterion = TaskLoss()
        # bf16_mixed autocasts the forward unless FSDP2's policy casts the parameters itself
        self.precision = precision
        self.precision_cast_elsewhere = precision_cast_elsewhere
        self.device = context.device
        self.clock = context.clock
        self.heartbeat = context.heartbeat
        # Objects that must live as long as training does (e.g. Horovod's rendezvous server).
        self.keep_alive: list[object] = []
        # What stops the model's work beside training once it is over (`Trainer.finish`).
        self.finishers: list[Callable[[], None]] = []
        self.initial = InitialState.capture(self.network, self.optimizer)

    def compute_dtype(self) -> torch.dtype | None:
        return compute_dtype(self.precision)

    def evaluation_model(self) -> nn.Module:
        """The network itself: every replica holds all of it. The parameters are equal on
        every replica; the buffers (BatchNorm's running statistics) are not, each replica
        having updated them with its own shards, so rank 0's are broadcast to the others first,
        as DDP does before each forward: every worker then evaluates the same network."""
        if dist.is_available() and dist.is_initialized():
            for buffer in self.network.buffers():
                dist.broadcast(buffer, src=0)
        return self.network

    def reset(self) -> None:
        self.initial.restore(self.network, self.optimizer)

    def finish(self) -> None:
        for finisher in self.finishers:
            finisher()

    def warm_up(self, batches: int) -> None:
        if batches <= 0:
            return
        self.model.train()
        self.loader.set_epoch(0)
        for _, batch in zip(range(batches), self.loader):
            self._train_batch(*self._to_device(batch))
            self.heartbeat()
        synchronize(self.device)
        self.clock.reset()

    def time_batches(
        self, count: int, enough: Callable[[list[float]], bool] | None = None
    ) -> list[float]:
        """Train `count` batches (as many epochs of the loader as that takes; fewer once
        `enough` says so of the seconds so far) and return the seconds of each, device
        synchronised: the sequential predictor's probe."""
        self.model.train()
        seconds: list[float] = []
        epoch = 0
        while len(seconds) < count:
            self.loader.set_epoch(epoch)
            for batch in self.loader:
                if len(seconds) == count:
                    break
                images, labels = self._to_device(batch)
                start = device_time(self.device)
                self._train_batch(images, labels)
                seconds.append(device_time(self.device) - start)
                if enough is not None and enough(seconds):
                    return seconds
            epoch += 1
        return seconds

    def train_epoch(self, epoch: int) -> EpochMeasurement:
        self.model.train()
        self.loader.set_epoch(epoch)
        start = device_time(self.device)
        losses: dict[int, torch.Tensor] = {}  # kept on the device, read after the epoch
        for batch, (images, labels) in enumerate(self._timed_batches()):
            losses[batch] = self._train_batch(images, labels)
            self.heartbeat()
        seconds = device_time(self.device) - start
        return EpochMeasurement(
            seconds=seconds,
            samples=len(losses) * self.loader.batch_size,
            batches=len(losses),
            phase_seconds=self.clock.reset(),
            batch_losses=epoch_losses(losses),
        )

    def _timed_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return timed_batches(self.loader, self.clock, self.device)

    def _to_device(
        self, batch: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = batch
        return (
            images.to(self.device, non_blocking=True),
            labels.to(self.device, non_blocking=True),
        )

    def _train_batch(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Train one batch; its loss (this worker's shard's mean), detached, not yet read."""
        with self.clock.phase("forward"):
            with compute_context(self.precision, self.device, self.precision_cast_elsewhere):
                output = self.model(as_input(images, self.precision))
            loss = self.criterion(loss_dtype(output), labels)
        with self.clock.phase("backward"):
            loss.backward()
        sync = self.gradient_sync
        if sync is not None:  # a data-parallel worker: account for the wait on its peers
            self.clock.transfer("backward", "comm_wait", sync.waited_in_backward())
            with self.clock.phase("comm_wait"):
                sync.wait(self.optimizer)
        with self.clock.phase("optimizer"):
            if sync is None:
                self.optimizer.step()
            else:
                sync.step(self.optimizer)
            self.optimizer.zero_grad()  # torch 2 frees the gradients (set_to_none=True)
        return loss.detach()


def timed_batches(
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]], clock: PhaseClock, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield the epoch's batches on `device`, charging the time spent waiting for each (the
    loader's, and its copy to the device) to the `data` phase."""
    batches = iter(loader)
    while True:
        with clock.phase("data"):
            batch = next(batches, None)
            if batch is not None:
                images, labels = batch
                batch = (
                    images.to(device, non_blocking=True),
                    labels.to(device, non_blocking=True),
                )
        if batch is None:
            return
        yield batch
