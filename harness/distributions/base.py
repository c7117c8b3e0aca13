"""What every distribution model provides to the harness, and what it is given."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from harness.measure.metrics import PhaseClock

if TYPE_CHECKING:
    from harness.config.schema import DistbenchConfig
    from harness.runtime.distributed import Peers
    from harness.runtime.workload import Workload


@dataclass(frozen=True)
class EpochMeasurement:
    """One timed epoch as this worker saw it."""

    seconds: float  # wall clock from the first batch to the synchronised end of the last
    samples: int  # images trained in the epoch (by this worker)
    batches: int
    phase_seconds: dict[str, float] = field(default_factory=dict)  # empty if phase timing is off
    # The training loss of each batch this worker computed a loss for, by the batch's index in
    # the epoch: the mean over the samples this worker saw of it (a data-parallel worker: its
    # shard; a pipeline's last stage: every micro-batch). Read at the end of the epoch, so
    # recording it synchronises no device mid-epoch. Empty on a worker that computes no loss.
    batch_losses: dict[int, float] = field(default_factory=dict)


@dataclass
class TrainingContext:
    """Everything a distribution model needs to build its trainer for one worker."""

    config: DistbenchConfig
    workload: Workload  # this worker's shard of the data, and a fresh network
    device: torch.device
    clock: PhaseClock
    peers: Peers  # rank, world size, process group
    heartbeat: Callable[[], None]  # call after every batch: the watchdog's proof of progress


class Trainer(ABC):
    """A distribution model's training loop for one worker.

    The harness owns what is common (seeding, warm-up policy, the epoch loop, memory and
    recording); a trainer owns how a batch is trained under its distribution model. The four
    abstract methods are what every model must say; the others have the defaults of a
    data-parallel model, which the pipeline trainers override.
    """

    # Workers in one replica group hold replicas of the same parameters, which must stay in
    # sync (harness.worker.run compares their digests): one group for data parallelism, a pipeline
    # stage's replicas otherwise.
    replica_group: int = 0

    @abstractmethod
    def warm_up(self, batches: int) -> None:
        """Train `batches` batches untimed, so that lazy initialisation and caches settle."""

    @abstractmethod
    def train_epoch(self, epoch: int) -> EpochMeasurement:
        """Train one whole epoch and time it, device synchronised at both ends."""

    @abstractmethod
    def evaluation_model(self) -> torch.nn.Module:
        """The whole network with the weights trained so far, on this worker's device, for
        evaluation. A collective: every worker of the cell calls it (a pipeline worker holds
        one stage and gathers the others' weights)."""

    @abstractmethod
    def reset(self) -> None:
        """Return the parameters, buffers and optimizer state (momentum, a pipeline's stashed
        weights) to what they were when the trainer was built, so that each repeat trains from
        the same start and warm-up trains nothing that is measured (MLPerf's rule)."""

    def worker_batches(self, loader_batches: int) -> int:
        """The batches this worker trains in an epoch, of the `loader_batches` its data loader
        holds (the total of rank 0's progress bar): all of them unless a model divides them."""
        return loader_batches

    def extra_metrics(self) -> dict[str, float]:
        """What this model measured besides the epoch times, added to the cell's metrics."""
        return {}

    def in_trained_form(self, network: torch.nn.Module) -> torch.nn.Module:
        """A freshly built network in the form this trainer trains it (the same function and
        weights, maybe other modules: a tensor-parallel plan's rewrite), whose state then
        loads into the trained network: a repeat's initial weights. The network itself by
        default."""
        return network

    def compute_dtype(self) -> torch.dtype | None:
        """The dtype the layers compute in where it is not the parameters' (mixed precision:
        bfloat16 compute of float32 weights), for MLPerf's lowest numerical precision; None:
        the parameters'."""
        return None

    def resolved_config(self) -> dict[str, Any]:
        """Config values the trainer resolved (a planned balance), recorded with the cell."""
        return {}

    def finish(self) -> None:
        """Stop what the trainer runs beside its training (Horovod's background thread), once
        its last epoch is timed and evaluated: the reference kernel timed next is to measure
        the machine, not the trainer (`harness.measure.steadiness`)."""
        return None  # most models run nothing beside their training


TrainerFactory = Callable[[TrainingContext], Trainer]
