"""`python -m harness.recommend dataset=X network=Y hardware=H [overrides] [--json]`

Ranks the ways to distribute one training job on hardware H by predicted seconds per epoch:
sequential; DDP and Horovod on 2, 4, ... workers; GPipe with the Table 3.3 micro-batch count
and its half and double; PipeDream with the planner's stage plan and a straight pipeline.
Configurations predicted not to fit in a device's memory are marked and never recommended;
with `hardware.price_per_device_hour` each gets a cost per epoch.

Nothing is trained: the sequential probe times a few batches on one device of this machine
(so run it where such a device is), and the rest comes from the equations, the hardware
profile (`harness.probe`'s if measured, else the config's speeds) and, when an analysis was
run, the parameters it fitted (`--fit`, default the newest `<run.output_dir>/analysis/*/fit.json`).
That is why it works for networks and hardware the measured grid never saw.
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
from harness.hardware_profile import profile_for
from harness.predict.cell import (
    RAW,
    ModelParams,
    cost_per_epoch,
    epoch_terms,
    memory_per_worker_mb,
)
from harness.predict.facts import FactsCache, cache_for, command_parser, gather
from harness.predict.memory import fits


@dataclass(frozen=True)
class Fitted:
    """What an analysis learnt (`harness.analysis`'s fit.json), or the raw equations."""

    params: dict[str, ModelParams]
    runtime_mb: float
    source: str

    def of(self, model: str) -> ModelParams:
        return self.params.get(model, RAW)

    @classmethod
    def load(cls, path: Path | None) -> Fitted:
        if path is None:
            return cls({}, 0.0, "raw equations (no analysis found)")
        data = json.loads(path.read_text())
        return cls({model: ModelParams(**values) for model, values in data["params"].items()},
                   float(data.get("runtime_mb", 0.0)), str(path))


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


def newest_fit(output_root: Path) -> Path | None:
    found = sorted((output_root / "analysis").glob("*/fit.json"),
                   key=lambda path: path.stat().st_mtime)
    return found[-1] if found else None


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
        except (ConfigError, ValueError) as err:  # e.g. more stages than layers
            skipped.append(f"{label}: {err}")
    options.sort(key=lambda option: option.seconds_per_epoch)
    return options, skipped


def _predict(candidate: DistbenchConfig, fitted: Fitted, cache: FactsCache,
             output_root: Path) -> Option:
    facts = gather(candidate, cache)
    profile = profile_for(candidate.hardware, output_root)
    model = candidate.distribution.name.value
    seconds = epoch_terms(candidate, facts, profile).seconds(fitted.of(model))
    memory = memory_per_worker_mb(candidate, facts, runtime_mb=fitted.runtime_mb)
    settings = {"batch_size": candidate.batch_size}
    if candidate.distribution.name is DistributionName.gpipe:
        settings["micro_batches"] = candidate.micro_batches
    if facts.plan is not None:
        settings["stages"] = facts.plan.stage_string()
        settings["balance"] = facts.plan.balance
    workers = 1 if model == "sequential" else candidate.world_size
    return Option(setting_label(candidate, plan=facts.plan), model, workers, seconds,
                  max(memory), fits(memory, candidate.hardware.device_memory_gb),
                  cost_per_epoch(candidate, seconds), settings)


def recommendation(options: Sequence[Option]) -> Option | None:
    return next((option for option in options if option.fits_memory), None)


def print_table(config: DistbenchConfig, options: Sequence[Option], skipped: Sequence[str],
                fitted: Fitted, elapsed: float) -> None:
    print(f"{config.network.name.value} on {config.dataset.name.value}, hardware "
          f"{config.hardware.name} ({config.hardware.world_size} workers); parameters: "
          f"{fitted.source}")
    print(f"{'#':>3}  {'configuration':<24}{'s/epoch':>10}{'MB/worker':>11}{'fits':>6}"
          f"{'cost/epoch':>12}")
    for index, option in enumerate(options, 1):
        cost = f"{option.cost_per_epoch:.4f}" if option.cost_per_epoch is not None else "-"
        print(f"{index:>3}  {option.label:<24}{option.seconds_per_epoch:>10.3f}"
              f"{option.memory_mb:>11.0f}{'yes' if option.fits_memory else 'NO':>6}{cost:>12}")
    for reason in skipped:
        print(f"     skipped {reason}")
    best = recommendation(options)
    print(f"recommended: {best.label if best else 'nothing fits in memory'}; "
          f"prediction took {elapsed:.1f} s")


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = command_parser("python -m harness.recommend", __doc__)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--fit", type=Path, default=None,
                        help="fit.json of an analysis (default: the newest one)")
    return parser.parse_known_args(list(argv))


@command
def main(argv: Sequence[str] | None = None) -> None:
    options_, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    config = validate(compose_config(overrides))
    output_root = Path(config.run.output_dir)
    started = time.perf_counter()
    fit_path = options_.fit if options_.fit is not None else newest_fit(output_root)
    if fit_path is not None and not fit_path.exists():
        raise ConfigError(f"--fit={fit_path} is invalid: no such file")
    cache = cache_for(options_.probe_batches)
    fitted = Fitted.load(fit_path)
    options, skipped = rank(config, fitted, cache, output_root)
    elapsed = time.perf_counter() - started
    if options_.json:
        best = recommendation(options)
        json.dump({"dataset": config.dataset.name.value, "network": config.network.name.value,
                   "hardware": config.hardware.name, "parameters": fitted.source,
                   "recommended": best.label if best else None,
                   "prediction_seconds": elapsed, "options": [asdict(o) for o in options],
                   "skipped": skipped}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(config, options, skipped, fitted, elapsed)


if __name__ == "__main__":
    main()
