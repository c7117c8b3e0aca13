"""What the performance models need to know about a cell's workload, gathered once.

Two kinds of facts:
- static ones, free: parameter and activation sizes per layer (`harness.describe`, traced on
  the meta device);
- measured ones, on one device of the target kind: the sequential step time at the batch a
  model trains at (the thesis' statistical model, `predict.sequential`), and for pipelines each
  layer's share of the compute (the profiler) and the stage plan.

`FactsCache` keeps measurements by what determines them (network, dataset, batch, threads),
so an analysis of a grid or a recommendation over many candidates measures each one once.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from harness.config import ConfigError, DistbenchConfig, DistributionName
from harness.metrics import BYTES_PER_MB
from harness.partition import StagePlan

_PROBE_WARMUP = 2


@dataclass(frozen=True)
class LayerFacts:
    weights_mb: float
    activation_mb_per_sample: float  # the layer's output, per sample
    compute_share: float  # of the whole network's forward+backward+update time (pipelines)


@dataclass(frozen=True)
class CellFacts:
    """The inputs of a cell's prediction (see `harness.predict.cell`)."""

    weights_mb: float
    gradient_mb: float
    input_mb_per_sample: float
    layers: list[LayerFacts]
    step_seconds: float  # one sequential training step at `step_batch` (probe median)
    step_batch: int  # the batch the models scale from: micro-batch (GPipe), else the batch
    plan: StagePlan | None = None  # pipelines: layers and replicas per stage
    probe_seconds: float = 0.0  # how long measuring these facts took (0 when cached)

    @property
    def activation_mb_per_sample(self) -> float:
        return sum(layer.activation_mb_per_sample for layer in self.layers)


@dataclass
class FactsCache:
    """Measurements shared between the cells of one analysis or recommendation."""

    probe_batches: int = 5
    step_seconds: dict[tuple[Any, ...], float] = field(default_factory=dict)
    profiles: dict[tuple[Any, ...], Any] = field(default_factory=dict)  # NetworkProfile
    static: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # describe()


def command_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """The options of the commands that measure facts (analysis, recommend); the rest of
    their arguments are config overrides (`parse_known_args`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probe-batches", type=int, default=5,
                        help="timed batches of the sequential probe per batch size (default 5)")
    return parser


def cache_for(probe_batches: int) -> FactsCache:
    """A fresh cache for `--probe-batches`, checked like a config key."""
    if probe_batches < 1:
        raise ConfigError(f"--probe-batches={probe_batches} is invalid: must be 1 or more")
    return FactsCache(probe_batches=probe_batches)


def step_batch(config: DistbenchConfig) -> int:
    """The batch a step of the model's unit of work trains: GPipe's micro-batch, else the
    (per-worker) batch."""
    if config.distribution.name is DistributionName.gpipe:
        return config.batch_size // config.micro_batches
    return config.batch_size


def gather(config: DistbenchConfig, cache: FactsCache) -> CellFacts:
    """Facts for `config`, measuring on this machine what `cache` does not hold yet."""
    from harness.describe import FLOAT32_BYTES, describe
    from workloads.datasets import dataset_spec

    started = time.perf_counter()
    spec = dataset_spec(config.dataset.name.value)
    workload = (config.network.name.value, config.dataset.name.value)
    if workload not in cache.static:
        cache.static[workload] = describe(config.network.name.value, spec)
    static = cache.static[workload]
    batch = step_batch(config)
    seconds = _step_seconds(config, batch, cache)
    shares, plan = _pipeline_facts(config, static["num_layers"], cache)
    layers = [LayerFacts(weights_mb=layer["parameters"] * FLOAT32_BYTES / BYTES_PER_MB,
                         activation_mb_per_sample=layer["activation_mb"],
                         compute_share=share)
              for layer, share in zip(static["layers"], shares)]
    input_mb = torch.Size(spec.input_shape).numel() * FLOAT32_BYTES / BYTES_PER_MB
    return CellFacts(weights_mb=static["weights_mb"], gradient_mb=static["gradient_mb"],
                     input_mb_per_sample=input_mb, layers=layers, step_seconds=seconds,
                     step_batch=batch, plan=plan,
                     probe_seconds=time.perf_counter() - started)


def _threads(config: DistbenchConfig) -> int | None:
    return config.hardware.cpu_threads if config.hardware.device.value == "cpu" else None


def _step_seconds(config: DistbenchConfig, batch: int, cache: FactsCache) -> float:
    from harness.predict.sequential import measure_batch_seconds

    key = (config.network.name.value, config.dataset.name.value, config.hardware.device.value,
           _threads(config), batch, cache.probe_batches)
    if key not in cache.step_seconds:
        sequential = replace(config.distribution, name=DistributionName.sequential,
                             batch_size=batch, micro_batches=None, stages=None, balance=None)
        with _torch_threads(_threads(config)):
            timing = measure_batch_seconds(replace(config, distribution=sequential),
                                           batch_size=batch, probe_batches=cache.probe_batches,
                                           warmup_batches=_PROBE_WARMUP)
        cache.step_seconds[key] = timing.median_s
    return cache.step_seconds[key]


def _pipeline_facts(config: DistbenchConfig, num_layers: int,
                    cache: FactsCache) -> tuple[list[float], StagePlan | None]:
    """Each layer's share of the compute (uniform for non-pipelines, which never split the
    network) and the stage plan a pipeline cell trains, or trained (its recorded balance)."""
    if not config.distribution.pipeline:
        return [1 / num_layers] * num_layers, None
    from harness.plan import profile_network, stage_plan, updates_per_pass
    from workloads.datasets import dataset_spec
    from workloads.networks import build_network, to_layer_list

    # Each layer's *share* of the compute barely moves with the batch size, so one profile
    # (at the first batch asked for) serves every candidate of a recommendation.
    key = (config.network.name.value, config.dataset.name.value, config.hardware.device.value,
           _threads(config))
    if key not in cache.profiles:
        torch.manual_seed(config.run.seed)
        spec = dataset_spec(config.dataset.name.value)
        layers = to_layer_list(config.network.name.value,
                               build_network(config.network.name.value, spec))
        with _torch_threads(_threads(config)):
            cache.profiles[key] = profile_network(config, layers, torch.device("cpu"))
    profile = cache.profiles[key]
    costs = profile.compute_ms(updates_per_pass(config))
    return [cost / sum(costs) for cost in costs], stage_plan(config, num_layers, profile)


class _torch_threads:  # noqa: N801 - used as a context manager, like torch's own
    """Run with torch limited to `threads` (the worker's), then restore the caller's."""

    def __init__(self, threads: int | None) -> None:
        self.threads = threads
        self.before = torch.get_num_threads()

    def __enter__(self) -> None:
        if self.threads is not None:
            torch.set_num_threads(self.threads)

    def __exit__(self, *_: object) -> None:
        torch.set_num_threads(self.before)
