"""Distribution models: each builds a Trainer for one worker of a grid cell.

The config schema names all five models of the design (`DistributionName`); this registry
holds the ones that are implemented. Asking for another fails before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from harness.distributions.base import EpochMeasurement, Trainer
from harness.distributions.sequential import SequentialTrainer
from harness.metrics import PhaseClock
from harness.workload import Workload

TrainerFactory = Callable[[Workload, torch.device, PhaseClock, bool], Trainer]

TRAINERS: dict[str, TrainerFactory] = {
    "sequential": SequentialTrainer,
}


def trainer_factory(name: str) -> TrainerFactory:
    """The factory of distribution model `name`; ValueError names the implemented ones."""
    try:
        return TRAINERS[name]
    except KeyError:
        raise ValueError(
            f"distribution.name={name!r} is not implemented yet; implemented: "
            f"{', '.join(TRAINERS)}"
        ) from None


__all__ = ["EpochMeasurement", "TRAINERS", "Trainer", "trainer_factory"]
