"""When the best options cannot be told apart, and which one to take then.

Two options' predicted seconds per epoch differ by less than the predictions can be trusted to:
each model's error on a network its fit never saw (the fit's leave-one-network-out MAPE) and
the measurement noise floor of the cells it was fitted on (harness.analysis.noise). Ranking by
the predicted time alone would then pick one at random, so the recommender says that the best
options are tied and breaks the tie by what is certain: fewer workers, then less memory per
worker, then lower cost, and says which decided.

Memory is predicted too, and with an error of its own (the memory model's on an unseen network,
fit.json's `accuracy[].memory_mape`: 5-17 % per model on `local_2cpu`), so less memory decides only
where it is less beyond the two models' memory errors: before, PipeDream `1-1` was taken over DDP
for a predicted 4 % less memory per worker, within those errors, and ran 7-12 % slower
(docs/benchmarks/2026-11-30-probe-in-rounds.md, "The probe measured in rounds; less memory decides a
tie only beyond its error (2026-11-30)").

Only calibrated options can tie: an uncalibrated one carries the raw equations' error (a factor
of 3 either way), within which every option would tie with every other; it is ranked by its
prediction and marked uncalibrated instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Ranked(Protocol):
    """What the tie rule reads of an option (harness.recommend.Option)."""

    @property
    def label(self) -> str: ...
    @property
    def workers(self) -> int: ...
    @property
    def seconds_per_epoch(self) -> float: ...
    @property
    def memory_mb(self) -> float: ...
    @property
    def cost_per_epoch(self) -> float | None: ...
    @property
    def calibrated(self) -> bool: ...
    @property
    def error_percent(self) -> float | None: ...
    @property
    def memory_error_percent(self) -> float | None: ...


def tie_margin_percent(a: Ranked, b: Ranked, noise_percent: float) -> float:
    """How far apart (percent of the faster) two options may be predicted and still be tied:
    the two models' errors and the noise of each measurement, added in quadrature (independent
    errors)."""
    errors = [option.error_percent or 0.0 for option in (a, b)]
    return math.sqrt(errors[0] ** 2 + errors[1] ** 2 + 2 * noise_percent**2)


@dataclass(frozen=True)
class Tie:
    """The options tied with the fastest (the fastest first), the one chosen and why."""

    tied: list[Ranked]
    chosen: Ranked
    decided_by: str  # FEWER_WORKERS, LESS_MEMORY, LOWER_COST, or the shortest predicted time
    margin_percent: float  # the widest margin that tied an option with the fastest

    def line(self, noise: str = "") -> str:
        """The tie in one line; `noise` says which noise floor it took (e.g. "2.3 % between
        runs (12 cells)")."""
        times = ", ".join(
            f"{option.label} {option.seconds_per_epoch:.3f} s" for option in self.tied
        )
        floor = f"; noise {noise}" if noise else ""
        return (
            f"tied within the models' error and the measurement noise (up to "
            f"{self.margin_percent:.1f} %{floor}): {times}; taking {self.chosen.label}, the "
            f"one with {self.decided_by}{self._memory_figures()}"
        )

    def _memory_figures(self) -> str:
        """Where less memory decided: by how much, against which margin (the numbers)."""
        if self.decided_by != LESS_MEMORY:
            return ""
        chosen = self.chosen
        others = [
            option
            for option in self.tied
            if option is not chosen and option.workers == chosen.workers
        ]
        if not others:
            return ""
        next_least = min(others, key=lambda option: option.memory_mb)
        less = (1 - chosen.memory_mb / next_least.memory_mb) * 100
        return (
            f" ({chosen.memory_mb:.0f} MB against {next_least.label}'s "
            f"{next_least.memory_mb:.0f} MB, {less:.0f} % less; the memory models' error "
            f"{memory_margin_percent(chosen, next_least):.1f} %)"
        )


def tie_with_fastest(options: Sequence[Ranked], noise_percent: float) -> Tie | None:
    """The tie among the fastest options that may fit (`options` best first, by time), or None
    when the fastest stands apart or is uncalibrated."""
    if not options or not options[0].calibrated:
        return None
    fastest = options[0]
    tied, widest = [fastest], 0.0
    for option in options[1:]:
        if not option.calibrated:
            continue
        margin = tie_margin_percent(fastest, option, noise_percent)
        gap = (option.seconds_per_epoch / fastest.seconds_per_epoch - 1) * 100
        if gap <= margin:
            tied.append(option)
            widest = max(widest, margin)
    if len(tied) < 2:
        return None
    chosen, decided_by = break_tie(tied)
    return Tie(tied, chosen, decided_by, widest)


class Ranged(Ranked, Protocol):
    """An option with the likely range of its prediction (harness.recommend.Option)."""

    @property
    def seconds_low(self) -> float: ...
    @property
    def seconds_high(self) -> float: ...


def not_told_apart(options: Sequence[Ranged]) -> list[Ranged]:
    """Where the fastest option (`options` best first, by time) is uncalibrated: it and every
    option whose likely range overlaps its own (empty when none does, or the fastest is
    calibrated: `tie_with_fastest` judges those). An uncalibrated range is the raw equations'
    error, a factor of 3 either way, so before a fit the best options usually overlap: the
    prediction cannot order them, and a bare "recommended" would pass a guess for a ranking."""
    ranged = [
        option
        for option in options
        if math.isfinite(option.seconds_low) and math.isfinite(option.seconds_high)
    ]
    if not ranged or ranged[0].calibrated:
        return []
    fastest = ranged[0]
    overlapping = [
        option
        for option in ranged[1:]
        if option.seconds_low <= fastest.seconds_high and fastest.seconds_low <= option.seconds_high
    ]
    return [fastest, *overlapping] if overlapping else []


# What broke a tie, as the recommender says it ("taking X, the one with ...").
FEWER_WORKERS, LESS_MEMORY, LOWER_COST = "fewer workers", "less memory per worker", "lower cost"


def memory_margin_percent(a: Ranked, b: Ranked) -> float:
    """How far apart (percent of the smaller) two options' predicted memory per worker may be
    and still count as equal: their memory models' errors added in quadrature (0 where
    neither was measured: then only equal memory is equal)."""
    errors = [option.memory_error_percent or 0.0 for option in (a, b)]
    return math.hypot(*errors)


def break_tie(tied: Sequence[Ranked]) -> tuple[Ranked, str]:
    """The tied option with the fewest workers, then the least memory per worker beyond the
    memory models' error, then the lowest cost (where priced), then the fastest prediction;
    and which of them decided."""
    remaining = list(tied)
    for reason, keep in (
        (FEWER_WORKERS, _fewest_workers),
        (LESS_MEMORY, _least_memory),
        (LOWER_COST, _lowest_cost),
    ):
        kept = keep(remaining)
        if len(kept) < len(remaining) and kept:
            if len(kept) == 1:
                return kept[0], reason
            remaining = kept
    return remaining[0], "the shortest predicted time (the tie-breaks left them equal)"


def _fewest_workers(options: Sequence[Ranked]) -> list[Ranked]:
    fewest = min(option.workers for option in options)
    return [option for option in options if option.workers == fewest]


def _least_memory(options: Sequence[Ranked]) -> list[Ranked]:
    """The options whose memory is the least's, within the memory models' error (and half a
    MB: a rounding's worth)."""
    least = min(options, key=lambda option: option.memory_mb)
    return [
        option
        for option in options
        if option.memory_mb - least.memory_mb
        <= max(least.memory_mb * memory_margin_percent(option, least) / 100, 0.5)
    ]


def _lowest_cost(options: Sequence[Ranked]) -> list[Ranked]:
    costs = [
        math.inf if option.cost_per_epoch is None else option.cost_per_epoch for option in options
    ]
    return [option for option, cost in zip(options, costs) if cost == min(costs)]
