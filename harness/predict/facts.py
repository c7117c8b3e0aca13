"""What the performance models need to know about a cell's workload, gathered once.

Three kinds of facts:
- static ones, free: parameter and activation sizes per layer (`harness.describe`, traced on
  the meta device);
- measured ones, on one device of the target kind: the sequential step time at the batch a
  model trains at (the thesis' statistical model, `predict.sequential`), and for pipelines each
  layer's share of the compute (the profiler) and the stage plan;
- measured ones for the memory model, on this machine's CPU: what autograd saves per layer
  (`predict.activations`, once per network and dataset, seconds) and a worker process's
  runtime share (`predict.runtime`, once per dataset, a fresh process).

`FactsCache` keeps measurements by what determines them (network, dataset, batch, threads),
so an analysis of a grid or a recommendation over many candidates measures each one once.

Whatever is measured is also kept on disk, per hardware configuration, in
`<run.output_dir>/facts/<hardware>.json` (`FactsStore`): step times with their spread over the
probe's batches, layer profiles, runtime shares (with the device each was measured on) and
saved activations. With `FactsCache.reuse` (the recommender's default), what that file holds
for this machine's device is used instead of measuring again, so that the same question gets
the same answer; what was measured is read back from the file, so a first run and a later one
use the same numbers. Where the hardware's device is not on this machine (`hardware.device=cuda`
on a login node without CUDA), or with `probe=False`, nothing is timed: the step times come
from that file and from the sequential cells recorded in MLflow (`harness.predict.recorded`),
by the rule of `choose_step_time`; with neither, a `MissingMeasurement` says what to run where.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.config.accepts import finite_number
from harness.config.schema import ConfigError, DistbenchConfig
from harness.config.units import BYTES_PER_MB
from harness.costs.partition import StagePlan
from harness.costs.terms import CellFacts, LayerFacts, allreduces_overlap_backward
from harness.distributions.registry import baseline, settings, spec_of
from harness.measure.timing_rule import STEADY_SPREAD
from harness.predict.recorded import sequential_steps
from harness.profiles.stages import InPlaceStages
from harness.profiles.steps import MeasuredStep, StepTime, choose_step_time

# Untimed steps at most: a fresh process runs its first steps slower (allocator, kernel caches);
# warming up ends earlier once it has taken a second (`harness.measure.timing_rule`).
_PROBE_WARMUP = 4


@dataclass
class FactsCache:
    """Measurements shared between the cells of one analysis or recommendation."""

    probe_batches: int = 5  # timed, at most
    # Fewer once the timed batches' interquartile range is within this share of their median
    # (`harness.measure.timing_rule.ProbeLength`; 0: always `probe_batches`).
    probe_spread: float = STEADY_SPREAD
    step_seconds: dict[tuple[Any, ...], float] = field(default_factory=dict)
    profiles: dict[tuple[Any, ...], Any] = field(default_factory=dict)  # NetworkProfile
    static: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # describe()
    # False: never time a step here, take step times from earlier measurements (facts file,
    # MLflow) even where this machine has the device; absent devices are never probed.
    probe: bool = True
    facts_root: Path | None = None  # where facts/<hardware>.json is; None: run.output_dir
    # The MLflow store whose sequential cells give step times; None: each config's own
    # (`tracking.uri`, else run.output_dir's). An analysis names the store it reads: its cells'
    # recorded configs name the store they were measured into, which may have moved since.
    tracking_uri: str | None = None
    sources: dict[tuple[Any, ...], StepTime] = field(default_factory=dict)  # per step key
    profile_sources: dict[tuple[Any, ...], str] = field(default_factory=dict)
    recorded: dict[tuple[Any, ...], tuple[list[MeasuredStep], list[str]]] = field(
        default_factory=dict
    )  # (network, dataset, device, threads) -> measured, where looked
    # Memory facts: saved activations per (network, dataset) (`predict.activations`), the
    # runtime share per `predict.runtime.probe_key`; `measure_memory=False` measures neither
    # (the memory model then falls back to layer outputs and no runtime share).
    measure_memory: bool = True
    saved_activations: dict[tuple[str, str], Any] = field(default_factory=dict)
    runtime: dict[tuple[Any, ...], RuntimeShare] = field(default_factory=dict)
    # Why no step time could be had (MissingMeasurement's message: what to measure, where),
    # once a recommendation fell back to memory only; None while times are known.
    missing_step_time: str | None = None
    # True: a step time, layer profile or runtime share the facts file holds for this
    # machine's device is used as it is (the recommender, unless `--remeasure`); False: what
    # is needed is measured here again (and replaces the file's). Step times from another
    # device never count: this one's may differ.
    reuse: bool = False
    measured: list[str] = field(default_factory=list)  # what was measured here, for the user
    # True: a pipeline whose planner asks for it (`StagePlanner.timed_in_place`) has its stages
    # timed in place where the facts file holds none (`python -m harness.stage_timing`, seconds
    # a plan: the analysis); False: only kept timings are used (the recommender, whose many
    # candidate plans would each take a short training run).
    time_in_place: bool = False
    in_place: dict[tuple[Any, ...], InPlaceStages | None] = field(default_factory=dict)
    # True: a step time at a batch the grid's own one-worker cells ran at comes from those
    # cells (MLflow), before the facts file and the probe: a network's step measured minutes
    # from its other cells, as long as they ran, rather than a probe's few batches at another
    # time (`harness.analysis` judges the models that way too, beside the probe's judgement).
    steps_from_cells: bool = False


def command_parser(
    prog: str, description: str | None, *, probe_spread: float = STEADY_SPREAD
) -> argparse.ArgumentParser:
    """The options of the commands that measure facts (analysis, recommend); the rest of
    their arguments are config overrides (`parse_known_args`). `probe_spread`: the default of
    `--probe-spread`, the spread of the probe's timed batches at which it stops early."""
    from harness.cli.arguments import ArgumentParser  # a wrong flag: one line, exit status 2

    parser = ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--probe-batches",
        type=int,
        default=5,
        help="timed batches of the sequential probe per batch size, at most (default 5)",
    )
    parser.add_argument(
        "--probe-spread",
        type=float,
        default=probe_spread,
        help="stop timing after 3 batches once their interquartile range is "
        f"within this share of their median (default {probe_spread}; 0: "
        "always --probe-batches)",
    )
    parser.add_argument(
        "--no-probe",
        action="store_true",
        help="time no step here: use step times measured earlier on the "
        "hardware's device (<run.output_dir>/facts/<hardware>.json, "
        "MLflow), as always where this machine lacks that device; a "
        "layer profile the facts file lacks is still taken on this CPU "
        "(each layer's share of a step, said when it runs)",
    )
    return parser


def cache_for(
    probe_batches: int,
    *,
    probe: bool = True,
    facts_root: Path | None = None,
    reuse: bool = False,
    tracking_uri: str | None = None,
    probe_spread: float = STEADY_SPREAD,
) -> FactsCache:
    """A fresh cache for `--probe-batches` and `--probe-spread`, checked like config keys."""
    if probe_batches < 1:
        raise ConfigError(f"--probe-batches={probe_batches} is invalid: must be 1 or more")
    if not 0 <= probe_spread < 1:  # also refuses NaN
        raise ConfigError(
            f"--probe-spread={probe_spread} is invalid: allowed 0 (time every "
            f"batch of --probe-batches) up to, not including, 1"
        )
    return FactsCache(
        probe_batches=probe_batches,
        probe=probe,
        facts_root=facts_root,
        reuse=reuse,
        tracking_uri=tracking_uri,
        probe_spread=probe_spread,
    )


def gather(config: DistbenchConfig, cache: FactsCache, *, timed: bool = True) -> CellFacts:
    """Facts for `config`, measuring on this machine what `cache` does not hold yet.
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
    saved = _saved_activations(config, spec, cache)
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


def _threads(config: DistbenchConfig) -> int | None:
    return config.hardware.cpu_threads if config.hardware.device.value == "cpu" else None


def _step_key(config: DistbenchConfig, batch: int, cache: FactsCache) -> tuple[Any, ...]:
    return (
        config.network.key,
        config.dataset.key,
        config.hardware.device.value,
        _threads(config),
        batch,
        cache.probe_batches,
    )


def _step_seconds(config: DistbenchConfig, batch: int, cache: FactsCache) -> float:
    key = _step_key(config, batch, cache)
    if key not in cache.step_seconds:
        in_cells = _step_from_cells(config, batch, cache) if cache.steps_from_cells else None
        if in_cells is not None:
            found = in_cells
        elif probes_here(config, cache):
            found = (_kept_step(config, batch, cache) if cache.reuse else None) or _probe_step(
                config, batch, cache
            )
        else:
            found = recorded_step_time(config, batch, cache)
        cache.step_seconds[key] = found.seconds
        cache.sources[key] = found
    return cache.step_seconds[key]


def _step_from_cells(config: DistbenchConfig, batch: int, cache: FactsCache) -> StepTime | None:
    """The step time at `batch` the grid's one-worker cells measured (their median, with their
    reference kernel), None where none ran at that batch."""
    measured, _ = _recorded(config, cache)
    exact = [step for step in measured if step.reference_in_cells and step.batch == batch]
    return min(exact, key=lambda step: step.rank).at(batch) if exact else None


def step_times_used(cache: FactsCache) -> list[tuple[str, StepTime]]:
    """Every step time the cache handed out, with the workload it is of ("resnet50/cifar10
    on cpu, 1 thread(s)"), by workload and batch."""
    used = []
    for (network, dataset, device, threads, _, _), step in cache.sources.items():
        on = f"{network}/{dataset} on {device}" + (f", {threads} thread(s)" if threads else "")
        used.append((on, step))
    return sorted(used, key=lambda item: (item[0], item[1].batch))


def speed_ratio(step: StepTime | None, reference_ms: float | None) -> float:
    """How much slower the machine ran a cell than when `step` was measured: the cell's
    reference kernel (`harness.measure.steadiness`) over the one timed around the step time;
    NaN where either was not recorded."""
    if step is None or not step.reference_ms or not reference_ms:
        return float("nan")
    return reference_ms / step.reference_ms


def at_machine_speed(
    facts: CellFacts, step: StepTime | None, reference_ms: float | None
) -> tuple[CellFacts, float]:
    """`facts` with the step time moved to the machine speed a measured cell ran at, and the
    factor (1: left as measured). The factor is `speed_ratio`, where the step time's kernel was
    timed in the sequential cells it comes from: a shared host drifts by tens of percent over
    an hour (here a block of ResNet-50 cells ran with the kernel at 15.4-18.0 ms where the
    cells before it read 13.3-16.9, and its sequential cells' steps were 22-29 % slower than a
    probe's at 13.8 ms).

    A step time probed by the analysing process is left as measured, its kernel only reported
    (`harness.analysis.speed_lines`): one probe's kernel moved 13.1-14.4 ms between probes
    seconds apart whose step times held still, and scaling by it raised PipeDream's held-out
    error from 3.8 to 5.9 % (BENCHMARKS.md section 15)."""
    if facts.stages_in_place is not None:  # timed by workers, as the cells time the kernel
        facts = replace(facts, stages_in_place=facts.stages_in_place.at_speed(reference_ms))
    ratio = speed_ratio(step, reference_ms)
    if step is None or not step.reference_in_cells or not math.isfinite(ratio):
        return facts, 1.0
    return replace(facts, step_seconds=facts.step_seconds * ratio), ratio


def step_time_source(config: DistbenchConfig, cache: FactsCache) -> StepTime | None:
    """Where the step time of `config`'s prediction came from (after `gather`)."""
    return cache.sources.get(_step_key(config, config.distribution.step_batch(config), cache))


def _kept_step(config: DistbenchConfig, batch: int, cache: FactsCache) -> StepTime | None:
    """The step time at `batch` the facts file holds for this machine's device, measured by a
    probe asked for at least `cache.probe_batches` batches; None if it holds none."""
    path = facts_path(_facts_root(config, cache), config.hardware.name)
    kept = FactsStore.load(path, config.hardware.name).steps(
        config.network.key,
        config.dataset.key,
        config.hardware.device.value,
        _threads(config),
        device_name=_device_name(config),
    )
    found = [
        step
        for step in kept
        if step.batch == batch
        and max(step.probe_batches or 0, step.probe_asked or 0) >= cache.probe_batches
    ]
    return choose_step_time(found, batch) if found else None


def _probe_step(config: DistbenchConfig, batch: int, cache: FactsCache) -> StepTime:
    """Time the step on this machine's device and keep it in the facts file; what is used is
    then read back from the file, as a later run reads it."""
    from harness.measure.steadiness import reference_seconds
    from harness.worker.step_time import measure_batch_seconds

    one_worker = settings(baseline().name, batch_size=batch, backend=config.distribution.backend)
    with _torch_threads(_threads(config)):
        # the machine's speed around the probe, timed as a cell times it around its epochs
        before = reference_seconds(config.hardware.device.value)
        timing = measure_batch_seconds(
            replace(config, distribution=one_worker),
            batch_size=batch,
            probe_batches=cache.probe_batches,
            warmup_batches=_PROBE_WARMUP,
            steady_spread=cache.probe_spread,
        )
        reference_ms = 1e3 * (before + reference_seconds(config.hardware.device.value)) / 2
    name = _device_name(config)
    low, high = quartiles(timing.seconds or (timing.median_s,))
    cache.measured.append(f"the step time at batch {batch}")
    kept = _keep(
        config,
        cache,
        lambda store: store.record_step(
            network=config.network.key,
            dataset=config.dataset.key,
            device=config.hardware.device.value,
            threads=_threads(config),
            device_name=name,
            batch=batch,
            seconds=timing.median_s,
            std_seconds=timing.std_s,
            probe_batches=timing.batches,
            probe_asked=cache.probe_batches,
            q1_seconds=low,
            q3_seconds=high,
            batch_seconds=list(timing.seconds),
            reference_ms=reference_ms,
        ),
    )
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
        reference_ms=reference_ms,
    )


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """The first and third quartiles of `values` (each the value itself for one value)."""
    if len(values) < 2:
        return values[0], values[0]
    first, _, third = statistics.quantiles(values, n=4, method="inclusive")
    return first, third


PhaseShares = tuple[float, float, float]  # a layer's forward, backward, update share


def needs_layer_profile(config: DistbenchConfig) -> bool:
    """Whether predicting the cell takes a profile of its network's layers: a pipeline's
    stages are planned from it, and collectives that can run beside the compute hide behind
    the layers computing while their gradients move (`predict.overlap`)."""
    return spec_of(config).stage_planner is not None or (
        config.world_size > 1 and allreduces_overlap_backward(config)
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
    key = (
        config.network.key,
        config.dataset.key,
        config.hardware.device.value,
        _threads(config),
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


def in_place_key(config: DistbenchConfig, plan: StagePlan) -> tuple[Any, ...]:
    """What a pipeline's stages timed in place depend on: the workload, the device and its
    threads, the batch, the distribution's settings and the plan's layers per stage."""
    settings = {
        key: value
        for key, value in sorted(asdict(config.distribution).items())
        if key not in ("balance", "backend")
    }
    return (
        config.network.key,
        config.dataset.key,
        config.hardware.device.value,
        _threads(config),
        json.dumps(settings, sort_keys=True, default=str),
        ",".join(str(stage.layers) for stage in plan.stages),
    )


def _stages_in_place(
    config: DistbenchConfig, plan: StagePlan | None, cache: FactsCache
) -> InPlaceStages | None:
    """The plan's stages timed in place: kept in the facts file, else timed here where the
    cache asks for it (`FactsCache.time_in_place`) and this machine has the device; None
    otherwise, or for a model whose planner does not ask for it."""
    planner = spec_of(config).stage_planner
    if plan is None or planner is None or not planner.timed_in_place:
        return None
    key = in_place_key(config, plan)
    if key not in cache.in_place:
        # any device of the kind (in the key), as a layer profile: a timing kept on another
        # machine's CPU is read (its entry names the device it was timed on)
        path = facts_path(_facts_root(config, cache), config.hardware.name)
        kept = FactsStore.load(path, config.hardware.name).in_place(key)
        if kept is None and cache.time_in_place and probes_here(config, cache):
            try:
                timed = _time_in_place(config, plan)
            except RuntimeError as err:  # the layers' shares stand in, as without a timing
                print(
                    f"distbench: {err}; its prediction uses the layers' shares",
                    file=sys.stderr,
                    flush=True,
                )
                cache.in_place[key] = None
                return None
            cache.measured.append(f"{config.network.key}'s {len(plan.stages)} stages in place")
            _keep(
                config,
                cache,
                lambda store: store.record_in_place(key, timed, device_name=_device_name(config)),
            )
            kept = timed
        cache.in_place[key] = kept
    return cache.in_place[key]


def _time_in_place(config: DistbenchConfig, plan: StagePlan) -> InPlaceStages:
    """`python -m harness.stage_timing` on the cell with `plan`'s balance, in a process of its
    own (it starts the stages' workers through the launchers, which prediction never imports)."""
    import subprocess
    import tempfile

    from omegaconf import OmegaConf

    from harness.distributions.pipeline_config import PipelineConfig

    assert isinstance(config.distribution, PipelineConfig), config.distribution
    pinned = replace(
        config,
        distribution=replace(config.distribution, balance=[stage.layers for stage in plan.stages]),
    )
    with tempfile.TemporaryDirectory(prefix="distbench-stages-") as scratch:
        cell, out = Path(scratch) / "cell.yaml", Path(scratch) / "stages.json"
        OmegaConf.save(OmegaConf.structured(pinned), cell)
        print(
            f"timing {config.network.key}'s {len(plan.stages)} {config.distribution.name} "
            f"stages in place (a short training run, each stage a process)...",
            file=sys.stderr,
            flush=True,
        )
        done = subprocess.run(
            [sys.executable, "-m", "harness.stage_timing", str(cell), str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 or not out.exists():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(
                f"timing the stages of {config.run_name} in place failed "
                f"(exit {done.returncode}: {last})"
            )
        return InPlaceStages.from_json(json.loads(out.read_text()))


def _saved_activations(config: DistbenchConfig, spec: Any, cache: FactsCache) -> Any:
    """What autograd saves per layer of the cell's network (`predict.activations`), measured
    once per (network, dataset) on this machine's CPU; None with `measure_memory=False`."""
    if not cache.measure_memory:
        return None
    from harness.measure import saved_activations

    key = (config.network.key, config.dataset.key)
    if key in cache.saved_activations:
        return cache.saved_activations[key]
    path = facts_path(_facts_root(config, cache), config.hardware.name)
    kept = FactsStore.load(path, config.hardware.name).saved(*key) if cache.reuse else None
    if kept is None:
        with _torch_threads(2):  # sizes, not times: the thread count only changes how long
            kept = saved_activations.measure(config.network.ref, spec, seed=config.run.seed)
        cache.measured.append(f"the saved activations of {key[0]}")
        if probes_here(config, cache):  # a machine without the device keeps nothing
            _keep(config, cache, lambda store: store.record_saved(*key, kept))
    cache.saved_activations[key] = kept
    return kept


@dataclass(frozen=True)
class RuntimeShare:
    """A worker process's memory besides the model (`predict.runtime`), and the part of it a
    cell's recorded peak leaves out: on CUDA the context (the driver's, cuBLAS's and cuDNN's
    memory outside torch's allocator, which `max_memory_allocated` does not see); 0 on a CPU,
    whose recorded peak is the process's resident set, and in a share kept before the
    context was kept apart."""

    mb: float
    context_mb: float = 0.0


def _runtime_share(config: DistbenchConfig, cache: FactsCache) -> RuntimeShare:
    """The runtime share of `config`'s worker, measured once per `probe_key` in a fresh
    process and kept in the facts file (a fresh process's resident set varies by a few MB from
    run to run); none with `measure_memory=False`, and without the device unless the facts
    file holds one measured there."""
    if not cache.measure_memory:
        return RuntimeShare(0.0)
    from harness.worker.runtime_memory import probe_key

    with _runtime_measured_meanwhile(config, cache):
        pass
    return cache.runtime[probe_key(config)]


@contextlib.contextmanager
def _runtime_measured_meanwhile(config: DistbenchConfig, cache: FactsCache) -> Iterator[None]:
    """On leaving, `cache.runtime` holds the runtime share of `config`'s worker (`_runtime_share`):
    kept, or measured by a probe that ran while the block did (it measures memory, not time: a
    block that times nothing); the probe is ended if the block fails."""
    from harness.worker.runtime_memory import RuntimeProbe, probe_key

    key = probe_key(config)
    if not cache.measure_memory or key in cache.runtime:
        yield
        return
    kept = _kept_runtime(config, key, cache)
    if kept is not None:
        cache.runtime[key] = kept
        yield
        return
    probe = RuntimeProbe(config)
    try:
        yield
    except BaseException:
        probe.stop()
        raise
    reading = probe.reading()
    measured = RuntimeShare(reading["runtime_mb"], reading.get("context_mb", 0.0))
    cache.measured.append("a worker's runtime memory")
    _keep(
        config,
        cache,
        lambda store: store.record_runtime(key, measured, device_name=_device_name(config)),
    )
    cache.runtime[key] = measured


def _kept_runtime(
    config: DistbenchConfig, key: tuple[Any, ...], cache: FactsCache
) -> RuntimeShare | None:
    """The runtime share kept for `key` where one is to be used (none where none is kept and
    the device is not here); None: it is to be measured here."""
    path = facts_path(_facts_root(config, cache), config.hardware.name)
    here = device_present(config)
    if cache.reuse or not here:
        kept = FactsStore.load(path, config.hardware.name).runtime(
            key, device_name=_device_name(config) if here else None
        )
        if kept is not None or not here:
            return kept or RuntimeShare(0.0)
    return None


class _torch_threads:  # noqa: N801 - used as a context manager, like torch's own
    """Run with torch limited to `threads` (the worker's), then restore the caller's."""

    def __init__(self, threads: int | None) -> None:
        import torch  # measuring: the commands' --help and bad input load no torch

        self.torch = torch
        self.threads = threads
        self.before = torch.get_num_threads()

    def __enter__(self) -> None:
        if self.threads is not None:
            self.torch.set_num_threads(self.threads)

    def __exit__(self, *_: object) -> None:
        self.torch.set_num_threads(self.before)


# A network whose float32 weights exceed this is not built on the CPU to profile its layers
# (Llama 3 8B would take 32 GB of this machine's 24): `parameter_profile` stands in.
CPU_PROFILE_LIMIT_BYTES = 4 * 1024**3


def describe_network(config: DistbenchConfig) -> dict[str, Any]:
    """`harness.describe`'s facts of the cell's network (traced on the meta device)."""
    from harness.measure.network_facts import describe

    return describe(config.network.ref, config.dataset.spec)


def parameter_profile(static: dict[str, Any], batch: int, device: str) -> Any:
    """A layer profile whose compute is proportional to each layer's parameters (a transformer
    block's forward and backward are about 2 and 4 FLOPs per parameter and token), with a
    floor for layers without any: what balances stages, and sizes their memory, where the
    network cannot be profiled here. Times are relative (1 ms per million parameters)."""
    from harness.measure.network_facts import FLOAT32_BYTES
    from harness.profiles.network import LayerProfile, NetworkProfile

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


def _layer_profile(config: DistbenchConfig, key: tuple[Any, ...], cache: FactsCache) -> Any:
    """The network's per-layer profile (a `NetworkProfile`): for a device that is not here the
    facts file's, if it holds one; else profiled here. The profile always runs on this
    machine's CPU (as `harness.plan` does), so a machine without the device can take it too."""
    from workloads.networks import build_network, to_layer_list

    network, dataset, device, threads, batch = key
    here = probes_here(config, cache)
    path = facts_path(_facts_root(config, cache), config.hardware.name)

    def kept() -> Any:  # the facts file's (for this machine's device where it is here)
        return FactsStore.load(path, config.hardware.name).profile(
            network,
            dataset,
            device,
            threads,
            device_name=_device_name(config) if here else None,
            batch=batch,
        )

    stored = kept() if not here or cache.reuse else None
    if here and stored is not None and stored.batch_size != batch:
        stored = None  # the device is here: profile at the cell's own batch
    if stored is not None:  # where the device is not here, at the nearest batch kept
        cache.profile_sources[key] = f"facts file {path}"
        return stored
    spec = config.dataset.spec
    static = cache.static.get((network, dataset)) or describe_network(config)
    cache.static[(network, dataset)] = static
    too_large = static["weights_mb"] * BYTES_PER_MB > CPU_PROFILE_LIMIT_BYTES
    if too_large or cache.missing_step_time is not None:
        # No time is predicted without a step time: the plan only sizes the stages' memory,
        # and profiling a large network here would take minutes for that.
        why = (
            f"{network}'s weights ({static['weights_mb'] / 1024:.0f} GB) are too large to "
            f"profile on this CPU"
            if too_large
            else "no step time to rank by on the device"
        )
        cache.profile_sources[key] = (
            f"estimated from each layer's parameters ({why}); on the device, "
            f"`python -m harness.plan` with this cell's overrides profiles them"
        )
        return parameter_profile(static, config.distribution.step_batch(config), device)
    import torch

    from harness.distributions.pipeline import profile_network

    torch.manual_seed(config.run.seed)
    layers = to_layer_list(config.network.ref, build_network(config.network.ref, spec))
    with _torch_threads(threads):
        profile = profile_network(config, layers, torch.device("cpu"), spread=cache.probe_spread)
    cache.measured.append(f"the layer profile of {network}")
    if not here:
        cache.profile_sources[key] = (
            "profiled here on CPU (the facts file holds no layer "
            "profile; it is taken on CPU anyway)"
        )
        return profile
    if (
        _keep(
            config,
            cache,
            lambda store: store.record_profile(
                network=network,
                dataset=dataset,
                device=device,
                threads=threads,
                device_name=_device_name(config),
                profile=profile,
            ),
        )
        is not None
    ):
        cache.profile_sources[key] = f"facts file {path}"
        return kept()  # as a later run will read it
    cache.profile_sources[key] = "profiled here on CPU (not kept)"
    return profile


# ---------------------------------------------------------------------------------------------
# Facts kept on disk, for recommending on a machine without the hardware's device.

FACTS_DIR = "facts"
_FACTS_FORMAT = 2  # 1 had no spread (q1/q3), no runtime shares: still read
PROBED_HERE = "probed here"


class MissingMeasurement(ConfigError):
    """No step time measured on the hardware's device for a workload (or a facts file that
    cannot be read), and no device here to measure it: bad input (exit status 2), with what to
    run where. No candidate of a recommendation can be predicted without it."""


# The lists of a facts file, in FactsStore's field order.
_FACTS_LISTS = ("step_times", "layer_profiles", "runtimes", "saved_activations", "stages_in_place")


def _entries(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The facts file's list `name` (absent: empty); TypeError naming it if it is not a list
    of objects (a hand-edited or foreign file), which would fail later, far from the file."""
    entries = data.get(name, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise TypeError(f"{name} is a JSON {type(entries).__name__}, not a list of objects")
    return entries


def _number(value: Any) -> bool:
    return finite_number(value) and value >= 0


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _text(value: object) -> bool:
    return isinstance(value, str)


def _positive(value: Any) -> bool:
    return _number(value) and value > 0


# What each kept entry's fields must be (required, then optional: null or absent allowed),
# as `FactsStore.record_*` write them. Checked at load, so that a hand-edited or damaged file
# is named in one line instead of a float() or a comparison failing far from it (found by
# fuzzing: tests/faults/test_damaged_state_files.py).
_Fields = tuple[dict[str, Callable[[Any], bool]], dict[str, Callable[[Any], bool]]]
_KEPT: dict[str, _Fields] = {
    "step_times": (
        {"batch": _positive_int, "seconds": _positive},
        {
            "q1_seconds": _number,
            "q3_seconds": _number,
            "reference_ms": _positive,
            "probe_batches": _positive_int,
            "probe_asked": _positive_int,
            "measured_at": _text,
            "device_name": _text,
        },
    ),
    "layer_profiles": (
        {"profile": lambda v: isinstance(v, dict)},
        {"measured_at": _text, "device_name": _text},
    ),
    "runtimes": (
        {"mb": _number},
        {"context_mb": _number, "measured_at": _text, "device_name": _text},
    ),
    "stages_in_place": (
        {"stages": lambda v: isinstance(v, list)},
        {"reference_ms": _positive, "measured_at": _text, "device_name": _text},
    ),
    "saved_activations": ({}, {"measured_at": _text}),
}
_PROFILE: _Fields = (
    {"batch_size": _positive_int, "device": _text, "layers": lambda v: isinstance(v, list)},
    {},
)
_LAYER: _Fields = (
    {
        "index": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "type": _text,
        **dict.fromkeys(
            ("forward_ms", "backward_ms", "update_ms", "activation_mb", "parameter_mb"), _number
        ),
    },
    {},
)
_STAGE: _Fields = (dict.fromkeys(("forward_s", "backward_s", "update_s"), _number), {})


def _when(entry: dict[str, Any]) -> str:
    """When a kept entry was measured, for "the newest": "" where not recorded (null)."""
    return str(entry.get("measured_at") or "")


def _check_fields(where: str, entry: object, fields: _Fields) -> None:
    """TypeError naming the first field of `entry` that is not what is kept there."""
    if not isinstance(entry, dict):
        raise TypeError(f"{where} is a JSON {type(entry).__name__}, not an object")
    required, optional = fields
    for name, sound in required.items():
        if not sound(entry.get(name)):
            raise TypeError(f"{where}.{name} is {json.dumps(entry.get(name))}")
    for name, sound in optional.items():
        if entry.get(name) is not None and not sound(entry[name]):
            raise TypeError(f"{where}.{name} is {json.dumps(entry[name])}")


def _check_kept(name: str, entries: list[dict[str, Any]]) -> None:
    """Every entry of the facts file's list `name`, and what it nests (a layer profile's
    layers, the stages timed in place), checked (`_KEPT`)."""
    for position, entry in enumerate(entries):
        where = f"{name}[{position}]"
        _check_fields(where, entry, _KEPT[name])
        if name == "layer_profiles":
            _check_fields(f"{where}.profile", entry["profile"], _PROFILE)
            for index, layer in enumerate(entry["profile"]["layers"]):
                _check_fields(f"{where}.profile.layers[{index}]", layer, _LAYER)
        if name == "stages_in_place":
            for index, stage in enumerate(entry["stages"]):
                _check_fields(f"{where}.stages[{index}]", stage, _STAGE)


def facts_path(output_root: Path | str, hardware: str) -> Path:
    """The facts measured for hardware configuration `hardware`:
    `<run.output_dir>/facts/<hardware>.json`."""
    return Path(output_root) / FACTS_DIR / f"{hardware}.json"


def device_present(config: DistbenchConfig) -> bool:
    """Whether this machine has the hardware's kind of device (every machine has a CPU)."""
    if config.hardware.device.value != "cuda":
        return True
    from harness.cli.preflight import torch_sees_cuda  # only a CUDA hardware asks it

    return torch_sees_cuda()


def probes_here(config: DistbenchConfig, cache: FactsCache) -> bool:
    return cache.probe and device_present(config)


def _facts_root(config: DistbenchConfig, cache: FactsCache) -> Path:
    return cache.facts_root if cache.facts_root is not None else Path(config.run.output_dir)


def _device_name(config: DistbenchConfig) -> str:
    """The machine a probe here runs on (`torch.cuda.get_device_name`, else the CPU model and
    the instruction set torch's kernels use: `harness.runtime.environment.machine_name`)."""
    from harness.runtime.environment import machine_name

    return machine_name(config.hardware.device.value)


def _keep(
    config: DistbenchConfig, cache: FactsCache, update: Callable[[FactsStore], None]
) -> Path | None:
    """Add a measurement to the hardware's facts file (re-read first, so that measurements
    another process kept meanwhile stay); the file's path, or None (with one line on stderr)
    when it cannot be written: the measurement itself is still used."""
    path = facts_path(_facts_root(config, cache), config.hardware.name)
    try:
        store = FactsStore.load(path, config.hardware.name)
        update(store)
        return store.save()
    except (OSError, ConfigError) as err:
        print(
            f"distbench: could not keep measured facts in {path}: {err}",
            file=sys.stderr,
            flush=True,
        )
        return None


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
        _threads(config),
    )
    if workload not in cache.recorded:
        path = facts_path(_facts_root(config, cache), config.hardware.name)
        in_file = FactsStore.load(path, config.hardware.name).steps(*workload)
        in_mlflow, mlflow_looked = sequential_steps(config, uri=cache.tracking_uri)
        cache.recorded[workload] = ([*in_file, *in_mlflow], [str(path), mlflow_looked])
    return cache.recorded[workload]


def _missing_message(config: DistbenchConfig, batch: int, looked: Sequence[str]) -> str:
    hardware, network, dataset = (
        config.hardware.name,
        config.network.label,
        config.dataset.name.value,
    )
    device = config.hardware.device.value
    threads = _threads(config)
    on = f"{device} ({threads} threads)" if threads is not None else device
    return (
        f"hardware={hardware}: no sequential step time measured on {on} for "
        f"{network}/{dataset} at batch {batch} (looked in {' and '.join(looked)}); on a "
        f"machine with that device run `python -m harness network={network} "
        f"dataset={dataset} distribution=sequential hardware={hardware} "
        f"distribution.batch_size={batch} dataset.num_samples={batch * 100} run.epochs=1` "
        f"(or this `python -m harness.recommend` command there), then run this again with "
        f"its outputs (copy its run.output_dir's facts/ here, or set tracking.uri to its "
        f"MLflow store)"
    )


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


_STEP_KEY = ("network", "dataset", "device", "device_name", "threads", "batch")
_PROFILE_KEY = ("network", "dataset", "device", "device_name", "threads")


def _profile_batch(entry: dict[str, Any]) -> int:
    """The batch a kept layer profile was taken at."""
    return int(entry.get("profile", {}).get("batch_size", 0))


@dataclass
class FactsStore:
    """The facts measured for one hardware configuration, kept as JSON at `facts_path`:

        {"format": 2, "hardware": NAME,
         "step_times": [{network, dataset, device, device_name, threads, batch, seconds,
                         q1_seconds, q3_seconds, std_seconds, batch_seconds, probe_batches,
                         probe_asked, reference_ms, measured_at}, ...],
         "layer_profiles": [{network, dataset, device, device_name, threads, measured_at,
                             profile: NetworkProfile.to_dict()}, ...],
         "runtimes": [{key, device_name, mb, context_mb, measured_at}, ...],
         "saved_activations": [{network, dataset, measured_at,
                                saved: predict.activations.SavedActivations}, ...],
         "stages_in_place": [{key, device_name, stages, reference_ms, measured_at}, ...]}

    `seconds` is the median of one sequential training step (forward, backward, update) at
    `batch` on the device `device_name` of kind `device` (`threads`: torch's threads on a CPU,
    null on CUDA or for torch's default), over `probe_batches` timed steps (`batch_seconds`,
    their quartiles `q1_seconds` and `q3_seconds`) of a probe asked for at most `probe_asked`
    (fewer once steady: `harness.measure.timing_rule.ProbeLength`). A runtime share
    (`predict.runtime`) is kept per `predict.runtime.probe_key` (`key`), what autograd saves per
    layer (sizes, on a CPU) per network, a pipeline's stages timed in place
    (`harness.profiles.stages.InPlaceStages`) per `in_place_key`. A new measurement replaces an
    older one of the same key; `save` writes atomically
    (`harness.records.results.write_json_atomic`).
    """

    path: Path
    hardware: str
    step_times: list[dict[str, Any]] = field(default_factory=list)
    layer_profiles: list[dict[str, Any]] = field(default_factory=list)
    runtimes: list[dict[str, Any]] = field(default_factory=list)
    saved_activations: list[dict[str, Any]] = field(default_factory=list)
    stages_in_place: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path | str, hardware: str | None = None) -> FactsStore:
        """The store at `path`; empty if there is no file yet."""
        path = Path(path)
        if not path.exists():
            return cls(path, hardware or path.stem)
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise TypeError(f"a JSON {type(data).__name__}, not an object")
            lists = [_entries(data, name) for name in _FACTS_LISTS]
            for name, entries in zip(_FACTS_LISTS, lists):
                _check_kept(name, entries)
            return cls(path, str(data.get("hardware") or hardware or path.stem), *lists)
        except (OSError, ValueError, AttributeError, TypeError) as err:
            raise MissingMeasurement(
                f"{path}: not a readable distbench facts file ({err}); "
                f"move it away and measure again"
            ) from None

    def save(self) -> Path:
        from workloads.datasets.atomic import write_json_atomic

        write_json_atomic(
            self.path,
            {
                "format": _FACTS_FORMAT,
                "hardware": self.hardware,
                "step_times": self.step_times,
                "layer_profiles": self.layer_profiles,
                "runtimes": self.runtimes,
                "saved_activations": self.saved_activations,
                "stages_in_place": self.stages_in_place,
            },
        )
        return self.path

    def record_step(
        self,
        *,
        network: str,
        dataset: str,
        device: str,
        batch: int,
        seconds: float,
        threads: int | None = None,
        device_name: str | None = None,
        std_seconds: float = 0.0,
        probe_batches: int | None = None,
        probe_asked: int | None = None,
        q1_seconds: float | None = None,
        q3_seconds: float | None = None,
        batch_seconds: Sequence[float] = (),
        reference_ms: float | None = None,
    ) -> None:
        """Keep one measured sequential step time (call `save` to write the file);
        `reference_ms`: the reference kernel's milliseconds around it (the machine's speed)."""
        if batch < 1 or not seconds > 0:
            raise ValueError(
                f"a step time needs batch >= 1 and seconds > 0, got {batch}, {seconds}"
            )
        entry = {
            "network": network,
            "dataset": dataset,
            "device": device,
            "device_name": device_name,
            "threads": threads,
            "batch": batch,
            "seconds": seconds,
            "q1_seconds": q1_seconds,
            "q3_seconds": q3_seconds,
            "std_seconds": std_seconds,
            "batch_seconds": list(batch_seconds),
            "probe_batches": probe_batches,
            "probe_asked": probe_asked,
            "reference_ms": reference_ms,
            "measured_at": _now(),
        }
        self.step_times = [
            old for old in self.step_times if any(old.get(k) != entry[k] for k in _STEP_KEY)
        ] + [entry]

    def record_profile(
        self,
        *,
        network: str,
        dataset: str,
        device: str,
        profile: Any,
        threads: int | None = None,
        device_name: str | None = None,
    ) -> None:
        """Keep a network's per-layer profile (a `harness.measure.profiler.NetworkProfile`)."""
        entry = {
            "network": network,
            "dataset": dataset,
            "device": device,
            "device_name": device_name,
            "threads": threads,
            "measured_at": _now(),
            "profile": profile.to_dict(),
        }
        self.layer_profiles = [
            old
            for old in self.layer_profiles
            if any(old.get(k) != entry[k] for k in _PROFILE_KEY)
            or _profile_batch(old) != profile.batch_size
        ] + [entry]

    def record_runtime(
        self, key: Sequence[Any], share: RuntimeShare, device_name: str | None = None
    ) -> None:
        """Keep a worker's measured runtime share for `predict.runtime.probe_key` `key`."""
        entry = {
            "key": list(key),
            "device_name": device_name,
            "mb": share.mb,
            "context_mb": share.context_mb,
            "measured_at": _now(),
        }
        self.runtimes = [
            old
            for old in self.runtimes
            if (old.get("key"), old.get("device_name")) != (entry["key"], device_name)
        ] + [entry]

    def runtime(self, key: Sequence[Any], device_name: str | None = None) -> RuntimeShare | None:
        """The newest runtime share kept for `key` (measured on `device_name` when given)."""
        found = [
            entry
            for entry in self.runtimes
            if entry.get("key") == list(key) and device_name in (None, entry.get("device_name"))
        ]
        if not found:
            return None
        newest = max(found, key=_when)
        try:
            return RuntimeShare(float(newest["mb"]), float(newest.get("context_mb", 0.0)))
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(
                f"{self.path}: the runtime share kept for {list(key)} is not in "
                f"today's format ({err}); measure it again"
            ) from None

    def record_in_place(
        self, key: Sequence[Any], timed: InPlaceStages, device_name: str | None = None
    ) -> None:
        """Keep a pipeline's stages timed in place for `in_place_key` `key`."""
        entry = {"key": list(key), "device_name": device_name, **timed.to_json()}
        self.stages_in_place = [
            old
            for old in self.stages_in_place
            if (old.get("key"), old.get("device_name")) != (entry["key"], device_name)
        ] + [entry]

    def in_place(self, key: Sequence[Any], device_name: str | None = None) -> InPlaceStages | None:
        """The newest stages timed in place for `key` (on `device_name` when given)."""
        found = [
            entry
            for entry in self.stages_in_place
            if entry.get("key") == list(key) and device_name in (None, entry.get("device_name"))
        ]
        if not found:
            return None
        return InPlaceStages.from_json(max(found, key=_when))

    def record_saved(self, network: str, dataset: str, saved: Any) -> None:
        """Keep what autograd saves per layer of a network (`predict.activations`; sizes,
        measured on a CPU whatever the device)."""
        entry = {
            "network": network,
            "dataset": dataset,
            "measured_at": _now(),
            "saved": asdict(saved),
        }
        self.saved_activations = [
            old
            for old in self.saved_activations
            if (old.get("network"), old.get("dataset")) != (network, dataset)
        ]
        self.saved_activations.append(entry)

    def saved(self, network: str, dataset: str) -> Any:
        """The saved activations kept for a network (a `SavedActivations`), or None."""
        from harness.costs.activations import LayerSaved, SavedActivations, SavedGroup

        found = [
            entry["saved"]
            for entry in self.saved_activations
            if (entry.get("network"), entry.get("dataset")) == (network, dataset)
        ]
        if not found:
            return None
        data = found[-1]
        try:
            layers = tuple(
                LayerSaved(
                    tuple(SavedGroup(**group) for group in layer["groups"]),
                    *(
                        layer[name]
                        for name in ("output_mb_per_sample", "saves_input", "output_saver")
                    ),
                )
                for layer in data["layers"]
            )
            return SavedActivations(
                layers,
                float(data["input_mb_per_sample"]),
                tuple(data["batches"]),
                float(data["seconds"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(
                f"{self.path}: the saved activations of {network}/{dataset} are "
                f"not in today's format ({err}); measure them again"
            ) from None

    def steps(
        self,
        network: str,
        dataset: str,
        device: str,
        threads: int | None,
        device_name: str | None = None,
    ) -> list[MeasuredStep]:
        """The step times kept for the workload on the device (the one named `device_name`
        when given), the newest per batch."""
        newest: dict[int, dict[str, Any]] = {}
        for entry in self.step_times:
            if (
                entry.get("network"),
                entry.get("dataset"),
                entry.get("device"),
                entry.get("threads"),
            ) == (network, dataset, device, threads) and device_name in (
                None,
                entry.get("device_name"),
            ):
                batch = int(entry["batch"])
                if batch not in newest or _when(entry) >= _when(newest[batch]):
                    newest[batch] = entry
        return [self._measured_step(entry) for _, entry in sorted(newest.items())]

    def _measured_step(self, entry: dict[str, Any]) -> MeasuredStep:
        def optional(name: str) -> float | None:
            return None if entry.get(name) is None else float(entry[name])

        return MeasuredStep(
            int(entry["batch"]),
            float(entry["seconds"]),
            f"facts file {self.path}",
            0,
            entry.get("device_name"),
            optional("q1_seconds"),
            optional("q3_seconds"),
            entry.get("probe_batches"),
            entry.get("measured_at"),
            optional("reference_ms"),
            probe_asked=entry.get("probe_asked"),
        )

    def profile(
        self,
        network: str,
        dataset: str,
        device: str,
        threads: int | None,
        device_name: str | None = None,
        batch: int | None = None,
    ) -> Any:
        """The newest layer profile kept for the workload on the device (the one named
        `device_name` when given; a NetworkProfile), at `batch` where one was taken there, else
        at the nearest batch kept; or None."""
        from harness.profiles.network import LayerProfile, NetworkProfile

        found = [
            entry
            for entry in self.layer_profiles
            if (
                entry.get("network"),
                entry.get("dataset"),
                entry.get("device"),
                entry.get("threads"),
            )
            == (network, dataset, device, threads)
            and device_name in (None, entry.get("device_name"))
        ]
        if not found:
            return None
        # the batch's (else the nearest batch's), then the newest (the later kept on a tie)
        _, _, _, data = max(
            (
                -abs(_profile_batch(entry) - batch) if batch is not None else 0,
                _when(entry),
                position,
                entry["profile"],
            )
            for position, entry in enumerate(found)
        )
        try:
            return NetworkProfile(
                int(data["batch_size"]),
                str(data["device"]),
                [LayerProfile(**layer) for layer in data["layers"]],
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(
                f"{self.path}: the layer profile of {network}/{dataset} is not "
                f"in today's format ({err}); measure it again"
            ) from None
