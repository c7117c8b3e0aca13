"""The probe's figures measured in rounds: each figure's median across them, and their spread.

`python -m harness.probe` measures every figure (a link's ping-pong, an allreduce, FSDP's
collectives after compute) once per round, one round after the other. On this 2-core VM four
back-to-back probes of one round read a 1 MB ping-pong at 1.0-1.6 ms, an allreduce of 1 MB at
0.8-3.0 ms and an 8-byte all-gather after compute at 3.8-4.4 ms, and one probe, started as a
calibration's sweep ended, read the 8-byte ping-pong at 1620 us (84 us half an hour later) and the
8-byte collectives after compute at 13 ms (4 ms): a disturbance of seconds meets one round, and the
median across three rounds does not follow it (docs/benchmarks/2026-11-30-probe-in-rounds.md, "The
probe measured in rounds; less memory decides a tie only beyond its error (2026-11-30)"). The
rounds' spread is the probe's own noise, kept in the profile beside its figures (pyperf's runs, for
a probe).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

# The facts key of the rounds: how many, each figure's values per round, their spread.
ROUNDS_FACT = "probe_rounds"


def median_across_rounds(rounds: Sequence[Sequence[float]]) -> list[float]:
    """Per size, the median of its values across the rounds (each round a value per size)."""
    if not rounds or len({len(values) for values in rounds}) != 1:
        raise ValueError(f"rounds need one value per size each: {rounds}")
    return [statistics.median(values) for values in zip(*rounds)]


def spread_across_rounds(rounds: Sequence[Sequence[float]]) -> float | None:
    """How far the rounds disagree on a figure: per size (max - min) / median across the
    rounds, the median of that over the sizes (one size whose times are noisy at any moment,
    such as a 64 KB ping-pong, does not speak for the figure). None for a single round."""
    if len(rounds) < 2:
        return None
    per_size = [
        (max(values) - min(values)) / statistics.median(values)
        for values in zip(*rounds)
        if statistics.median(values) > 0
    ]
    return statistics.median(per_size) if per_size else None


def rounds_fact(figures: Mapping[str, Sequence[Sequence[float]]]) -> dict[str, object]:
    """What a profile keeps of its rounds: their count, each figure's values per round (seconds
    per size, or a worker's value) and its spread (absent for a single round)."""
    count = len(next(iter(figures.values()), ()))
    spreads = {name: spread_across_rounds(rounds) for name, rounds in figures.items()}
    return {
        "rounds": count,
        "spread": {name: value for name, value in spreads.items() if value is not None},
        "values": {name: [list(values) for values in rounds] for name, rounds in figures.items()},
    }


def spread_line(fact: Mapping[str, object]) -> str:
    """One line on the rounds' agreement for the probe's summary."""
    count = fact.get("rounds", 1)
    spread = fact.get("spread") or {}
    assert isinstance(spread, dict)
    if not spread:
        return f"measured in {count} round: its spread is not known (probe.rounds=3 measures it)"
    worst = max(spread, key=lambda name: spread[name])
    listed = ", ".join(f"{name} {value:.0%}" for name, value in spread.items())
    return (
        f"measured in {count} rounds, each figure the median across them; the rounds' "
        f"spread ((max - min) / median, the median over sizes): {listed} "
        f"(largest: {worst})"
    )


def largest_spread(fact: Mapping[str, object] | None) -> float | None:
    """The largest spread of any figure of a profile's rounds (None: not measured)."""
    spread = (fact or {}).get("spread") or {}
    assert isinstance(spread, dict)
    return max(spread.values(), default=None)
