"""What the facts cache asks of whatever measures on this machine: one method per kind of
measurement. Prediction only decides what to measure and keeps what comes back; the measuring
itself trains a network's layers, starts a worker process or a pipeline's stages, so it lives
with the workers (`harness.worker.measurements.WorkerMeasurements`), which the commands that
may measure hand to the cache. A cache given none measures nothing (`harness.predict.facts`).

Every record named here is of a layer below the worker (`harness.profiles`, `harness.costs`),
so that the workers can return it without importing prediction.
"""

from __future__ import annotations

from typing import Protocol

from harness.config.schema import DistbenchConfig
from harness.costs.activations import SavedActivations
from harness.costs.partition import StagePlan
from harness.profiles.network import NetworkProfile
from harness.profiles.runtime import RuntimeShare
from harness.profiles.stages import InPlaceStages
from harness.profiles.steps import BatchTiming


class RuntimeMemoryProbe(Protocol):
    """A worker's runtime memory being measured in a process of its own, started by
    `Measurements.runtime_memory`: it measures memory, not time, so it runs while the caller
    does work that times nothing (describing the network), never beside a timing."""

    def read(self) -> RuntimeShare:
        """Wait for the measurement and return it."""
        ...

    def stop(self) -> None:
        """End the measurement unread (the work it ran beside failed): no process is left."""
        ...


class Measurements(Protocol):
    """The measurements a prediction may need taken on this machine."""

    def step_time(
        self,
        config: DistbenchConfig,
        batch: int,
        *,
        threads: int | None,
        probe_batches: int,
        spread: float,
    ) -> BatchTiming:
        """One sequential training step of `config`'s network at `batch`, timed on one worker
        of this machine's device with torch on `threads` (None: as it is), up to
        `probe_batches` timed steps, fewer once their spread is within `spread`
        (`harness.measure.timing_rule.ProbeLength`), with the reference kernel timed around
        it (`BatchTiming.reference_ms`: the machine's speed then)."""
        ...

    def runtime_memory(self, config: DistbenchConfig) -> RuntimeMemoryProbe:
        """Start measuring the memory a worker of `config` holds besides the model, in a fresh
        process (`harness.worker.runtime_memory`); read it, or stop it, later."""
        ...

    def saved_activations(self, config: DistbenchConfig) -> SavedActivations:
        """What autograd saves per layer of `config`'s network for its data set: sizes,
        measured on this machine's CPU whatever the device (`harness.measure.saved_activations`)."""
        ...

    def layer_profile(
        self, config: DistbenchConfig, *, threads: int | None, spread: float
    ) -> NetworkProfile:
        """Each layer's forward, backward and update time of `config`'s network at the batch its
        workers step on, on this machine's CPU with torch on `threads` (the shares, not the
        times, are what a prediction uses; fewer runs once steady within `spread`)."""
        ...

    def stages_in_place(self, config: DistbenchConfig, plan: StagePlan) -> InPlaceStages:
        """A pipeline cell's stages with `plan`'s balance, timed in place by a short training
        run, each stage a worker process (`python -m harness.stage_timing`); RuntimeError
        where that run fails."""
        ...
