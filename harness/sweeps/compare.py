"""Two selections cell by cell: seconds per epoch B/A, its 95 % interval, a verdict on whether
B differs from A beyond noise (`verdict`), and the cells that only one side measured.

Cells are matched on their config axes (`MATCH_ON`, or the columns the user names), not on
the cell key runs carry (`distbench.cell_key`): that key hashes the whole config, the MLflow
experiment's name included, so the same cell measured under two experiments, the common case
of a comparison, would never match. A planned pipeline matches on the plan it trained.

Where a side holds several runs of one cell (an experiment that re-ran it), the latest that
ended `ok` stands for it, else its latest run; the command says how many were set aside.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from harness.config.schema import ConfigError
from harness.distributions.registry import setting_names
from harness.measure.spread import student_t_975

# A cell's grid position: what the sweep files vary. `balance` is not in it: a profile-
# balanced pipeline may split its layers differently from one measurement to the next.
MATCH_ON = [
    "dataset",
    "network",
    "distribution",
    "hardware",
    "nodes",
    "workers",
    "batch_size",
    *(name for name in setting_names() if name != "balance"),
    "num_samples",
]
SIDES = ("a", "b")
_MEASURES = [
    "status",
    "seconds_per_epoch",
    "seconds_per_epoch_ci95_low",
    "seconds_per_epoch_ci95_high",
    "seconds_per_epoch_repeat_std",
    "repeats",
    "steady",  # 0: measured while the machine was unsteady (NaN: recorded before it was judged)
    "run_id",
]


@dataclass(frozen=True)
class Comparison:
    table: pd.DataFrame  # one row per cell: key, a_* and b_* measures, ratio and its interval
    on: list[str]
    set_aside: dict[str, int]  # per side, runs of a cell that another run of it stands for


def compare(a: pd.DataFrame, b: pd.DataFrame, on: Sequence[str] | None = None) -> Comparison:
    """A and B (cells tables, `harness.sweeps.table.cells_table`) matched on `on`."""
    on = check_on(on or MATCH_ON)
    sides, set_aside = {}, {}
    for name, cells in zip(SIDES, (a, b)):
        latest = _one_run_per_cell(cells, on)
        set_aside[name] = len(cells) - len(latest)
        sides[name] = latest[on + _MEASURES].rename(columns={m: f"{name}_{m}" for m in _MEASURES})
    table = sides["a"].merge(sides["b"], on=on, how="outer", indicator="side")
    table["side"] = (
        table["side"]
        .map({"both": "both", "left_only": "only A", "right_only": "only B"})
        .astype(str)
    )
    intervals = [
        ratio_interval(*row)
        for row in zip(
            table["a_seconds_per_epoch"],
            table["a_seconds_per_epoch_repeat_std"],
            table["a_repeats"],
            table["b_seconds_per_epoch"],
            table["b_seconds_per_epoch_repeat_std"],
            table["b_repeats"],
            table["a_status"],
            table["b_status"],
        )
    ]
    table["ratio"] = [ratio for ratio, _, _ in intervals]
    table["ratio_ci95_low"] = [low for _, low, _ in intervals]
    table["ratio_ci95_high"] = [high for _, _, high in intervals]
    table["verdict"] = [
        verdict(*row)
        for row in zip(
            table["ratio"],
            table["ratio_ci95_low"],
            table["ratio_ci95_high"],
            table["a_repeats"],
            table["b_repeats"],
        )
    ]
    order = {"both": 0, "only A": 1, "only B": 2}
    table = table.sort_values(
        ["side", *on], key=lambda c: c.map(order) if c.name == "side" else c, na_position="first"
    ).reset_index(drop=True)
    return Comparison(table, on, set_aside)


def check_on(on: Sequence[str]) -> list[str]:
    """`on`, if every name in it is one of MATCH_ON's; else ConfigError."""
    unknown = [column for column in on if column not in MATCH_ON]
    if unknown or not on:
        raise ConfigError(
            f"--on={','.join(on)} is invalid: unknown {', '.join(unknown)}; "
            f"allowed: one or more of {', '.join(MATCH_ON)}"
        )
    return list(on)


def _one_run_per_cell(cells: pd.DataFrame, on: list[str]) -> pd.DataFrame:
    """The run that stands for each cell: the latest `ok` one, else the latest."""
    ranked = cells.assign(_ok=cells["status"] == "ok").sort_values(["_ok", "started"])
    for column in on + _MEASURES:  # a side where no cell finished has no such metric column
        if column not in ranked.columns:
            ranked[column] = math.nan
    for column in on:  # one dtype on both sides: a model's setting is all None on a side
        ranked[column] = ranked[column].astype(object).where(ranked[column].notna(), None)
    return ranked.drop_duplicates(on, keep="last").drop(columns="_ok")


def ratio_interval(
    a_mean: float,
    a_std: float,
    a_n: float,
    b_mean: float,
    b_std: float,
    b_n: float,
    a_status: object = "ok",
    b_status: object = "ok",
) -> tuple[float, float, float]:
    """B/A of two cells' mean seconds per epoch, with a 95 % interval where both have 2 or
    more repeats (else NaN bounds); all NaN unless both ended `ok`.

    The interval is the delta method's on the log scale: log(B/A) has standard error
    sqrt(cv_a^2 + cv_b^2), cv being a mean's standard error over the mean (std / sqrt(n) /
    mean), with Student's t at the Welch-Satterthwaite degrees of freedom; back on the ratio
    scale it is asymmetric, as a ratio's should be."""
    nan = math.nan
    if a_status != "ok" or b_status != "ok" or not (a_mean > 0 and b_mean > 0):
        return nan, nan, nan
    ratio = b_mean / a_mean
    if not (a_n >= 2 and b_n >= 2) or math.isnan(a_std) or math.isnan(b_std):
        return ratio, nan, nan
    var_a = (a_std / a_mean) ** 2 / a_n
    var_b = (b_std / b_mean) ** 2 / b_n
    if var_a + var_b == 0:
        return ratio, ratio, ratio
    freedom = (var_a + var_b) ** 2 / (var_a**2 / (a_n - 1) + var_b**2 / (b_n - 1))
    half = student_t_975(freedom) * math.sqrt(var_a + var_b)
    return ratio, ratio * math.exp(-half), ratio * math.exp(half)


# A row's verdict on B/A (`verdict`): its 95 % interval lies below 1, above 1, or contains it;
# or no interval could be taken, because a side ran one repeat and so measured no spread.
FASTER = "B faster (interval excludes 1)"
SLOWER = "B slower (interval excludes 1)"
NOISE = "no difference beyond noise"
NO_VERDICT = "no verdict"


def verdict(ratio: float, low: float, high: float, a_repeats: float, b_repeats: float) -> str:
    """Whether B/A differs from 1 by more than its 95 % interval; '' where there is no ratio
    (a side lacks the cell, or it did not end ok)."""
    if math.isnan(ratio):
        return ""
    single = [side for side, n in (("A", a_repeats), ("B", b_repeats)) if not n >= 2]
    if single:
        return f"{NO_VERDICT}: 1 repeat in {' and '.join(single)}, no spread"
    if math.isnan(low) or math.isnan(high):
        return f"{NO_VERDICT}: no spread recorded"
    if high < 1:
        return FASTER
    if low > 1:
        return SLOWER
    return NOISE
