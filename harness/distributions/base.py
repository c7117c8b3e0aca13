"""What every distribution model provides to the harness: warm-up and timed epochs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class EpochMeasurement:
    """One timed epoch as this worker saw it."""

    seconds: float  # wall clock from the first batch to the synchronised end of the last
    samples: int  # images trained in the epoch (by this worker)
    batches: int
    phase_seconds: dict[str, float] = field(default_factory=dict)  # empty if phase timing is off


class Trainer(Protocol):
    """A distribution model's training loop for one worker.

    The harness owns what is common (seeding, warm-up policy, the epoch loop, memory and
    recording); a trainer owns how a batch is trained under its distribution model.
    """

    def warm_up(self, batches: int) -> None:
        """Train `batches` batches untimed, so that lazy initialisation and caches settle."""

    def train_epoch(self, epoch: int) -> EpochMeasurement:
        """Train one whole epoch and time it, device synchronised at both ends."""
