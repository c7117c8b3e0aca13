"""`sequential`: plain PyTorch on one device, the baseline every speedup is measured against."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from harness.config.schema import DistbenchConfig, HardwareConfig
from harness.costs.memory import WorkerMemory
from harness.costs.partition import StagePlan
from harness.costs.terms import CellFacts, EpochTerms, batches_per_epoch, replica_memory
from harness.distributions.layer_settings import LayerSettingsConfig
from harness.distributions.spec import (
    DistributionSpec,
    WorkerCounts,
    candidate,
    candidate_settings,
    trainer_in,
)
from harness.profiles.hardware import HardwareProfile


@dataclass
class SequentialConfig(LayerSettingsConfig):
    """One worker, whatever the hardware has; activation checkpointing and precision
    (`LayerSettingsConfig`) are its only settings."""

    name: str = "sequential"

    def run_name_parts(self, cell: DistbenchConfig) -> list[str]:
        return self.layer_name_parts()

    def workers(self, hardware: HardwareConfig) -> int:
        return 1


def epoch_terms(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile | None
) -> EpochTerms:
    """The probe's step time, once per batch: the statistical model itself."""
    steps = batches_per_epoch(config)
    return EpochTerms(steps * facts.step_seconds, steps=steps)


def memory_per_worker(config: DistbenchConfig, facts: CellFacts) -> list[WorkerMemory]:
    return [replica_memory(config, facts)]


def candidates(asked: DistbenchConfig, counts: WorkerCounts) -> Iterator[DistbenchConfig]:
    yield candidate(asked, candidate_settings(asked, SequentialConfig), 1, 1)


def label(config: DistbenchConfig, plan: StagePlan | None) -> str:
    return "sequential"


SPEC = DistributionSpec(
    name="sequential",
    title="sequential PyTorch",
    settings=SequentialConfig,
    trainer=trainer_in(f"{__name__}.trainer", "sequential_trainer"),
    epoch_terms=epoch_terms,
    memory_per_worker=memory_per_worker,
    candidates=candidates,
    label=label,
    baseline=True,
)
