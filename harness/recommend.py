"""`python -m harness.recommend dataset=X network=Y hardware=H [overrides] [--objective time|cost]
[--remeasure] [--json]`

Ranks the ways to distribute one training job on hardware H by predicted seconds per epoch
(`--objective cost`: by cost per epoch): sequential; DDP and Horovod on 2, 4, ... workers;
GPipe with the Table 3.3 micro-batch count and its half and double; PipeDream with the
planner's stage plan and a straight pipeline. Each option carries the overrides that train it
with `python -m harness`, its likely range, and its memory per worker; configurations
predicted not to fit in a device's memory are marked and never recommended ("unknown" where
`hardware.device_memory_gb` is null); with `hardware.price_per_device_hour` (in
`hardware.currency`) each gets a cost per epoch.

Nothing is trained: the sequential probe times a few batches on one device of this machine
(so run it where such a device is), and the rest comes from the equations, the hardware
profile (`harness.probe`'s if measured, else the config's speeds) and, when an analysis was
run, the parameters it fitted for hardware H (`--fit`, default the
`<run.output_dir>/analysis/*/fit.json` with cells of H that covers the most of the ranked
models, then networks, cells, recency; none: the raw equations). A model that fit calibrated
(its cells on H, its error on an unseen network measured) gets a range widened by that error;
any other is marked uncalibrated, its range is the raw equations' error, and the output names
the commands that calibrate (`harness.analysis.calibration`). That is why it works for
networks and hardware the measured grid never saw. Every candidate is composed and validated
before anything is measured or written. What the probe
measures is kept in `<run.output_dir>/facts/<hardware>.json` and used again by the next run
on the same device (`--remeasure` times it again), so the same command gives the same numbers.

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
import re
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

from harness.analysis.calibration import (
    RAW_ERROR_FACTOR,
    Fitted,
    calibrate_commands,
    choose_fit,
    machine_since_fit,
)
from harness.cli.bad_input import BAD_INPUT_ERRORS, bad_input_message
from harness.cli.errors import command
from harness.cli.preflight import check_writable_dir
from harness.commands.compose import compose_config
from harness.commands.facts_options import command_parser
from harness.config.schema import ConfigError, DistbenchConfig, validate
from harness.costs.memory import fits
from harness.costs.partition import StagePlan
from harness.distributions.registry import spec_of, specs
from harness.predict.cell import cost_per_epoch, epoch_terms, memory_per_worker_mb
from harness.predict.facts.cache import (
    FactsCache,
    StepKey,
    cache_for,
    contradicting_steps,
    step_time_source,
)
from harness.predict.facts.gather import gather, keep_contradicting, probes_here
from harness.predict.facts.store import MissingMeasurement
from harness.predict.labels import setting_label
from harness.predict.ties import Tie, not_told_apart, tie_with_fastest
from harness.profiles.hardware import HardwareProfile, link_line, links_label, profile_for
from harness.profiles.steps import StepTime
from harness.worker.measurements import WorkerMeasurements

OBJECTIVES = ("time", "cost")
# `--probe-spread`'s default here (`harness.measure.timing_rule.ProbeLength`): the probe stops after
# 3 timed steps within 5 % of one another (a ResNet-50 step of 5.6 s on one core varies by 3 %).
RECOMMEND_PROBE_SPREAD = 0.05


@dataclass(frozen=True)
class Option:
    label: str
    distribution: str
    workers: int
    seconds_per_epoch: float
    # The likely range of seconds_per_epoch: the step time's quartiles over the probe's
    # batches, widened by the fit's held-out error of the model where a fit calibrated it,
    # else by the raw equations' error (`analysis.calibration.ModelCalibration`).
    seconds_low: float
    seconds_high: float
    memory_mb: float  # the largest worker's
    fits_memory: bool | None  # None: unknown (hardware.device_memory_gb is null)
    cost_per_epoch: float | None  # in hardware.currency; None without a price
    # `python -m harness` arguments that train this option, accepted as they are: the
    # recommender's own overrides (`common`), then the option's (`own`).
    overrides: list[str]
    own_overrides: list[str]
    batch_size: int
    settings: dict[str, Any]  # the model's own settings (`DistributionConfig.own_settings`)
    stages: str | None  # pipelines: replicas per stage of the plan predicted
    balance: list[int] | None  # pipelines: layers per stage
    # The batch its step time was scaled from (per sample), when not measured at its own.
    step_time_scaled_from: int | None = None
    # Whether a fit of this hardware calibrated the model (its range then holds the fit's
    # error), and what the range is made of.
    calibrated: bool = False
    range_source: str = ""
    # The fit's error of the model on an unseen network, percent (None: uncalibrated).
    error_percent: float | None = None
    # The memory model's error on an unseen network, percent (None: not measured).
    memory_error_percent: float | None = None


def worker_counts(config: DistbenchConfig) -> list[tuple[int, int]]:
    """(nodes, workers per node) to try: powers of two on one node, then whole nodes."""
    hardware = config.hardware
    counts = [(1, w) for w in _powers_of_two(hardware.workers_per_node) if w >= 2]
    counts += [(n, hardware.workers_per_node) for n in _powers_of_two(hardware.nodes) if n >= 2]
    return counts


def _powers_of_two(limit: int) -> list[int]:
    values = [2**k for k in range(int(math.log2(limit)) + 1)] if limit >= 1 else []
    return sorted(set(values + [limit]))


@dataclass(frozen=True)
class Candidates:
    """What the recommender will rank, known before anything is measured or written: every
    candidate whose `python -m harness` command composes and validates as a cell would, and
    why the others cannot exist for this ask (`skipped`, one line each)."""

    configs: list[DistbenchConfig]
    skipped: list[str]

    @property
    def models(self) -> set[str]:
        return {config.distribution.name for config in self.configs}


def check_candidates(config: DistbenchConfig, given: Sequence[str] = ()) -> Candidates:
    """Every configuration the recommender ranks (module docstring): each model's own
    (`DistributionSpec.candidates`) over the worker counts to try, each composed from the
    command that would train it and validated, as `python -m harness` would. The user's batch
    size holds for every candidate, and the user's model's settings for its candidates.

    A candidate that fails on a setting the user asked for (a key of `given` the recommender
    does not vary: `dataset.num_samples`, `distribution.batch_size`, ...) refuses the whole
    ask in one line (ConfigError): a table without it would hide that the ask is wrong. One
    that fails on what the recommender chose (a worker count, a model's own setting) cannot
    exist for this ask: skipped, and listed with why."""
    commands = Commands(common_overrides(config, given), frozenset(_keys(given)))
    built, skipped = _built_candidates(config, commands.given)
    configs = []
    # Commands that choose the same groups and set the same keys compose alike (Hydra's part:
    # config files, keys, types); what their values must satisfy was checked as each candidate
    # was built. So one command of each shape is composed (a few a second: a cluster has
    # dozens of candidates).
    composed: set[tuple[str, ...]] = set()
    for candidate in built:
        command = [*commands.common, *option_overrides(candidate, config, None, commands.given)]
        shape = tuple(_shape(override) for override in command)
        if shape not in composed:
            try:  # a candidate that does not fit is listed so (`fits`), not refused
                validate(compose_config(command), weights_must_fit=False)
            except BAD_INPUT_ERRORS as err:
                skipped.append(_refuse_or_skip(err, setting_label(candidate), commands.given))
                continue
            composed.add(shape)
        configs.append(candidate)
    return Candidates(configs, skipped)


def _shape(override: str) -> str:
    """What of an override decides how it composes: a key's name; a group's choice
    (`distribution=gpipe` composes another schema than `distribution=ddp`)."""
    key = override.split("=")[0]
    return key if "." in key else override


def _built_candidates(
    config: DistbenchConfig, given: frozenset[str]
) -> tuple[list[DistbenchConfig], list[str]]:
    """Each model's candidates at each worker count (one count at a time, so that a count a
    model cannot use skips only that count), and why the counts that failed did."""
    built: list[DistbenchConfig] = []
    skipped = []
    for spec in specs().values():
        # one count at a time; none where the hardware has one worker (sequential only)
        for counts in [[count] for count in worker_counts(config)] or [[]]:
            try:
                found = list(spec.candidates(config, counts))
            except BAD_INPUT_ERRORS as err:
                where = "".join(f" on {nodes}x{per_node} workers" for nodes, per_node in counts)
                skipped.append(_refuse_or_skip(err, f"{spec.name}{where}", given))
                continue
            built += [candidate for candidate in found if candidate not in built]
    return built, skipped


def _refuse_or_skip(err: Exception, label: str, given: frozenset[str]) -> str:
    """The skipped line for a candidate that failed with `err`; raises ConfigError instead
    where `err` names a setting the user asked for (`check_candidates`)."""
    message = bad_input_message(err)
    key = re.match(r"[+~]*([\w.]+)\s*[=:]", message)
    if key is not None and key[1] in given and key[1] not in _OPTION_KEYS:
        raise ConfigError(
            f"{message} (for the recommender's candidate {label}, built from "
            f"the settings asked for)"
        ) from None
    return f"{label}: {message}"


def candidates(config: DistbenchConfig) -> list[DistbenchConfig]:
    """The configurations the recommender ranks for `config` (`check_candidates`)."""
    return check_candidates(config).configs


def rank(
    config: DistbenchConfig,
    fitted: Fitted,
    cache: FactsCache,
    output_root: Path,
    given: Sequence[str] = (),
    objective: str = "time",
    checked: Candidates | None = None,
) -> tuple[list[Option], list[str]]:
    """Options sorted best first by `objective` (time, or cost then time), and why the
    candidates that could not be built or predicted failed. `given`: the overrides `config`
    was composed from, which every option's `python -m harness` command builds on
    (`common_overrides`); `checked`: the candidates, checked (`check_candidates`)."""
    checked = check_candidates(config, given) if checked is None else checked
    options, skipped = [], list(checked.skipped)
    commands = Commands(common_overrides(config, given), frozenset(_keys(given)))
    timed = True
    for candidate in checked.configs:
        label = setting_label(candidate)
        try:
            options.append(
                _predict(candidate, config, fitted, cache, output_root, commands, timed=timed)
            )
        except MissingMeasurement as missing:
            # No step time on the device yet: the times cannot be ranked, but the memory
            # question can still be answered for every option (`rank_by_memory`).
            if not timed:
                raise
            timed, cache.missing_step_time = False, str(missing)
            options.append(
                _predict(candidate, config, fitted, cache, output_root, commands, timed=False)
            )
        # e.g. more stages than layers; a measured profile without links among this many
        # workers (KeyError: it was probed on fewer)
        except (ConfigError, ValueError, KeyError) as err:
            skipped.append(f"{label}: {err.args[0] if isinstance(err, KeyError) else err}")
    if not timed:  # options predicted before the step time was found missing have times
        options = [
            replace(
                option,
                seconds_per_epoch=math.nan,
                seconds_low=math.nan,
                seconds_high=math.nan,
                cost_per_epoch=None,
            )
            for option in options
        ]
        options.sort(key=_memory_ranking)
        return options, skipped
    options.sort(key=_ranking(objective))
    return options, skipped


def _memory_ranking(option: Option) -> tuple[int, float]:
    """Without step times: the options that fit first, then by memory per worker."""
    return ({True: 0, None: 1, False: 2}[option.fits_memory], option.memory_mb)


def _ranking(objective: str) -> Any:
    if objective == "cost":
        return lambda option: (option.cost_per_epoch, option.seconds_per_epoch)
    return lambda option: option.seconds_per_epoch


@dataclass(frozen=True)
class Commands:
    """What the options' commands share: `common` overrides first; `given`, the keys the user
    set (an option restates those of them it sets itself, since `common` drops them)."""

    common: list[str]
    given: frozenset[str]


def _predict(
    candidate: DistbenchConfig,
    asked: DistbenchConfig,
    fitted: Fitted,
    cache: FactsCache,
    output_root: Path,
    commands: Commands,
    timed: bool = True,
) -> Option:
    facts = gather(candidate, cache, timed=timed)
    model = candidate.distribution.name
    step = step_time_source(candidate, cache) if timed else None
    if timed:
        profile = profile_for(candidate.hardware, output_root)
        seconds = epoch_terms(candidate, facts, profile).seconds(fitted.params)
        low, high = (
            _epoch_seconds_at(candidate, facts, profile, fitted, spread)
            for spread in _step_spread(step, facts.step_seconds)
        )
    else:
        seconds = low = high = math.nan
    calibration = fitted.calibration(model)
    low, high = calibration.widen(low, seconds, high)
    memory = memory_per_worker_mb(candidate, facts, runtime_mb=fitted.runtime_mb)
    memory_gb = candidate.hardware.device_memory_gb
    plan = facts.plan
    own = option_overrides(candidate, asked, plan, commands.given)
    return Option(
        setting_label(candidate, plan=plan),
        model,
        candidate.world_size,
        seconds,
        low,
        high,
        max(memory),
        None if memory_gb is None else fits(memory, memory_gb),
        cost_per_epoch(candidate, seconds) if timed else None,
        [*commands.common, *own],
        own,
        candidate.batch_size,
        candidate.distribution.own_settings(candidate),
        plan.stage_string() if plan is not None else None,
        list(plan.balance) if plan is not None else None,
        step.measured_batch if step is not None and step.scaled else None,
        calibration.calibrated,
        calibration.why,
        calibration.error_percent,
        calibration.memory_error_percent,
    )


def _step_spread(step: StepTime | None, median: float) -> tuple[float, float]:
    """The step time's quartiles, or the median twice where no spread was kept."""
    if step is None or step.low is None or step.high is None:
        return median, median
    return step.low, step.high


def _epoch_seconds_at(
    candidate: DistbenchConfig, facts: Any, profile: Any, fitted: Fitted, step_seconds: float
) -> float:
    return epoch_terms(candidate, replace(facts, step_seconds=step_seconds), profile).seconds(
        fitted.params
    )


# The overrides an option sets itself; the user's own of these keys do not carry over (nor
# any `distribution.*`: a model's settings are its own, another model refuses them).
_OPTION_KEYS = frozenset({"distribution", "hardware.nodes", "hardware.workers_per_node"})


def _options_own(key: str) -> bool:
    return key in _OPTION_KEYS or key.startswith("distribution.")


def common_overrides(config: DistbenchConfig, given: Sequence[str]) -> list[str]:
    """What every option's command starts with: the dataset, network and hardware chosen
    (spelled out where they were defaults; not a hardware renamed by `hardware.name`, which
    names no config file), then the recommender's other overrides as given
    (`run.output_dir`, `dataset.num_samples`, ...), less the keys an option sets itself."""
    parsed = _parsed(given)
    keys = {override.key_or_group for override in parsed}
    chosen = [f"dataset={config.dataset.key}", f"network={config.network.label}"]
    if "hardware.name" not in keys:
        chosen.append(f"hardware={config.hardware.name}")
    chosen = [choice for choice in chosen if choice.split("=")[0] not in keys]
    return chosen + [
        override.input_line for override in parsed if not _options_own(override.key_or_group)
    ]


def _parsed(overrides: Sequence[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(list(overrides))


def _keys(overrides: Sequence[str]) -> set[str]:
    return {override.key_or_group for override in _parsed(overrides)}


def option_overrides(
    candidate: DistbenchConfig,
    asked: DistbenchConfig,
    plan: StagePlan | None,
    given: frozenset[str] = frozenset(),
) -> list[str]:
    """What trains `candidate` on top of `common_overrides`: the model, its worker count
    (where not the hardware's, or where the user set it: `given`), the batch size, the model's
    own settings that are not its defaults, and what the model pins
    (`DistributionSpec.pinned_overrides`: GPipe's micro-batches, a pipeline's plan, the one
    predicted: the planner could choose another on another machine)."""
    own = [f"distribution={candidate.distribution.name}"]
    for key in ("nodes", "workers_per_node"):
        value = getattr(candidate.hardware, key)
        if value != getattr(asked.hardware, key) or f"hardware.{key}" in given:
            own.append(f"hardware.{key}={value}")
    own.append(f"distribution.batch_size={candidate.batch_size}")
    pinned = spec_of(candidate).pinned_overrides(candidate, plan)
    pinned_keys = {override.split("=")[0] for override in pinned}
    return (
        own
        + [
            override
            for override in _changed_settings(candidate)
            if override.split("=")[0] not in pinned_keys
        ]
        + pinned
    )


def _changed_settings(candidate: DistbenchConfig) -> list[str]:
    """Overrides of the candidate's own model settings that differ from their defaults (the
    user's, carried over to the candidates of the model asked about)."""
    distribution = candidate.distribution
    defaults = type(distribution)(name=distribution.name).own_settings_raw()
    return [
        f"distribution.{key}={_override_value(value)}"
        for key, value in distribution.own_settings_raw().items()
        if value != defaults[key]
    ]


def _override_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return f"[{','.join(map(str, value))}]"
    return str(getattr(value, "value", value))


def recommendation(
    options: Sequence[Option], objective: str = "time", noise_percent: float = 0.0
) -> Option | None:
    """The best-ranked option not predicted to run out of memory (unknown counts as fit); by
    time, where the fastest ones are tied within the models' error and the noise, the one the
    tie-break takes (`tie`)."""
    found = tie(options, objective, noise_percent)
    if found is not None:
        return cast(Option, found.chosen)
    return next((option for option in options if option.fits_memory is not False), None)


def tie(options: Sequence[Option], objective: str, noise_percent: float) -> Tie | None:
    """The tie among the fastest options that may fit (harness.predict.ties), by time only."""
    if objective != "time":
        return None
    return tie_with_fastest(
        [
            option
            for option in options
            if option.fits_memory is not False and not math.isnan(option.seconds_per_epoch)
        ],
        noise_percent,
    )


def best_by(options: Sequence[Option], objective: str) -> Option | None:
    """The best option by `objective` among those that may fit; None without a price."""
    if objective == "cost" and any(option.cost_per_epoch is None for option in options):
        return None
    return recommendation(sorted(options, key=_ranking(objective)))


def step_times(cache: FactsCache) -> list[StepTime]:
    """The sequential step times the predictions used, by batch."""
    return sorted(cache.sources.values(), key=lambda step: step.batch)


def _timed_again(cache: FactsCache, pair: tuple[StepKey, StepKey]) -> bool:
    """Whether a contradicting pair was timed again already, by an earlier run that kept
    them so (`keep_contradicting`): said, not timed on every ask (--remeasure times them)."""
    return all(cache.sources[key].contradicts is not None for key in pair)


def contradiction_line(cache: FactsCache, pairs: Sequence[tuple[StepKey, StepKey]]) -> str:
    """What `contradicting_steps` found, in one line."""
    said = "; ".join(
        f"the step at batch {larger.batch} ({larger.seconds:.4g} s) took less time than at "
        f"batch {smaller.batch} ({smaller.seconds:.4g} s)"
        for smaller, larger in ((cache.sources[a], cache.sources[b]) for a, b in pairs)
    )
    return f"{said}, beyond their spread: one was timed while the machine was disturbed"


def links_since_fit(fitted: Fitted, profile: HardwareProfile | None) -> str | None:
    """A line where the links the fit priced its cells with are not the ones priced now (a
    profile probed after the analysis, or one moved aside): its `communication` factor made up
    for the former's error, not the latter's. None where they agree, or either is unknown."""
    fit = fitted.fit
    now = links_label(profile)
    if fit is None or fit.links is None or now is None or fit.links == now:
        return None
    return (
        f"links changed since the fit: it priced its cells with links {fit.links}, "
        f"these are {now}; its communication factor belongs to the former: python -m "
        f"harness.analysis tracking.experiment={fit.path.parent.name} fits it again "
        f"(the fit: {fit.path})"
    )


def source_lines(cache: FactsCache) -> list[str]:
    """Where the measured inputs of the predictions come from, for the user to judge."""
    lines = ["step times (one sequential training step):"] if step_times(cache) else []
    lines += [f"  {step.describe()}" for step in step_times(cache)]
    lines += [f"layer profile (pipelines): {source}" for source in cache.profile_sources.values()]
    if any(step.scaled for step in step_times(cache)):
        lines.append(
            "  * scaled per sample from another batch size: measure that batch on the "
            "device for a firmer number"
        )
    return lines


def header_lines(config: DistbenchConfig, fitted: Fitted, models: Sequence[str] = ()) -> list[str]:
    """What the table's numbers are: which fit, epoch size, range (for the options' `models`),
    memory, cost."""
    hardware = config.hardware
    samples = config.samples_per_epoch
    whole = (
        "all of " if config.dataset.num_samples is None else "dataset.num_samples of "
    ) + config.dataset.key
    lines = [
        f"{config.network.label} on {config.dataset.key}, hardware "
        f"{hardware.name} ({hardware.world_size} workers); parameters: {fitted.source}",
        f"s/epoch: seconds per epoch of {samples} "
        f"{'sequences' if config.dataset.spec.tokens else 'images'} ({whole})",
    ]
    lines += range_lines(config, fitted, models)
    if hardware.device_memory_gb is None:
        lines.append("fits: unknown for all (hardware.device_memory_gb is not set)")
    if hardware.price_per_device_hour is not None:
        lines.append(
            f"cost: {hardware.price_per_device_hour:g} {currency(config)} per "
            f"device-hour (hardware.price_per_device_hour), for the devices in use"
        )
    return lines


def range_lines(config: DistbenchConfig, fitted: Fitted, models: Sequence[str]) -> list[str]:
    """How the range column is made, for the calibrated models (`cal yes`) and for the others
    (`cal no`), and the commands that calibrate these."""
    calibrated = [model for model in sorted(set(models)) if fitted.calibration(model).calibrated]
    lines = []
    if calibrated:
        errors = ", ".join(f"{model} {fitted.errors[model]:.1f}%" for model in calibrated)
        lines.append(
            f"range (cal yes): the step times' quartiles over the probe's batches, "
            f"widened by the fit's error on a network it was not fitted on ({errors})"
        )
    uncalibrated: dict[str, list[str]] = {}
    for model in sorted(set(models) - set(calibrated)):
        why = fitted.calibration(model).why
        uncalibrated.setdefault(why, []).append(model)
    for why, names in uncalibrated.items():
        lines.append(f"range (cal no: {', '.join(names)}): {why} (docs/recommend.md)")
    if uncalibrated:
        lines.append(
            f"to calibrate hardware={config.hardware.name}: {calibrate_commands(config.hardware)}"
        )
    return lines


def currency(config: DistbenchConfig) -> str:
    return config.hardware.currency or "(hardware.currency not set)"


def print_table(
    config: DistbenchConfig,
    options: Sequence[Option],
    skipped: Sequence[str],
    fitted: Fitted,
    sources: Sequence[str] = (),
    objective: str = "time",
    common: Sequence[str] = (),
    missing_step_time: str | None = None,
) -> None:
    models = [option.distribution for option in options]
    for line in [*header_lines(config, fitted, models), *sources]:
        print(line)
    if missing_step_time is not None:
        print(
            f"s/epoch: not predicted: no step time of {config.network.label} has been "
            f"measured on {config.hardware.device.value} yet; memory per worker is "
            f"predicted for every option (ranked: fits first, then least memory)"
        )
    priced = config.hardware.price_per_device_hour is not None
    print(
        f"ranked by {objective} (--objective {objective}); every option trains with: "
        f"python -m harness {shlex.join(common)} + its overrides"
    )
    cost_title = f"{config.hardware.currency or 'cost'}/epoch" if priced else ""
    print(
        f"{'#':>3}  {'configuration':<24}{'s/epoch':>10} {'range':>19}{'cal':>4}"
        f"{'MB/worker':>11}{'fits':>9}{cost_title:>12}  overrides"
    )
    for index, option in enumerate(options, 1):
        scaled = "*" if option.step_time_scaled_from is not None else " "
        timed = not math.isnan(option.seconds_per_epoch)
        spread = f"{option.seconds_low:.3f}-{option.seconds_high:.3f}" if timed else "-"
        fit = {True: "yes", False: "NO", None: "unknown"}[option.fits_memory]
        cost = (
            (
                f"{option.cost_per_epoch:>12.4f}"
                if option.cost_per_epoch is not None
                else f"{'-':>12}"
            )
            if priced
            else ""
        )
        seconds = f"{option.seconds_per_epoch:>10.3f}" if timed else f"{'-':>10}"
        calibrated = "yes" if option.calibrated else "no"
        print(
            f"{index:>3}  {option.label:<24}{seconds}{scaled}"
            f"{spread:>19}{calibrated:>4}{option.memory_mb:>11.0f}{fit:>9}{cost}  "
            f"{shlex.join(option.own_overrides)}"
        )
    for reason in skipped:
        print(f"     skipped {reason}")
    for line in verdict_lines(
        options, objective, missing_step_time, fitted.noise_percent, fitted.noise_text
    ):
        print(line)


def verdict_lines(
    options: Sequence[Option],
    objective: str,
    missing_step_time: str | None = None,
    noise_percent: float = 0.0,
    noise: str = "",
) -> list[str]:
    """The fastest and the cheapest where they differ, then the recommendation with its
    command (last). Without a step time on the device: which options fit, and the command
    that measures what ranks them. `noise` says which noise floor `noise_percent` is."""
    if missing_step_time is not None:
        fitting = [option.label for option in options if option.fits_memory is not False]
        return [
            f"fits in memory: {', '.join(fitting) if fitting else 'none of the options'}",
            f"not ranked by {objective}: {missing_step_time}",
        ]
    fastest, cheapest = best_by(options, "time"), best_by(options, "cost")
    lines = []
    if fastest is not None and cheapest is not None:
        lines.append(
            f"fastest and cheapest: {fastest.label}"
            if fastest is cheapest
            else f"fastest: {fastest.label}; cheapest: {cheapest.label}"
        )
    found = tie(options, objective, noise_percent)
    if found is not None:
        lines.append(found.line(noise))
    unordered = overlapping(options, objective)
    if unordered:
        ranges = ", ".join(
            f"{option.label} {option.seconds_per_epoch:.3f} s "
            f"({option.seconds_low:.3f}-{option.seconds_high:.3f})"
            for option in unordered[:SHOWN_APART]
        )
        if len(unordered) > SHOWN_APART:
            ranges += f" and {len(unordered) - SHOWN_APART} more"
        lines.append(
            f"not told apart: {ranges}: their likely ranges overlap, and the fastest is "
            f"uncalibrated; a fit of this hardware's cells (the calibration above) would "
            f"separate them, or time each for an epoch (its command, run.epochs=1)"
        )
    best = recommendation(options, objective, noise_percent)
    if best is None:
        lines.append("recommended: nothing fits in memory")
    else:
        sure = "" if best.calibrated else ", uncalibrated"
        if unordered and best is unordered[0]:
            sure += f"; not told apart from {len(unordered) - 1} other(s)"
        lines.append(
            f"recommended: {best.label} (by {objective}{sure}): python -m harness "
            f"{shlex.join(best.overrides)}"
        )
    return lines


# Options named on the "not told apart" line; the rest are counted (the table lists them).
SHOWN_APART = 4


def overlapping(options: Sequence[Option], objective: str) -> list[Option]:
    """The uncalibrated fastest option and those its likely range overlaps, among the options
    that may fit (harness.predict.ties.not_told_apart), by time only."""
    if objective != "time":
        return []
    fitting = [
        option
        for option in options
        if option.fits_memory is not False and not math.isnan(option.seconds_per_epoch)
    ]
    return cast(list[Option], not_told_apart(fitting))


def parser() -> argparse.ArgumentParser:
    """The command's flags (the rest of its arguments are config overrides): a function of
    its own so that tests can list them (tests/fuzz/test_commands.py fuzzes every flag)."""
    # A step timed within 5 %: the recommender's ranges are wider (the fit's held-out error,
    # or x3 uncalibrated); an analysis fits to its step times and keeps the probe's 2 %.
    parser = command_parser(
        "python -m harness.recommend", __doc__, probe_spread=RECOMMEND_PROBE_SPREAD
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument(
        "--fit",
        type=Path,
        default=None,
        help="fit.json of an analysis (default: the newest that fitted the hardware)",
    )
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="time",
        help="rank by seconds per epoch (time, the default) or by cost per "
        "epoch (cost: needs hardware.price_per_device_hour)",
    )
    parser.add_argument(
        "--plans",
        action="store_true",
        help="rank every plan (data x tensor x pipeline parallel, schedule, "
        "checkpointing, precision) of the hardware's GPUs from its data sheet: "
        "a decoder network on a GPU config with hardware.accelerator; measures nothing",
    )
    parser.add_argument(
        "--predict",
        action="store_true",
        help="print the step time and memory per GPU of the one plan the "
        "distribution's degrees describe (docs/planner.md), as JSON, ranking nothing",
    )
    parser.add_argument(
        "--top",
        type=_positive,
        default=10,
        help="plans --plans prints (default 10)",
    )
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="time the step times, layer profile and runtime memory again "
        "instead of using those kept in <run.output_dir>/facts/"
        "<hardware>.json for this machine's device",
    )
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count from 1 to 1,000,000")
    return value


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    return parser().parse_known_args(list(argv))


def _exists(fit: Path) -> bool:
    """Whether --fit names something; a name the file system cannot hold (longer than
    NAME_MAX) is bad input, not an error of the command."""
    try:
        return fit.exists()
    except OSError as err:
        raise ConfigError(
            f"--fit={fit} is invalid: {err.strerror or err}; allowed: a fit.json "
            f"of harness.analysis"
        ) from None


def _check_flags(flags: argparse.Namespace, config: DistbenchConfig) -> None:
    if flags.objective == "cost" and config.hardware.price_per_device_hour is None:
        raise ConfigError(
            f"--objective=cost is invalid: hardware={config.hardware.name} has "
            f"no hardware.price_per_device_hour; allowed: --objective=time, or "
            f"set hardware.price_per_device_hour (and hardware.currency)"
        )
    if flags.remeasure and flags.no_probe:
        raise ConfigError(
            "--remeasure is invalid with --no-probe: one times here, the other "
            "never does; allowed: one of them"
        )


def _check_plan_flags(flags: argparse.Namespace) -> None:
    """--plans and --predict price from data sheets: the flags that measure or fit are
    refused beside them."""
    if flags.plans and flags.predict:
        raise ConfigError(
            "--plans is invalid with --predict: one ranks every plan, the other prices one; "
            "allowed: one of them"
        )
    asked = "--plans" if flags.plans else "--predict"
    # --objective cost ranks as time does here (every plan uses all the GPUs): allowed.
    for flag, given in (
        ("--fit", flags.fit is not None),
        ("--remeasure", flags.remeasure),
        ("--no-probe", flags.no_probe),
    ):
        if given:
            raise ConfigError(
                f"{flag} is invalid with {asked}: plans are priced from the hardware's data "
                f"sheet, nothing is measured or fitted; allowed: {asked} without {flag}"
            )


@command
def main(argv: Sequence[str] | None = None) -> None:
    flags, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    if flags.plans or flags.predict:
        from harness.commands.plans import predict_one, rank_plans

        _check_plan_flags(flags)
        if flags.predict:
            predict_one(overrides)
        else:
            rank_plans(overrides, flags.top, flags.json)
        return
    # What fits is the recommender's answer: a job whose asked model does not fit is not refused.
    config = validate(compose_config(overrides), weights_must_fit=False)
    _check_flags(flags, config)
    output_root = Path(config.run.output_dir)

    def new_cache(remeasure_batches: frozenset[int] = frozenset()) -> FactsCache:
        return cache_for(
            flags.probe_batches,
            measurements=WorkerMeasurements(),
            probe=not flags.no_probe,
            facts_root=output_root,
            reuse=not flags.remeasure,
            probe_spread=flags.probe_spread,
            remeasure_batches=remeasure_batches,
        )

    cache = new_cache()
    started = time.perf_counter()
    # Everything is checked before anything is measured or written: every candidate, the fit.
    checked = check_candidates(config, overrides)
    fit_path = (
        flags.fit
        if flags.fit is not None
        else choose_fit(output_root, config.hardware.name, checked.models)
    )
    if fit_path is not None and not _exists(fit_path):
        raise ConfigError(f"--fit={fit_path} is invalid: no such file")
    fitted = Fitted.load(fit_path, config.hardware.name)
    # A damaged measured profile stops here, in one line, before minutes of probing would end
    # in every option skipped (harness.profiles.hardware.HardwareProfile.load).
    profile = profile_for(config.hardware, output_root)
    check_writable_dir("run.output_dir", config.run.output_dir)  # facts measured here go there
    options, skipped = rank(config, fitted, cache, output_root, overrides, flags.objective, checked)
    contradicted = contradicting_steps(cache)
    unsettled = [pair for pair in contradicted if not _timed_again(cache, pair)]
    if unsettled and probes_here(config, cache):
        # One of each pair was timed while the machine was disturbed: both are timed again,
        # and every option predicted again from them.
        print(f"{contradiction_line(cache, unsettled)}: timing both again", file=sys.stderr)
        first = cache
        cache = new_cache(frozenset(cache.sources[key].batch for pair in unsettled for key in pair))
        options, skipped = rank(
            config, fitted, cache, output_root, overrides, flags.objective, checked
        )
        cache.measured[:0] = first.measured
        contradicted = contradicting_steps(cache)
    keep_contradicting(config, cache, contradicted)  # said beside each, here and later
    elapsed = time.perf_counter() - started
    links = {
        "links": link_line(config.hardware, profile),
        "links_since_fit": links_since_fit(fitted, profile),
        "machine_since_fit": machine_since_fit(
            fitted, [(f"batch {step.batch}", step) for step in step_times(cache)], config.hardware
        ),
    }
    if flags.json:
        print_json(config, options, skipped, fitted, cache, flags.objective, elapsed, links)
    else:
        print_table(
            config,
            options,
            skipped,
            fitted,
            [*source_lines(cache), *(line for line in links.values() if line)],
            flags.objective,
            common_overrides(config, overrides),
            cache.missing_step_time,
        )
    # Not on stdout, which a later run repeats exactly.
    measured = ", ".join(cache.measured) or "nothing (all facts were kept from earlier runs)"
    print(f"measured here: {measured}; prediction took {elapsed:.1f} s", file=sys.stderr)


def print_json(
    config: DistbenchConfig,
    options: Sequence[Option],
    skipped: Sequence[str],
    fitted: Fitted,
    cache: FactsCache,
    objective: str,
    elapsed: float,
    links: dict[str, str | None],
) -> None:
    """The table's answer as JSON; `links`: where the links priced come from (`links`, None
    with one worker) and whether they differ from the fit's (`links_since_fit`, else None),
    and whether the step times' machine differs from the fit's (`machine_since_fit`)."""
    best, fastest, cheapest = (
        recommendation(options, objective, fitted.noise_percent),
        best_by(options, "time"),
        best_by(options, "cost"),
    )
    found = tie(options, objective, fitted.noise_percent)
    json.dump(
        {
            "dataset": config.dataset.key,
            "network": config.network.label,
            "hardware": config.hardware.name,
            "parameters": fitted.source,
            "fit": fitted.summary(),
            "model_errors_percent": fitted.errors,
            "calibrated_models": sorted({o.distribution for o in options if o.calibrated}),
            "uncalibrated_models": sorted({o.distribution for o in options if not o.calibrated}),
            "raw_error_factor": RAW_ERROR_FACTOR,
            "calibrate": calibrate_commands(config.hardware)
            if any(not o.calibrated for o in options)
            else None,
            "images_per_epoch": config.samples_per_epoch,
            "objective": objective,
            "price_per_device_hour": config.hardware.price_per_device_hour,
            "currency": config.hardware.currency,
            "recommended": best.label if best and cache.missing_step_time is None else None,
            "missing_step_time": cache.missing_step_time,
            "tie": None
            if found is None
            else {
                "tied": [option.label for option in found.tied],
                "chosen": found.chosen.label,
                "decided_by": found.decided_by,
                "margin_percent": found.margin_percent,
            },
            # the uncalibrated fastest and the options its likely range overlaps
            "not_told_apart": [option.label for option in overlapping(options, objective)],
            "noise_floor_percent": fitted.noise_percent,
            "noise_floor_kind": fitted.noise_kind,
            "fastest": fastest.label if fastest else None,
            "cheapest": cheapest.label if cheapest else None,
            "prediction_seconds": elapsed,
            "measured_here": cache.measured,
            "options": [asdict(o) for o in options],
            "skipped": skipped,
            "step_times": [{**asdict(step), "scaled": step.scaled} for step in step_times(cache)],
            "layer_profile": sorted(set(cache.profile_sources.values())),
            **links,
        },
        sys.stdout,
        indent=2,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
