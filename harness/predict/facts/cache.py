"""The facts cache: what one analysis, recommendation or dry run has learnt about its cells'
workloads, so that each fact is read or measured once however many cells need it.

A `FactsCache` holds the command's `FactsPolicy`, the `Measurements` it may take (None: it
measures nothing), the facts found so far keyed by what determines them (network, dataset,
device, threads, batch), and a log of what was measured here and why a step time was missing,
for the user. `gather` (`harness.predict.facts.gather`) fills it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from harness.config.schema import DistbenchConfig
from harness.costs.activations import SavedActivations
from harness.measure.timing_rule import STEADY_SPREAD
from harness.predict.facts.measurements import Measurements
from harness.predict.facts.policy import FactsPolicy
from harness.predict.facts.store import worker_threads
from harness.profiles.network import NetworkProfile
from harness.profiles.runtime import RuntimeShare
from harness.profiles.stages import InPlaceStages
from harness.profiles.steps import MeasuredStep, StepTime, contradict


class ProfileKey(NamedTuple):
    """What a layer profile depends on: the workload, the device and its threads, and the batch
    the cell's workers step on (each layer's share of a step moves with the batch)."""

    network: str
    dataset: str
    device: str
    threads: int | None
    batch: int


@dataclass
class FactsCache:
    """Facts shared between the cells of one analysis, recommendation or dry run."""

    policy: FactsPolicy = field(default_factory=FactsPolicy)
    # What measures on this machine (`harness.worker.measurements.WorkerMeasurements`); None:
    # nothing is measured, only kept facts are read (step times as with `probe=False`).
    measurements: Measurements | None = None
    # Sequential step seconds and where each came from, per `step_key`.
    step_seconds: dict[tuple[Any, ...], float] = field(default_factory=dict)
    sources: dict[tuple[Any, ...], StepTime] = field(default_factory=dict)
    # Layer profiles per `ProfileKey`, and where each came from.
    profiles: dict[tuple[Any, ...], NetworkProfile] = field(default_factory=dict)
    profile_sources: dict[tuple[Any, ...], str] = field(default_factory=dict)
    # `harness.measure.network_facts.describe()` per (network, dataset): free, static.
    static: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # (network, dataset, device, threads) -> the step times the facts file and MLflow hold,
    # and where they were looked for.
    recorded: dict[tuple[Any, ...], tuple[list[MeasuredStep], list[str]]] = field(
        default_factory=dict
    )
    # Memory facts: saved activations per (network, dataset) (None: none to be had), the
    # runtime share per `harness.predict.facts.store.runtime_key`.
    saved_activations: dict[tuple[str, str], SavedActivations | None] = field(default_factory=dict)
    runtime: dict[tuple[Any, ...], RuntimeShare] = field(default_factory=dict)
    # A pipeline's stages timed in place per `in_place_key` (None: none to be had).
    in_place: dict[tuple[Any, ...], InPlaceStages | None] = field(default_factory=dict)
    measured: list[str] = field(default_factory=list)  # what was measured here, for the user
    # Why no step time could be had (MissingMeasurement's message: what to measure, where),
    # once a recommendation fell back to memory only; None while times are known.
    missing_step_time: str | None = None


def cache_for(
    probe_batches: int,
    *,
    measurements: Measurements | None = None,
    probe: bool = True,
    facts_root: Path | None = None,
    reuse: bool = False,
    tracking_uri: str | None = None,
    probe_spread: float = STEADY_SPREAD,
    measure_memory: bool = True,
    time_in_place: bool = False,
    remeasure_batches: frozenset[int] = frozenset(),
) -> FactsCache:
    """A fresh cache for a command's flags (`--probe-batches` and `--probe-spread` checked like
    config keys: `FactsPolicy`), measuring with `measurements` (None: nothing)."""
    policy = FactsPolicy(
        probe_batches=probe_batches,
        probe_spread=probe_spread,
        probe=probe,
        facts_root=facts_root,
        tracking_uri=tracking_uri,
        measure_memory=measure_memory,
        reuse=reuse,
        time_in_place=time_in_place,
        remeasure_batches=remeasure_batches,
    )
    return FactsCache(policy, measurements)


def step_key(config: DistbenchConfig, batch: int, cache: FactsCache) -> tuple[Any, ...]:
    """What a sequential step time depends on: the workload, the device and its threads, the
    batch, and the probe's length asked for."""
    return (
        config.network.key,
        config.dataset.key,
        config.hardware.device.value,
        worker_threads(config),
        batch,
        cache.policy.probe_batches,
    )


def step_time_source(config: DistbenchConfig, cache: FactsCache) -> StepTime | None:
    """Where the step time of `config`'s prediction came from (after `gather`)."""
    return cache.sources.get(step_key(config, config.distribution.step_batch(config), cache))


def step_times_used(cache: FactsCache) -> list[tuple[str, StepTime]]:
    """Every step time the cache handed out, with the workload it is of ("resnet50/cifar10
    on cpu, 1 thread(s)"), by workload and batch."""
    used = []
    for (network, dataset, device, threads, _, _), step in cache.sources.items():
        on = f"{network}/{dataset} on {device}" + (f", {threads} thread(s)" if threads else "")
        used.append((on, step))
    return sorted(used, key=lambda item: (item[0], item[1].batch))


# A step time's key in `FactsCache.sources` (`step_key`).
StepKey = tuple[Any, ...]


def contradicting_steps(cache: FactsCache) -> list[tuple[StepKey, StepKey]]:
    """The pairs (smaller batch, larger batch) of step times the cache handed out, of one
    workload on one device and its threads, each measured at its own batch, that contradict
    each other (`harness.profiles.steps.contradict`)."""
    by_workload: dict[StepKey, list[StepKey]] = {}
    for key, step in cache.sources.items():
        if not step.scaled:
            by_workload.setdefault(_without_batch(key), []).append(key)
    pairs = []
    for keys in by_workload.values():
        ordered = sorted(keys, key=lambda key: cache.sources[key].batch)
        pairs += [
            (smaller, larger)
            for smaller, larger in itertools.combinations(ordered, 2)
            if contradict(cache.sources[smaller], cache.sources[larger])
        ]
    return pairs


def _without_batch(key: StepKey) -> StepKey:
    network, dataset, device, threads, _, probe_batches = key
    return (network, dataset, device, threads, probe_batches)
