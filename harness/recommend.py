"""`python -m harness.recommend dataset=X network=Y hardware=H [overrides] [--json]`

Ranks the ways to distribute one training job on hardware H by predicted seconds per epoch:
sequential; DDP and Horovod on 2, 4, ... workers; GPipe with the Table 3.3 micro-batch count
and its half and double; PipeDream with the planner's stage plan and a straight pipeline.
Configurations predicted not to fit in a device's memory are marked and never recommended;
with `hardware.price_per_device_hour` each gets a cost per epoch.

Nothing is trained: the sequential probe times a few batches on one device of this machine
(so run it where such a device is), and the rest comes from the equations, the hardware
profile (`harness.probe`'s if measured, else the config's speeds) and, when an analysis was
run, the parameters it fitted for hardware H (`--fit`, default the newest
`<run.output_dir>/analysis/*/fit.json` that fitted cells of H; none: the raw equations).
That is why it works for networks and hardware the measured grid never saw.

Where this machine lacks the hardware's device (`hardware.device=cuda` on a login node), or
with `--no-probe`, nothing is timed: the step times are those measured earlier on that kind of
device, from `<run.output_dir>/facts/<hardware>.json` (what a probe or an analysis kept) and
from sequential cells in MLflow (`tracking.uri`); the output says which. A batch size measured
nowhere is scaled per sample from the nearest measured one, and marked `*`. With no
measurement at all it exits with status 2 and one line saying what to run where.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from harness.analysis.report import setting_label
from harness.cli import command
from harness.compose import compose_config
from harness.config import ConfigError, DistbenchConfig, DistributionName, validate
from harness.preflight import check_writable_dir
from harness.hardware_profile import profile_for
from harness.predict.cell import (
    RAW,
    cost_per_epoch,
    epoch_terms,
    memory_per_worker_mb,
)
from harness.predict.facts import (
    FactsCache,
    MissingMeasurement,
    StepTime,
    cache_for,
    command_parser,
    gather,
    step_time_source,
)
from harness.predict.memory import fits


@dataclass(frozen=True)
class Fitted:
    """The parameters an analysis learnt for one hardware (`harness.analysis`'s fit.json holds
    them per hardware), or the raw equations."""

    params: dict[str, float]
    runtime_mb: float
    source: str

    @classmethod
    def raw(cls, why: str) -> Fitted:
        return cls(dict(RAW), 0.0, f"raw equations ({why})")

    @classmethod
    def load(cls, path: Path | None, hardware: str) -> Fitted:
        """`hardware`'s parameters in `path`; the raw equations when there are none."""
        if path is None:
            return cls.raw(f"no analysis of hardware={hardware} found")
        fitted = _fitted_hardware(path).get(hardware)
        if fitted is None:
            return cls.raw(f"{path} fitted no cell of hardware={hardware}")
        return cls({**RAW, **fitted["params"]}, float(fitted.get("runtime_mb", 0.0)),
                   f"{path} (hardware={hardware}, {fitted.get('cells', '?')} cells)")


def _fitted_hardware(path: Path) -> dict[str, Any]:
    """fit.json's per-hardware entries; a file that is not a fit says so in one line."""
    try:
        data = json.loads(path.read_text())
        entries = data["hardware"]
        if not isinstance(entries, dict):  # a fit.json from before fits were per hardware
            raise TypeError("hardware is not a per-hardware table")
        return entries
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"--fit={path} is invalid: not a fit.json of harness.analysis "
                          f"({type(err).__name__}: {err}); run the analysis again") from None


@dataclass(frozen=True)
class Option:
    label: str
    distribution: str
    workers: int
    seconds_per_epoch: float
    memory_mb: float  # the largest worker's
    fits_memory: bool
    cost_per_epoch: float | None
    settings: dict[str, Any]
    # The batch its step time was scaled from (per sample), when not measured at its own.
    step_time_scaled_from: int | None = None


def newest_fit(output_root: Path, hardware: str) -> Path | None:
    """The newest `<output_root>/analysis/*/fit.json` that fitted cells of `hardware`: the
    parameters belong to the hardware they were measured on."""
    found = sorted((output_root / "analysis").glob("*/fit.json"),
                   key=lambda path: path.stat().st_mtime)
    for path in reversed(found):
        try:
            if hardware in _fitted_hardware(path):
                return path
        except ConfigError:
            continue  # an older or damaged fit: look further back
    return None


def worker_counts(config: DistbenchConfig) -> list[tuple[int, int]]:
    """(nodes, workers per node) to try: powers of two on one node, then whole nodes."""
    hardware = config.hardware
    counts = [(1, w) for w in _powers_of_two(hardware.workers_per_node) if w >= 2]
    counts += [(n, hardware.workers_per_node) for n in _powers_of_two(hardware.nodes) if n >= 2]
    return counts


def _powers_of_two(limit: int) -> list[int]:
    values = [2 ** k for k in range(int(math.log2(limit)) + 1)] if limit >= 1 else []
    return sorted(set(values + [limit]))


def candidates(config: DistbenchConfig) -> Iterator[DistbenchConfig]:
    """Every configuration the recommender ranks (module docstring)."""
    # The user's batch size and micro-batch count (else Table 3.3's) hold for every
    # candidate; plans are the candidates' own.
    base = replace(config.distribution, balance=None, stages=None)
    yield _with(config, replace(base, name=DistributionName.sequential), 1, 1)
    for nodes, per_node in worker_counts(config):
        for name in (DistributionName.ddp, DistributionName.horovod):
            yield _with(config, replace(base, name=name), nodes, per_node)
        gpipe = _with(config, replace(base, name=DistributionName.gpipe), nodes, per_node)
        default = gpipe.micro_batches
        for micro_batches in sorted({max(1, default // 2), default, default * 2}):
            if gpipe.batch_size % micro_batches == 0:
                yield _with(config, replace(base, name=DistributionName.gpipe,
                                            micro_batches=micro_batches), nodes, per_node)
        straight = "-".join(["1"] * nodes * per_node)
        for stages in (None, straight):
            yield _with(config, replace(base, name=DistributionName.pipedream, stages=stages),
                        nodes, per_node)


def _with(config: DistbenchConfig, distribution: Any, nodes: int,
          per_node: int) -> DistbenchConfig:
    hardware = replace(config.hardware, nodes=nodes, workers_per_node=per_node)
    return replace(config, distribution=distribution, hardware=hardware)


def rank(config: DistbenchConfig, fitted: Fitted, cache: FactsCache,
         output_root: Path) -> tuple[list[Option], list[str]]:
    """Options sorted fastest first, and why the candidates that could not be built failed."""
    options, skipped = [], []
    for candidate in candidates(config):
        label = setting_label(candidate)
        try:
            options.append(_predict(candidate, fitted, cache, output_root))
        except MissingMeasurement:  # no candidate can be predicted: say what to measure
            raise
        except (ConfigError, ValueError) as err:  # e.g. more stages than layers
            skipped.append(f"{label}: {err}")
    options.sort(key=lambda option: option.seconds_per_epoch)
    return options, skipped


def _predict(candidate: DistbenchConfig, fitted: Fitted, cache: FactsCache,
             output_root: Path) -> Option:
    facts = gather(candidate, cache)
    profile = profile_for(candidate.hardware, output_root)
    model = candidate.distribution.name.value
    seconds = epoch_terms(candidate, facts, profile).seconds(fitted.params)
    memory = memory_per_worker_mb(candidate, facts, runtime_mb=fitted.runtime_mb)
    settings = {"batch_size": candidate.batch_size}
    if candidate.distribution.name is DistributionName.gpipe:
        settings["micro_batches"] = candidate.micro_batches
    if facts.plan is not None:
        settings["stages"] = facts.plan.stage_string()
        settings["balance"] = facts.plan.balance
    workers = 1 if model == "sequential" else candidate.world_size
    step = step_time_source(candidate, cache)
    return Option(setting_label(candidate, plan=facts.plan), model, workers, seconds,
                  max(memory), fits(memory, candidate.hardware.device_memory_gb),
                  cost_per_epoch(candidate, seconds), settings,
                  step.measured_batch if step is not None and step.scaled else None)


def recommendation(options: Sequence[Option]) -> Option | None:
    return next((option for option in options if option.fits_memory), None)


def step_times(cache: FactsCache) -> list[StepTime]:
    """The sequential step times the predictions used, by batch."""
    return sorted(cache.sources.values(), key=lambda step: step.batch)


def source_lines(cache: FactsCache) -> list[str]:
    """Where the measured inputs of the predictions come from, for the user to judge."""
    lines = ["step times (one sequential training step):"]
    lines += [f"  {step.describe()}" for step in step_times(cache)]
    lines += [f"layer profile (pipelines): {source}"
              for source in cache.profile_sources.values()]
    if any(step.scaled for step in step_times(cache)):
        lines.append("  * scaled per sample from another batch size: measure that batch on the "
                     "device for a firmer number")
    return lines


def print_table(config: DistbenchConfig, options: Sequence[Option], skipped: Sequence[str],
                fitted: Fitted, elapsed: float, sources: Sequence[str] = ()) -> None:
    print(f"{config.network.name.value} on {config.dataset.name.value}, hardware "
          f"{config.hardware.name} ({config.hardware.world_size} workers); parameters: "
          f"{fitted.source}")
    for line in sources:
        print(line)
    print(f"{'#':>3}  {'configuration':<24}{'s/epoch':>10}{'MB/worker':>11}{'fits':>6}"
          f"{'cost/epoch':>12}")
    for index, option in enumerate(options, 1):
        cost = f"{option.cost_per_epoch:.4f}" if option.cost_per_epoch is not None else "-"
        scaled = "*" if option.step_time_scaled_from is not None else " "
        print(f"{index:>3}  {option.label:<24}{option.seconds_per_epoch:>10.3f}{scaled}"
              f"{option.memory_mb:>10.0f}{'yes' if option.fits_memory else 'NO':>6}{cost:>12}")
    for reason in skipped:
        print(f"     skipped {reason}")
    best = recommendation(options)
    print(f"recommended: {best.label if best else 'nothing fits in memory'}; "
          f"prediction took {elapsed:.1f} s")


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = command_parser("python -m harness.recommend", __doc__)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--fit", type=Path, default=None,
                        help="fit.json of an analysis (default: the newest that fitted the "
                             "hardware)")
    return parser.parse_known_args(list(argv))


@command
def main(argv: Sequence[str] | None = None) -> None:
    options_, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    config = validate(compose_config(overrides))
    check_writable_dir("run.output_dir", config.run.output_dir)  # facts measured here go there
    output_root = Path(config.run.output_dir)
    started = time.perf_counter()
    fit_path = options_.fit if options_.fit is not None \
        else newest_fit(output_root, config.hardware.name)
    if fit_path is not None and not fit_path.exists():
        raise ConfigError(f"--fit={fit_path} is invalid: no such file")
    cache = cache_for(options_.probe_batches, probe=not options_.no_probe,
                      facts_root=output_root)
    fitted = Fitted.load(fit_path, config.hardware.name)
    options, skipped = rank(config, fitted, cache, output_root)
    elapsed = time.perf_counter() - started
    if options_.json:
        best = recommendation(options)
        json.dump({"dataset": config.dataset.name.value, "network": config.network.name.value,
                   "hardware": config.hardware.name, "parameters": fitted.source,
                   "recommended": best.label if best else None,
                   "prediction_seconds": elapsed, "options": [asdict(o) for o in options],
                   "skipped": skipped,
                   "step_times": [{**asdict(step), "scaled": step.scaled}
                                  for step in step_times(cache)],
                   "layer_profile": sorted(set(cache.profile_sources.values()))},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(config, options, skipped, fitted, elapsed, source_lines(cache))


if __name__ == "__main__":
    main()
