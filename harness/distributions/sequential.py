"""`sequential`: plain PyTorch on one device, the baseline every speedup is measured against."""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch import nn
from tqdm import tqdm

from harness.distributions.base import EpochMeasurement
from harness.metrics import PhaseClock, synchronize
from harness.workload import Workload


class SequentialTrainer:
    """Forward, backward and optimizer step on one device, one batch at a time."""

    def __init__(self, workload: Workload, device: torch.device, clock: PhaseClock,
                 progress: bool = True) -> None:
        self.model = workload.model.to(device)
        self.loader = workload.loader
        self.optimizer = workload.make_optimizer(self.model.parameters())
        self.criterion = nn.CrossEntropyLoss()
        self.device = device
        self.clock = clock
        self.progress = progress

    def warm_up(self, batches: int) -> None:
        if batches <= 0:
            return
        self.model.train()
        self.loader.set_epoch(0)
        for _, batch in zip(range(batches), self.loader):
            self._train_batch(*self._to_device(batch))
        synchronize(self.device)
        self.clock.reset()

    def train_epoch(self, epoch: int) -> EpochMeasurement:
        self.model.train()
        self.loader.set_epoch(epoch)
        synchronize(self.device)
        start = time.perf_counter()
        batches = 0
        for images, labels in self._timed_batches(epoch):
            self._train_batch(images, labels)
            batches += 1
        synchronize(self.device)
        seconds = time.perf_counter() - start
        return EpochMeasurement(
            seconds=seconds,
            samples=batches * self.loader.batch_size,
            batches=batches,
            phase_seconds=self.clock.reset(),
        )

    def _timed_batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield the epoch's batches, charging the time spent waiting for each to `data`."""
        batches = iter(self.loader)
        with tqdm(total=len(self.loader), desc=f"epoch {epoch}", unit="batch",
                  disable=not self.progress, leave=False, mininterval=1.0) as bar:
            while True:
                with self.clock.phase("data"):
                    batch = next(batches, None)
                    if batch is not None:
                        batch = self._to_device(batch)
                if batch is None:
                    return
                yield batch
                bar.update()

    def _to_device(self, batch: tuple[torch.Tensor, torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = batch
        return (images.to(self.device, non_blocking=True),
                labels.to(self.device, non_blocking=True))

    def _train_batch(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        with self.clock.phase("forward"):
            loss = self.criterion(self.model(images), labels)
        with self.clock.phase("backward"):
            loss.backward()
        with self.clock.phase("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
