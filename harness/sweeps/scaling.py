"""Speedup and efficiency against workers, per distribution model, one panel per workload.

Speedup is the baseline's seconds per epoch over the cell's, as in the analysis report
(`harness.analysis.report.plot_speedup`); efficiency is the speedup per worker. A workload is
a dataset and network at one epoch size on one kind of device. Its baseline is its fastest
1-worker cell (the sequential cell, as a rule). A workload without a 1-worker cell has no
such time: each model's curve then starts from its own fewest-worker cell, counted as ideal
(speedup = its worker count, efficiency 1), and the panel says so.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a cluster node
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend
import pandas as pd  # noqa: E402

WORKLOAD = ["dataset", "network", "num_samples", "device"]
NO_SINGLE_WORKER = ("no 1-worker cell: each model's fewest-worker cell counts as ideal "
                    "(speedup = its workers)")


@dataclass(frozen=True)
class Scaling:
    points: pd.DataFrame  # workload, series, workers, seconds_per_epoch, speedup, efficiency
    baselines: dict[str, str]  # workload label -> what its speedups are relative to
    set_aside: int  # ok cells not plotted: a faster cell of the same series and workers is


def series_label(row: pd.Series) -> str:
    """A model's curve: its name, batch size and the settings that give a different curve."""
    label = f"{row['distribution']} b{row['batch_size']}"
    if pd.notna(row.get("micro_batches")):
        label += f" mb{row['micro_batches']}"
    return label


def scaling(cells: pd.DataFrame) -> Scaling:
    """The speedup and efficiency of every `ok` cell of `cells` (a cells table)."""
    ok = cells[cells["status"] == "ok"].dropna(subset=["seconds_per_epoch", "workers"])
    ok = ok.assign(series=ok.apply(series_label, axis=1))
    best = ok.sort_values("seconds_per_epoch").drop_duplicates([*WORKLOAD, "series", "workers"])
    frames, baselines = [], {}
    for workload, group in best.groupby(WORKLOAD, sort=True):
        group = group.assign(workload=workload_label(workload))
        single = group[group["workers"] == 1]
        if len(single):
            base = single.iloc[0]  # the fastest: `best` is sorted by time
            group["speedup"] = base["seconds_per_epoch"] / group["seconds_per_epoch"]
            baselines[workload_label(workload)] = (f"{base['series']}, 1 worker, "
                                   f"{base['seconds_per_epoch']:.3g} s/epoch")
        else:
            fewest = group.loc[group.groupby("series")["workers"].idxmin()].set_index("series")
            ideal = (fewest["workers"] * fewest["seconds_per_epoch"]).astype(float)
            group["speedup"] = group["series"].map(ideal) / group["seconds_per_epoch"]
            baselines[workload_label(workload)] = NO_SINGLE_WORKER
        group["efficiency"] = group["speedup"] / group["workers"]
        frames.append(group)
    columns = ["workload", "series", "workers", "seconds_per_epoch", "speedup", "efficiency",
               "run_id"]
    if not frames:
        return Scaling(pd.DataFrame(columns=columns), {}, len(ok) - len(best))
    points = pd.concat(frames).sort_values([*WORKLOAD, "series", "workers"])[columns]
    return Scaling(points.reset_index(drop=True), baselines, len(ok) - len(best))


def workload_label(workload: tuple) -> str:
    dataset, network, samples, device = workload
    return f"{network} / {dataset}, {samples} samples/epoch, {device}"


def plot(scaling_: Scaling, path: Path, *, title: str) -> str:
    """Speedup (top) and efficiency (bottom) against workers, a column per workload, a line
    per model; written to `path` with `title` (which names every panel and curve) in the
    file's metadata. Returns that title."""
    workloads = list(scaling_.baselines)
    columns = max(1, len(workloads))
    figure, axes = plt.subplots(2, columns, squeeze=False, figsize=(4.4 * columns, 7.0))
    for column, workload in enumerate(workloads):
        points = scaling_.points[scaling_.points["workload"] == workload]
        top, bottom = axes[0][column], axes[1][column]
        from_baseline = scaling_.baselines[workload] != NO_SINGLE_WORKER
        for series, curve in points.groupby("series", sort=True):
            workers, speedup = list(curve["workers"]), list(curve["speedup"])
            if from_baseline and workers[0] != 1:  # the curve starts at the 1-worker time
                workers, speedup = [1, *workers], [1.0, *speedup]
            line, = top.plot(workers, speedup, "o-", label=series)
            bottom.plot(workers, [s / w for s, w in zip(speedup, workers)], "o-",
                        color=line.get_color(), label=series)
        workers = sorted({1, *points["workers"]} if from_baseline else set(points["workers"]))
        top.plot(workers, workers, "--", color="grey", linewidth=0.8, label="ideal")
        bottom.axhline(1.0, linestyle="--", color="grey", linewidth=0.8)
        top.set_title(f"{workload}\nbaseline: {scaling_.baselines[workload]}",
                      fontsize=8)
        for axis, name in ((top, "speedup"), (bottom, "efficiency (speedup / workers)")):
            axis.set_xscale("log", base=2)
            axis.set_xticks(workers, [str(w) for w in workers])
            axis.set_xlabel("workers")
            axis.set_ylabel(name)
        bottom.set_ylim(bottom=0)
        top.legend(fontsize=7)
    curves = "; ".join(f"{w}: " + ", ".join(sorted(
        scaling_.points[scaling_.points["workload"] == w]["series"].unique())) for w in workloads)
    full_title = f"{title}: speedup and efficiency against workers ({curves})"
    figure.suptitle("\n".join(textwrap.wrap(title, width=int(70 * columns))), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata={"Title": full_title})
    plt.close(figure)
    return full_title


def check_plot_suffix(path: Path, allowed: Sequence[str] = (".png", ".svg", ".pdf")) -> None:
    from harness.config import ConfigError

    if path.suffix.lower() not in allowed:
        raise ConfigError(f"--out={path} is invalid: allowed: a file name ending in "
                          f"{', '.join(allowed)}")
