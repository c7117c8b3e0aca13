"""One cell's predicted seconds per epoch and memory per worker, for any distribution model:
each model's own equations (`DistributionSpec.epoch_terms`, `.memory_per_worker`, in its
module of `harness.distributions`) on the cell's measured facts. What the terms are is in
`harness.costs.terms`."""

from __future__ import annotations

from harness.config.schema import DistbenchConfig
from harness.costs.memory import WorkerMemory, held_on_the_device
from harness.costs.terms import CellFacts, EpochTerms, batches_per_epoch
from harness.distributions.registry import spec_of
from harness.profiles.hardware import HardwareProfile


def epoch_terms(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile | None
) -> EpochTerms:
    """The cell's epoch split into compute, allreduce, transfer and steps (raw equations).
    A one-worker cell of any model is the probe's step, once per batch."""
    if config.world_size == 1:
        steps = batches_per_epoch(config)
        return EpochTerms(steps * facts.step_seconds, steps=steps)
    assert profile is not None, (
        f"{config.distribution.name} over {config.world_size} workers needs a profile"
    )
    return spec_of(config).epoch_terms(config, facts, profile)


def memory_per_worker_mb(
    config: DistbenchConfig, facts: CellFacts, *, runtime_mb: float = 0.0
) -> list[float]:
    """Predicted peak MB of every worker (`predict.memory`): the model's terms, the measured
    runtime share (`facts.runtime_mb`) and `runtime_mb`, a remainder learnt from other cells."""
    return [worker.total + runtime_mb for worker in memory_terms_per_worker(config, facts)]


def recorded_peak_mb(config: DistbenchConfig, facts: CellFacts) -> float:
    """The largest worker's predicted peak as its cell records it, to be compared with the
    recorded `peak_memory_mb`: on CUDA the cell records the allocator's peak
    (`max_memory_allocated`), which leaves the context out (`CellFacts.context_mb`), while a
    prediction of what fits a device must count it (`memory_per_worker_mb`). Compared with the
    context counted, every CUDA cell read as over-predicted by it, and the remainder the
    analysis learns from the cells (`harness.analysis.fit.runtime_mb`) came out near minus the
    context, which the recommender would then have taken off every CUDA prediction."""
    return max(memory_per_worker_mb(config, facts)) - facts.context_mb


def memory_terms_per_worker(config: DistbenchConfig, facts: CellFacts) -> list[WorkerMemory]:
    """Every worker's predicted peak, term by term (`predict.memory.WorkerMemory`): its
    model's terms, and what every model's worker holds besides (`held_on_the_device`)."""
    cuda = config.hardware.device.value == "cuda"
    return [
        held_on_the_device(worker, cuda=cuda)
        for worker in spec_of(config).memory_per_worker(config, facts)
    ]


def cost_per_epoch(config: DistbenchConfig, seconds: float) -> float | None:
    """The hardware's price of an epoch: devices in use x hours x price per device-hour."""
    price = config.hardware.price_per_device_hour
    if price is None:
        return None
    return config.world_size * seconds / 3600 * price
