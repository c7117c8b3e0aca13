"""Distribution models: each builds a Trainer for one worker of a grid cell.

The config schema names all five models of the design (`DistributionName`); this registry
holds the ones that are implemented. Asking for another fails before anything runs.
"""

from __future__ import annotations

from harness.distributions.base import EpochMeasurement, Trainer, TrainerFactory, TrainingContext
from harness.distributions.ddp import ddp_trainer
from harness.distributions.gpipe import gpipe_trainer
from harness.distributions.horovod import horovod_trainer
from harness.distributions.pipedream import pipedream_trainer
from harness.distributions.sequential import sequential_trainer

TRAINERS: dict[str, TrainerFactory] = {
    "sequential": sequential_trainer,
    "ddp": ddp_trainer,
    "horovod": horovod_trainer,
    "gpipe": gpipe_trainer,
    "pipedream": pipedream_trainer,
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


__all__ = ["EpochMeasurement", "TRAINERS", "Trainer", "TrainingContext", "trainer_factory"]
