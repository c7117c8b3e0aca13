"""Speedup and efficiency against workers, per distribution model, one panel per workload.

Speedup is the baseline's seconds per epoch over the cell's, as in the analysis report
(`harness.analysis.report.plot_speedup`); efficiency is the speedup per worker. A workload is
a dataset and network at one epoch size on one kind of device. Its baseline is its fastest
1-worker cell (the sequential cell, as a rule). A workload without a 1-worker cell has no
such time: each model's curve then starts from its own fewest-worker cell, counted as ideal
(speedup = its worker count, efficiency 1), and the panel says so.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a cluster node
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend
import pandas as pd  # noqa: E402

from harness.costs.partition import parse_stages  # noqa: E402

WORKLOAD = ["dataset", "network", "num_samples", "device"]
PANELS_PER_ROW = 5  # workloads side by side; more go to further rows
POINTS = ["workload", "series", "workers", "seconds_per_epoch", "speedup", "efficiency", "run_id"]
NO_SINGLE_WORKER = (
    "no 1-worker cell: each model's fewest-worker cell counts as ideal (speedup = its workers)"
)


@dataclass(frozen=True)
class Scaling:
    points: pd.DataFrame  # workload, series, workers, seconds_per_epoch, speedup, efficiency
    baselines: dict[str, str]  # workload label -> what its speedups are relative to
    set_aside: int  # ok cells not plotted: a faster cell of the same series and workers is


def series_label(row: pd.Series) -> str:
    """A model's curve: its name, batch size and the settings that give a different curve:
    GPipe's micro-batches; whether a PipeDream plan is straight (one worker per stage, as
    `distribution=pipedream_straight`) or replicates a stage (a plan is spelled per worker
    count, so it cannot name a curve)."""
    label = f"{row['distribution']} b{row['batch_size']}"
    if pd.notna(row.get("micro_batches")):
        label += f" mb{row['micro_batches']}"
    stages = row.get("stages")
    if isinstance(stages, str) and stages:
        label += " straight" if set(parse_stages(stages)) == {1} else " replicated"
    return label


def scaling(cells: pd.DataFrame) -> Scaling:
    """The speedup and efficiency of every `ok` cell of `cells` (a cells table)."""
    empty = Scaling(pd.DataFrame(columns=POINTS), {}, 0)
    if not {"seconds_per_epoch", "workers"} <= set(cells.columns):
        return empty  # no cell finished, or none has its axes
    ok = cells[cells["status"] == "ok"].dropna(subset=["seconds_per_epoch", "workers"])
    if ok.empty:
        return empty
    ok = ok.assign(series=ok.apply(series_label, axis=1))
    best = ok.sort_values("seconds_per_epoch").drop_duplicates([*WORKLOAD, "series", "workers"])
    frames, baselines = [], {}
    for workload, group in best.groupby(WORKLOAD, sort=True):
        label = workload_label(workload)
        speedup, baselines[label] = _speedup(group)
        frames.append(
            group.assign(workload=label, speedup=speedup, efficiency=speedup / group["workers"])
        )
    points = pd.concat(frames).sort_values([*WORKLOAD, "series", "workers"])[POINTS]
    return Scaling(points.reset_index(drop=True), baselines, len(ok) - len(best))


def _speedup(group: pd.DataFrame) -> tuple[pd.Series, str]:
    """One workload's speedups (`group` sorted fastest first), and what they are relative to."""
    single = group[group["workers"] == 1]
    if len(single):
        base = single.iloc[0]
        return (
            base["seconds_per_epoch"] / group["seconds_per_epoch"],
            f"{base['series']}, 1 worker, {base['seconds_per_epoch']:.3g} s/epoch",
        )
    fewest = group.loc[group.groupby("series")["workers"].idxmin()].set_index("series")
    ideal = (fewest["workers"] * fewest["seconds_per_epoch"]).astype(float)
    return group["series"].map(ideal) / group["seconds_per_epoch"], NO_SINGLE_WORKER


def workload_label(workload: tuple) -> str:
    dataset, network, samples, device = workload
    return f"{network} / {dataset}, {samples} samples/epoch, {device}"


def plot(scaling_: Scaling, path: Path, *, title: str) -> str:
    """A panel pair per workload, speedup above efficiency, against workers, a line per model
    (up to PANELS_PER_ROW pairs side by side); written to `path` with a title that names every
    panel and curve in the file's metadata. Returns that title."""
    workloads = list(scaling_.baselines)
    columns = max(1, min(len(workloads), PANELS_PER_ROW))
    blocks = max(1, math.ceil(len(workloads) / columns))
    figure, axes = plt.subplots(
        2 * blocks, columns, squeeze=False, figsize=(4.2 * columns, 6.4 * blocks)
    )
    for index, workload in enumerate(workloads):
        block, column = divmod(index, columns)
        _plot_workload(scaling_, workload, axes[2 * block][column], axes[2 * block + 1][column])
    for index in range(len(workloads), blocks * columns):  # empty places of the last row
        block, column = divmod(index, columns)
        axes[2 * block][column].set_visible(False)
        axes[2 * block + 1][column].set_visible(False)
    curves = "; ".join(
        f"{w}: "
        + ", ".join(sorted(scaling_.points[scaling_.points["workload"] == w]["series"].unique()))
        for w in workloads
    )
    full_title = f"{title}: speedup and efficiency against workers ({curves})"
    figure.suptitle("\n".join(textwrap.wrap(title, width=int(60 * columns))), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata={"Title": full_title})
    plt.close(figure)
    return full_title


def _plot_workload(scaling_: Scaling, workload: str, top: plt.Axes, bottom: plt.Axes) -> None:
    points = scaling_.points[scaling_.points["workload"] == workload]
    from_baseline = scaling_.baselines[workload] != NO_SINGLE_WORKER
    for series, curve in points.groupby("series", sort=True):
        workers, speedup = list(curve["workers"]), list(curve["speedup"])
        if from_baseline and workers[0] != 1:  # the curve starts at the 1-worker time
            workers, speedup = [1, *workers], [1.0, *speedup]
        (line,) = top.plot(workers, speedup, "o-", label=series)
        bottom.plot(
            workers,
            [s / w for s, w in zip(speedup, workers)],
            "o-",
            color=line.get_color(),
            label=series,
        )
    workers = sorted({1, *points["workers"]} if from_baseline else set(points["workers"]))
    top.plot(workers, workers, "--", color="grey", linewidth=0.8, label="ideal")
    bottom.axhline(1.0, linestyle="--", color="grey", linewidth=0.8)
    top.set_title(f"{workload}\nbaseline: {scaling_.baselines[workload]}", fontsize=8)
    for axis, name in ((top, "speedup"), (bottom, "efficiency (speedup / workers)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(workers, [str(w) for w in workers])
        axis.set_xlabel("workers")
        axis.set_ylabel(name)
    bottom.set_ylim(bottom=0)
    top.legend(fontsize=7)


def check_plot_suffix(path: Path, allowed: Sequence[str] = (".png", ".svg", ".pdf")) -> None:
    from harness.config.schema import ConfigError

    if path.suffix.lower() not in allowed:
        raise ConfigError(
            f"--out={path} is invalid: allowed: a file name ending in {', '.join(allowed)}"
        )
