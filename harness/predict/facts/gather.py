"""A cell's facts gathered (`gather`), and the decisions on the way: where each fact comes from.

- The static facts (sizes per layer) are traced on the meta device, always, for free.
- A sequential step time comes from the grid's one-worker cells where the policy asks for them
  (`steps_from_cells`), else from a probe here where the policy allows one, a measurer is
  given and this machine has the device (the facts file's, for this machine's device, where
  the policy reuses kept facts), else from the facts file and MLflow's sequential cells
  (`recorded_step_time`), else it is a `MissingMeasurement`.
- A layer profile, where the cell needs one (`needs_layer_profile`): the facts file's where
  the device is not probed here (or reused), else profiled on this CPU; estimated from each
  layer's parameters where the network is too large to profile here, no step time can rank
  the options, or nothing measures.
- A pipeline's stages timed in place: the facts file's, else timed here where the policy
  asks for it (`time_in_place`) and the device is probed here.
- Memory facts (saved activations, a worker's runtime share), with `measure_memory`: measured
  here, or the facts file's where the policy reuses them, the device is not here, or nothing
  measures; where none is kept then, the memory model's fallback (layer outputs, no runtime
  share).

What is measured is kept in the facts file and, for step times and layer profiles, read back
from it, so that a first run and a later one use the same numbers.
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.config.schema import ConfigError, DistbenchConfig
from harness.config.units import BYTES_PER_MB
from harness.config.weight_memory import gigabytes
from harness.costs.activations import SavedActivations
from harness.costs.partition import StagePlan
from harness.costs.terms import CellFacts, LayerFacts, allreduces_overlap_backward
from harness.distributions.registry import one_worker_cell, spec_of
from harness.predict.facts.cache import FactsCache, ProfileKey, StepKey, step_key
from harness.predict.facts.measurements import Measurements
from harness.predict.facts.store import (
    FactsStore,
    MissingMeasurement,
    in_place_key,
    keep,
    runtime_key,
    worker_threads,
)
from harness.predict.recorded import sequential_steps
from harness.profiles.network import LayerProfile, NetworkProfile
from harness.profiles.runtime import RuntimeShare
from harness.profiles.stages import InPlaceStages
from harness.profiles.steps import BatchTiming, MeasuredStep, StepTime, choose_step_time

PROBED_HERE = "probed here"

# A network whose float32 weights exceed this is not built on the CPU to profile its layers
# (Llama 3 8B would take 32 GB of this machine's 24): `parameter_profile` stands in.
CPU_PROFILE_LIMIT_BYTES = 4 * 1024**3

PhaseShares = tuple[float, float, float]  # a layer's forward, backward, update share


def gather(config: DistbenchConfig, cache: FactsCache, *, timed: bool = True) -> CellFacts:
    """Facts for `config`: what `cache` holds, else kept, else measured by its `measurements`.
    `timed=False` skips the step time (NaN): what a memory-only prediction needs, e.g. for a
    cell that did not fit, whose batch may not fit this machine either."""
    from harness.measure.network_facts import FLOAT32_BYTES

    started = time.perf_counter()
    spec = config.dataset.spec
    workload = (config.network.key, config.dataset.key)
    # A worker's runtime memory, if it is to be measured, is measured beside describing the
    # network (memory and a static trace: neither is a timing), before anything is timed.
    with _runtime_measured_meanwhile(config, cache):
        if workload not in cache.static:
            cache.static[workload] = describe_network(config)
    runtime = _runtime_share(config, cache)
    static = cache.static[workload]
    batch = config.distribution.step_batch(config)
    seconds = _step_seconds(config, batch, cache) if timed else float("nan")
    shares, phases, plan = _pipeline_facts(config, static["num_layers"], cache)
    in_place = _stages_in_place(config, plan, cache) if timed else None
    layers = [
        LayerFacts(
            weights_mb=layer["parameters"] * FLOAT32_BYTES / BYTES_PER_MB,
            activation_mb_per_sample=layer["activation_mb"],
            compute_share=share,
            forward_share=forward,
            backward_share=backward,
            update_share=update,
        )
        for layer, share, (forward, backward, update) in zip(static["layers"], shares, phases)
    ]
    saved = _saved_activations(config, cache)
    if saved is not None:
        layers = [replace(layer, saved=kept) for layer, kept in zip(layers, saved.layers)]
    input_mb = math.prod(spec.input_shape) * spec.input_dtype.itemsize / BYTES_PER_MB
    return CellFacts(
        weights_mb=static["weights_mb"],
        gradient_mb=static["gradient_mb"],
        gradient_tensors=static["gradient_tensors"],
        input_mb_per_sample=input_mb,
        layers=layers,
        step_seconds=seconds,
        step_batch=batch,
        plan=plan,
        stages_in_place=in_place,
        probe_seconds=time.perf_counter() - started,
        runtime_mb=runtime.mb,
        context_mb=runtime.context_mb,
    )


# ---------------------------------------------------------------------------------------------
# Where measuring happens: the device, the machine, the facts file.


def device_present(config: DistbenchConfig) -> bool:
    """Whether this machine has the hardware's kind of device (every machine has a CPU)."""
    if config.hardware.device.value != "cuda":
        return True
    from harness.cli.preflight import torch_sees_cuda  # only a CUDA hardware asks it

    return torch_sees_cuda()


def prober_here(config: DistbenchConfig, cache: FactsCache) -> Measurements | None:
    """What times steps and stages on the hardware's device here: the cache's measurements
    where its policy allows a probe and this machine has the device; None otherwise."""
    measure = cache.measurements
    if measure is None or not cache.policy.probe or not device_present(config):
        return None
    return measure


def probes_here(config: DistbenchConfig, cache: FactsCache) -> bool:
    """Whether steps are timed here (`prober_here`)."""
    return prober_here(config, cache) is not None


def device_name(config: DistbenchConfig) -> str:
    """The machine a probe here runs on (`torch.cuda.get_device_name`, else the CPU model and
    the instruction set torch's kernels use: `harness.runtime.environment.machine_name`)."""
    from harness.runtime.environment import machine_name

    return machine_name(config.hardware.device.value)


def _kept(config: DistbenchConfig, cache: FactsCache) -> FactsStore:
    """The hardware's facts file as it is now (empty where there is none)."""
    return FactsStore.load(cache.policy.facts_file(config), config.hardware.name)


def _keep(
    config: DistbenchConfig, cache: FactsCache, update: Callable[[FactsStore], object]
) -> Path | None:
    """Add a measurement to the hardware's facts file (`harness.predict.facts.store.keep`)."""
    return keep(cache.policy.facts_file(config), config.hardware.name, update)


# ---------------------------------------------------------------------------------------------
# The sequential step time.


def _step_seconds(config: DistbenchConfig, batch: int, cache: FactsCache) -> float:
    """The step time at `batch`, found once per `step_key` (`_choose_step`)."""
    key = step_key(config, batch, cache)
    if key not in cache.step_seconds:
        found = _choose_step(config, batch, cache)
        cache.step_seconds[key] = found.seconds
        cache.sources[key] = found
    return cache.step_seconds[key]


def _choose_step(config: DistbenchConfig, batch: int, cache: FactsCache) -> StepTime:
    """The step time at `batch` by the policy's order of sources (module docstring)."""
    if cache.policy.steps_from_cells:
        in_cells = _step_from_cells(config, batch, cache)
        if in_cells is not None:
            return in_cells
    prober = prober_here(config, cache)
    if prober is None:
        return recorded_step_time(config, batch, cache)
    reused = cache.policy.reuse and batch not in cache.policy.remeasure_batches
    kept = _kept_step(config, batch, cache) if reused else None
    return kept or _probe_step(config, batch, cache, prober)


def _step_from_cells(config: DistbenchConfig, batch: int, cache: FactsCache) -> StepTime | None:
    """The step time at `batch` the grid's one-worker cells measured (their median, with their
    reference kernel), None where none ran at that batch."""
    measured, _ = _recorded(config, cache)
    exact = [step for step in measured if step.reference_in_cells and step.batch == batch]
    return min(exact, key=lambda step: step.rank).at(batch) if exact else None


def _kept_step(config: DistbenchConfig, batch: int, cache: FactsCache) -> StepTime | None:
    """The step time at `batch` the facts file holds for this machine's device, measured by a
    probe asked for at least the policy's `probe_batches`; None if it holds none."""
    kept = _kept(config, cache).steps(
        config.network.key,
        config.dataset.key,
        config.hardware.device.value,
        worker_threads(config),
        device_name=device_name(config),
    )
    asked = cache.policy.probe_batches
    found = [
        step
        for step in kept
        if step.batch == batch and max(step.probe_batches or 0, step.probe_asked or 0) >= asked
    ]
    return choose_step_time(found, batch) if found else None


def _probe_step(
    config: DistbenchConfig, batch: int, cache: FactsCache, prober: Measurements
) -> StepTime:
    """Time the step on this machine's device and keep it in the facts file; what is used is
    then read back from the file, as a later run reads it."""
    timing = prober.step_time(
        config,
        batch,
        threads=worker_threads(config),
        probe_batches=cache.policy.probe_batches,
        spread=cache.policy.probe_spread,
    )
    name = device_name(config)
    low, high = quartiles(timing.seconds or (timing.median_s,))
    cache.measured.append(f"the step time at batch {batch}")
    record = _step_record(config, cache, batch, timing, name=name, low=low, high=high)
    kept = _keep(config, cache, record)
    if kept is not None:
        read_back = _kept_step(config, batch, cache)
        if read_back is not None:
            return read_back
    return StepTime(
        batch,
        timing.median_s,
        f"{PROBED_HERE} (not kept)",
        batch,
        name,
        low=low,
        high=high,
        probe_batches=timing.batches,
        reference_ms=timing.reference_ms,
    )


def _step_record(
    config: DistbenchConfig,
    cache: FactsCache,
    batch: int,
    timing: BatchTiming,
    *,
    name: str,
    low: float,
    high: float,
) -> Callable[[FactsStore], None]:
    """What keeps a probe's `timing` at `batch` in the facts file: on the machine `name`, with
    its quartiles `low` and `high`."""
    return lambda store: store.record_step(
        network=config.network.key,
        dataset=config.dataset.key,
        device=config.hardware.device.value,
        threads=worker_threads(config),
        device_name=name,
        batch=batch,
        seconds=timing.median_s,
        std_seconds=timing.std_s,
        probe_batches=timing.batches,
        probe_asked=cache.policy.probe_batches,
        q1_seconds=low,
        q3_seconds=high,
        batch_seconds=list(timing.seconds),
        reference_ms=timing.reference_ms,
        speed_change=timing.unsteady_drift,
    )


def keep_contradicting(
    config: DistbenchConfig, cache: FactsCache, pairs: Sequence[tuple[StepKey, StepKey]]
) -> None:
    """Have each step time of `pairs` (`contradicting_steps`, left so after both were timed
    again) say which one it contradicts: where it is used (`cache.sources`) and beside it in
    the facts file, so that a later run says so too without timing them again."""
    for smaller, larger in pairs:
        for key, other in ((smaller, larger), (larger, smaller)):
            network, dataset, device, threads, batch, _ = key
            other_batch = cache.sources[other].batch
            cache.sources[key] = replace(cache.sources[key], contradicts=other_batch)
            note = functools.partial(
                FactsStore.note_contradiction,
                network=network,
                dataset=dataset,
                device=device,
                threads=threads,
                device_name=device_name(config),
                batch=batch,
                other=other_batch,
            )
            if note(_kept(config, cache)):  # not noted yet: a file unchanged stays so
                _keep(config, cache, note)


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """The first and third quartiles of `values` (each the value itself for one value)."""
    if len(values) < 2:
        return values[0], values[0]
    first, _, third = statistics.quantiles(values, n=4, method="inclusive")
    return first, third


def recorded_step_time(config: DistbenchConfig, batch: int, cache: FactsCache) -> StepTime:
    """The step time at `batch` from the facts file and MLflow's sequential cells (not timed
    here); MissingMeasurement if neither holds any for the workload on the device."""
    measured, looked = _recorded(config, cache)
    found = choose_step_time(measured, batch)
    if found is None:
        raise MissingMeasurement(_missing_message(config, batch, looked))
    return found


def _recorded(config: DistbenchConfig, cache: FactsCache) -> tuple[list[MeasuredStep], list[str]]:
    """The step times the facts file and MLflow's sequential cells hold for `config`'s
    workload on its device (read once per cache), and where they were looked for."""
    workload = (
        config.network.key,
        config.dataset.key,
        config.hardware.device.value,
        worker_threads(config),
    )
    if workload not in cache.recorded:
        path = cache.policy.facts_file(config)
        in_file = FactsStore.load(path, config.hardware.name).steps(*workload)
        in_mlflow, mlflow_looked = sequential_steps(config, uri=cache.policy.tracking_uri)
        cache.recorded[workload] = ([*in_file, *in_mlflow], [str(path), mlflow_looked])
    return cache.recorded[workload]


def _missing_message(config: DistbenchConfig, batch: int, looked: Sequence[str]) -> str:
    """What to run where, for a step time measured nowhere that was looked (`looked`)."""
    hardware, network, dataset = (
        config.hardware.name,
        config.network.label,
        config.dataset.name.value,
    )
    device = config.hardware.device.value
    threads = worker_threads(config)
    on = f"{device} ({threads} threads)" if threads is not None else device
    missing = (
        f"hardware={hardware}: no sequential step time measured on {on} for "
        f"{network}/{dataset} at batch {batch} (looked in {' and '.join(looked)})"
    )
    refused = _one_worker_refused(config, batch)
    if refused is not None:
        # The command below would be refused before it starts: say why, and the only source
        # left (`predict.recorded` takes another hardware's cells of the same device).
        return (
            f"{missing}; and no sequential cell can measure it on hardware={hardware}: "
            f"{refused}; such a step time can come only from a sequential cell on hardware "
            f"with more memory per {device} device, recorded in the MLflow store tracking.uri "
            f"names (another hardware's cells of the same device are used where this one has "
            f"none)"
        )
    return (
        f"{missing}; on a "
        f"machine with that device run `python -m harness network={network} "
        f"dataset={dataset} distribution=sequential hardware={hardware} "
        f"distribution.batch_size={batch} dataset.num_samples={batch * 100} run.epochs=1` "
        f"(or this `python -m harness.recommend` command there), then run this again with "
        f"its outputs (copy its run.output_dir's facts/ here, or set tracking.uri to its "
        f"MLflow store)"
    )


def _one_worker_refused(config: DistbenchConfig, batch: int) -> str | None:
    """Why a sequential cell of `config`'s network at `batch` on its hardware would be refused
    before it starts: its weights cannot fit one worker (`check_weights_fit`); None where they
    can, or that is not known."""
    try:
        shortfall = one_worker_cell(config, batch).weights_shortfall()
    except ConfigError:  # the network itself is refused: said where it is checked
        return None
    if shortfall is None:
        return None
    _, need, memory = shortfall
    return (
        f"its weights, gradients and optimizer state alone need {gigabytes(need)} on one "
        f"worker, more than {memory.named}"
    )


# ---------------------------------------------------------------------------------------------
# Each layer's share of the compute, a pipeline's stage plan and its stages timed in place.


def needs_layer_profile(config: DistbenchConfig) -> bool:
    """Whether predicting the cell takes a profile of its network's layers: a pipeline's
    stages are planned from it, a model that splits layers otherwise weighs them by it
    (`DistributionSpec.profiles_layers`), and collectives that can run beside the compute hide
    behind the layers computing while their gradients move (`predict.overlap`)."""
    spec = spec_of(config)
    return (
        spec.stage_planner is not None
        or spec.profiles_layers(config)
        or (config.world_size > 1 and allreduces_overlap_backward(config))
    )


def _pipeline_facts(
    config: DistbenchConfig, num_layers: int, cache: FactsCache
) -> tuple[list[float], list[PhaseShares], StagePlan | None]:
    """Each layer's share of the compute, the same by phase, and the stage plan a pipeline cell
    trains, or trained (its recorded balance). Uniform for a model that never splits the
    network and whose collectives cannot hide behind its compute; where they can, how far
    depends on which layers compute while which gradients move (`predict.overlap`), so the
    layers are profiled as for a pipeline."""
    planner = spec_of(config).stage_planner
    if not needs_layer_profile(config):
        uniform = 1 / num_layers
        return [uniform] * num_layers, [(uniform / 3, 2 * uniform / 3, 0.0)] * num_layers, None
    # Each layer's share of the compute moves with the batch size (ResNet-50 on one core: its
    # first 9 layers take 35 % of a step at batch 8 and 50 % at batch 32), so the profile is
    # taken at the batch the cell's workers step on.
    key = ProfileKey(
        config.network.key,
        config.dataset.key,
        config.hardware.device.value,
        worker_threads(config),
        config.distribution.step_batch(config),
    )
    if key not in cache.profiles:
        cache.profiles[key] = _layer_profile(config, key, cache)
    profile = cache.profiles[key]
    step_ms = sum(profile.compute_ms(1.0))  # one step: every layer's forward, backward, update
    phases = [
        (layer.forward_ms / step_ms, layer.backward_ms / step_ms, layer.update_ms / step_ms)
        for layer in profile.layers
    ]
    if planner is None:
        return [sum(phase) for phase in phases], phases, None
    costs = profile.compute_ms(planner.updates_per_pass(config))
    return (
        [cost / sum(costs) for cost in costs],
        phases,
        planner.plan(config, num_layers, profile),
    )


def describe_network(config: DistbenchConfig) -> dict[str, Any]:
    """`harness.describe`'s facts of the cell's network (traced on the meta device)."""
    from harness.measure.network_facts import describe

    return describe(config.network.ref, config.dataset.spec)


def parameter_profile(static: dict[str, Any], batch: int, device: str) -> NetworkProfile:
    """A layer profile whose compute is proportional to each layer's parameters (a transformer
    block's forward and backward are about 2 and 4 FLOPs per parameter and token), with a
    floor for layers without any: what balances stages, and sizes their memory, where the
    network cannot be profiled here. Times are relative (1 ms per million parameters)."""
    from harness.measure.network_facts import FLOAT32_BYTES

    layers = [
        LayerProfile(
            index=fact["index"],
            type=fact["type"],
            forward_ms=max(fact["parameters"], 1) / 1e6,
            backward_ms=2 * max(fact["parameters"], 1) / 1e6,
            update_ms=0.0,
            activation_mb=fact["activation_mb"] * batch,
            parameter_mb=fact["parameters"] * FLOAT32_BYTES / BYTES_PER_MB,
        )
        for fact in static["layers"]
    ]
    return NetworkProfile(batch_size=batch, device=device, layers=layers)


def _layer_profile(config: DistbenchConfig, key: ProfileKey, cache: FactsCache) -> NetworkProfile:
    """The network's per-layer profile: the facts file's where the device is not probed here
    (or where the policy reuses kept facts); else profiled on this machine's CPU (as
    `harness.plan` does, so a machine without the device can take it too), else estimated
    (`_why_estimated`)."""
    here = probes_here(config, cache)
    stored = _kept_profile(config, key, cache, here) if not here or cache.policy.reuse else None
    if here and stored is not None and stored.batch_size != key.batch:
        stored = None  # the device is here: profile at the cell's own batch
    if stored is not None:  # where the device is not here, at the nearest batch kept
        cache.profile_sources[key] = f"facts file {cache.policy.facts_file(config)}"
        return stored
    static = cache.static.get((key.network, key.dataset)) or describe_network(config)
    cache.static[(key.network, key.dataset)] = static
    why = _why_estimated(config, static, cache)
    if why is not None or cache.measurements is None:
        cache.profile_sources[key] = (
            f"estimated from each layer's parameters ({why or 'nothing is measured here'}); "
            f"on the device, `python -m harness.plan` with this cell's overrides profiles them"
        )
        return parameter_profile(static, key.batch, key.device)
    profile = cache.measurements.layer_profile(
        config, threads=key.threads, spread=cache.policy.probe_spread
    )
    cache.measured.append(f"the layer profile of {key.network}")
    return _profiled_here(config, key, cache, profile, here)


def _kept_profile(
    config: DistbenchConfig, key: ProfileKey, cache: FactsCache, here: bool
) -> NetworkProfile | None:
    """The facts file's layer profile for `key` (for this machine's device where it is probed
    here, else any device of the kind), at the batch, else the nearest batch kept."""
    return _kept(config, cache).profile(
        key.network,
        key.dataset,
        key.device,
        key.threads,
        device_name=device_name(config) if here else None,
        batch=key.batch,
    )


def _why_estimated(
    config: DistbenchConfig, static: dict[str, Any], cache: FactsCache
) -> str | None:
    """Why the layers are not profiled here but estimated from their parameters: a network too
    large to build on this CPU (it would take minutes), or no step time to rank the options by
    (no time is predicted: the plan only sizes the stages' memory); None: profile them."""
    if static["weights_mb"] * BYTES_PER_MB > CPU_PROFILE_LIMIT_BYTES:
        return (
            f"{config.network.key}'s weights ({static['weights_mb'] / 1024:.0f} GB) are too "
            f"large to profile on this CPU"
        )
    if cache.missing_step_time is not None:
        return "no step time to rank by on the device"
    return None


def _profiled_here(
    config: DistbenchConfig,
    key: ProfileKey,
    cache: FactsCache,
    profile: NetworkProfile,
    here: bool,
) -> NetworkProfile:
    """A profile taken on this CPU: kept in the facts file where the device is probed here and
    read back from it (as a later run will read it); used as it is otherwise."""
    if not here:
        cache.profile_sources[key] = (
            "profiled here on CPU (the facts file holds no layer "
            "profile; it is taken on CPU anyway)"
        )
        return profile
    name = device_name(config)
    kept = _keep(
        config,
        cache,
        lambda store: store.record_profile(
            network=key.network,
            dataset=key.dataset,
            device=key.device,
            threads=key.threads,
            device_name=name,
            profile=profile,
        ),
    )
    read_back = _kept_profile(config, key, cache, here) if kept is not None else None
    if read_back is not None:
        cache.profile_sources[key] = f"facts file {cache.policy.facts_file(config)}"
        return read_back
    cache.profile_sources[key] = "profiled here on CPU (not kept)"
    return profile


def _stages_in_place(
    config: DistbenchConfig, plan: StagePlan | None, cache: FactsCache
) -> InPlaceStages | None:
    """The plan's stages timed in place: kept in the facts file, else timed here where the
    policy asks for it (`FactsPolicy.time_in_place`) and the device is probed here; None
    otherwise, or for a model whose planner does not ask for it."""
    planner = spec_of(config).stage_planner
    if plan is None or planner is None or not planner.timed_in_place:
        return None
    key = in_place_key(config, plan)
    if key not in cache.in_place:
        # any device of the kind (in the key), as a layer profile: a timing kept on another
        # machine's CPU is read (its entry names the device it was timed on)
        kept = _kept(config, cache).in_place(key)
        if kept is None and cache.policy.time_in_place:
            prober = prober_here(config, cache)
            kept = None if prober is None else _time_in_place(config, plan, key, cache, prober)
        cache.in_place[key] = kept
    return cache.in_place[key]


def _time_in_place(
    config: DistbenchConfig,
    plan: StagePlan,
    key: tuple[Any, ...],
    cache: FactsCache,
    prober: Measurements,
) -> InPlaceStages | None:
    """The plan's stages timed in place here and kept; None where the timing failed (one line
    on stderr: the layers' shares stand in, as without a timing)."""
    try:
        timed = prober.stages_in_place(config, plan)
    except RuntimeError as err:
        print(
            f"distbench: {err}; its prediction uses the layers' shares", file=sys.stderr, flush=True
        )
        return None
    cache.measured.append(f"{config.network.key}'s {len(plan.stages)} stages in place")
    name = device_name(config)
    _keep(config, cache, lambda store: store.record_in_place(key, timed, device_name=name))
    return timed


# ---------------------------------------------------------------------------------------------
# Memory facts: what autograd saves per layer, a worker's runtime share.


def _saved_activations(config: DistbenchConfig, cache: FactsCache) -> SavedActivations | None:
    """What autograd saves per layer of the cell's network, once per (network, dataset):
    measured on this machine's CPU, or the facts file's where the policy reuses kept facts or
    nothing measures (None where none is kept then); None with `measure_memory=False`."""
    if not cache.policy.measure_memory:
        return None
    key = (config.network.key, config.dataset.key)
    if key not in cache.saved_activations:
        measure = cache.measurements
        kept = _kept(config, cache).saved(*key) if cache.policy.reuse or measure is None else None
        if kept is None and measure is not None:
            kept = measure.saved_activations(config)
            cache.measured.append(f"the saved activations of {key[0]}")
            if probes_here(config, cache):  # a machine without the device keeps nothing
                measured = kept
                _keep(config, cache, lambda store: store.record_saved(*key, measured))
        cache.saved_activations[key] = kept
    return cache.saved_activations[key]


def _runtime_share(config: DistbenchConfig, cache: FactsCache) -> RuntimeShare:
    """The runtime share of `config`'s worker, measured once per `runtime_key` in a fresh
    process and kept in the facts file (a fresh process's resident set varies by a few MB from
    run to run); none with `measure_memory=False`, and, without the device or without
    measurements, the facts file's (any device of the kind), else none."""
    if not cache.policy.measure_memory:
        return RuntimeShare(0.0)
    with _runtime_measured_meanwhile(config, cache):
        pass
    return cache.runtime[runtime_key(config)]


@contextlib.contextmanager
def _runtime_measured_meanwhile(config: DistbenchConfig, cache: FactsCache) -> Iterator[None]:
    """On leaving, `cache.runtime` holds the runtime share of `config`'s worker (`_runtime_share`):
    kept, or measured by a probe that ran while the block did (it measures memory, not time: a
    block that times nothing); the probe is ended if the block fails."""
    key = runtime_key(config)
    if not cache.policy.measure_memory or key in cache.runtime:
        yield
        return
    measure = _memory_measured_here(config, cache)
    kept = _kept_runtime(config, key, cache, here=measure is not None)
    if measure is None or kept is not None:
        cache.runtime[key] = kept or RuntimeShare(0.0)
        yield
        return
    probe = measure.runtime_memory(config)
    try:
        yield
    except BaseException:
        probe.stop()
        raise
    measured = probe.read()
    cache.measured.append("a worker's runtime memory")
    name = device_name(config)
    _keep(config, cache, lambda store: store.record_runtime(key, measured, device_name=name))
    cache.runtime[key] = measured


def _memory_measured_here(config: DistbenchConfig, cache: FactsCache) -> Measurements | None:
    """What measures a worker's memory here: the cache's measurements where this machine has
    the device (whether or not steps are timed: memory is not a timing); None otherwise."""
    measure = cache.measurements
    return measure if measure is not None and device_present(config) else None


def _kept_runtime(
    config: DistbenchConfig, key: tuple[Any, ...], cache: FactsCache, *, here: bool
) -> RuntimeShare | None:
    """The runtime share kept for `key` where one is to be used: for this machine's device
    where the policy reuses kept facts, any device's where it is not measured `here`; None:
    none is kept (it is to be measured here, or none is used)."""
    if here and not cache.policy.reuse:
        return None
    return _kept(config, cache).runtime(key, device_name=device_name(config) if here else None)
