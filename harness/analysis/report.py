"""The analysis report: Markdown tables and PNG plots in one folder.

- `speedup.png`: measured (bars) and predicted (dots) speedup over the sequential cell of the
  same workload (the thesis' Figures 3.1/3.2);
- `predicted_vs_measured.png`: one panel per model, raw equations and held-out fits against
  the measurement (Figures 4.1, 5.1, 6.2);
- `memory.png`: peak memory per worker, predicted against measured;
- `report.md`: accuracy per model, every cell, the recommendations against the measured fastest
  (Tables 8.1, 8.2) and the fitted parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a cluster node
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

from harness.analysis.fit import Accuracy, CellPrediction, percent_error  # noqa: E402
from harness.analysis.recommendations import WorkloadVerdict  # noqa: E402
from harness.config import DistbenchConfig, DistributionName  # noqa: E402
from harness.partition import StagePlan  # noqa: E402
from harness.predict.cell import ModelParams  # noqa: E402


def setting_label(config: DistbenchConfig, plan: StagePlan | None = None) -> str:
    """A configuration in a few characters: the model and its main settings (a PipeDream
    cell's plan is `plan`, else its configured `stages`)."""
    distribution, workers = config.distribution, config.world_size
    name = distribution.name
    if name is DistributionName.sequential:
        return "sequential"
    if name is DistributionName.gpipe:
        return f"gpipe x{workers} mb{config.micro_batches}"
    if name is DistributionName.pipedream:
        stages = plan.stage_string() if plan is not None else distribution.stages
        return f"pipedream {stages or 'planned'}"
    return f"{name.value} x{workers}"


def workload_label(workload: tuple[str, str]) -> str:
    return f"{workload[1]} / {workload[0]}"


def write_report(folder: Path, *, experiment: str, uri: str,
                 by_cell: Sequence[CellPrediction], by_workload: Sequence[CellPrediction],
                 table: Sequence[Accuracy], verdicts: Sequence[WorkloadVerdict],
                 params: dict[str, ModelParams], runtime_mb: float,
                 probe_seconds: float) -> list[Path]:
    """Write the plots and report.md into `folder`; return the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    plots = [plot_speedup(folder / "speedup.png", by_workload),
             plot_predicted_vs_measured(folder / "predicted_vs_measured.png", by_cell),
             plot_memory(folder / "memory.png", by_cell)]
    lines = [
        f"# distbench analysis: experiment `{experiment}`", "",
        f"{len(by_cell)} measured cells from `{uri}`. Errors are on held-out cells: a cell's "
        "fitted prediction uses parameters fitted on the other cells of its model only "
        "(leave one cell out); recommendations use parameters fitted without any cell of the "
        f"workload (leave one workload out). Measuring the facts took {probe_seconds:.1f} s.",
        "", "## Accuracy per distribution model (percent error of seconds per epoch)", "",
        "| model | cells | raw MAPE | raw worst | fitted MAPE | fitted worst |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {a.model} | {a.cells} | {a.raw_mape:.1f} | {a.raw_worst:.1f} | "
          f"{a.fitted_mape:.1f} | {a.fitted_worst:.1f} |" for a in table),
        "", "## Recommendations against the measured fastest", "",
        "| workload | configurations | measured fastest | recommended | correct | time lost % "
        "| raw equations recommend | raw time lost % |",
        "|---|---:|---|---|---|---:|---|---:|",
        *(f"| {workload_label(v.workload)} | {v.candidates} | "
          f"{setting_label(v.fastest.cell.config)} ({v.fastest.measured_s:.3f} s) | "
          f"{setting_label(v.recommended.cell.config)} | {'yes' if v.correct else 'no'} | "
          f"{v.time_lost_percent:.1f} | {setting_label(v.raw_recommended.cell.config)} | "
          f"{v.raw_time_lost_percent:.1f} |" for v in verdicts),
        "", f"Correct: {sum(v.correct for v in verdicts)} of {len(verdicts)} workloads.",
        "", "## Every cell", "",
        "| workload | configuration | hardware | measured s | raw s | raw err % | fitted s "
        "| fitted err % | fitted from | peak MB | predicted MB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_cell_row(p) for p in by_cell),
        "", "## Fitted parameters (all cells of each model; what the recommender uses)", "",
        "| model | compute scale | communication scale | overhead per step (ms) |",
        "|---|---:|---:|---:|",
        *(f"| {model} | {p.compute_scale:.3f} | {p.communication_scale:.3f} | "
          f"{p.step_overhead_s * 1000:.2f} |" for model, p in params.items()),
        "", f"Memory: a worker's runtime share (framework and process, fitted) is "
        f"{runtime_mb:.0f} MB.", "",
        *(f"![{plot.stem}]({plot.name})" for plot in plots), "",
    ]
    report = folder / "report.md"
    report.write_text("\n".join(lines))
    return [report, *plots]


def _cell_row(p: CellPrediction) -> str:
    config = p.cell.config
    return (f"| {workload_label(p.cell.workload)} | {setting_label(config)} | "
            f"{config.hardware.name} | {p.measured_s:.3f} | {p.raw_s:.3f} | "
            f"{percent_error(p.raw_s, p.measured_s):.1f} | {p.fitted_s:.3f} | "
            f"{percent_error(p.fitted_s, p.measured_s):.1f} | {p.fitted_from} | "
            f"{p.cell.peak_memory_mb:.0f} | {p.memory_fitted_mb:.0f} |")


def plot_speedup(path: Path, predictions: Sequence[CellPrediction]) -> Path:
    workloads = sorted({p.cell.workload for p in predictions})
    figure, axes = _panels(len(workloads), width=4.0, height=3.5)
    for axis, workload in zip(axes, workloads):
        cells = [p for p in predictions if p.cell.workload == workload]
        base = [p for p in cells if p.cell.model == "sequential"]
        axis.set_title(workload_label(workload), fontsize=9)
        if not base:
            axis.text(0.5, 0.5, "no sequential cell", ha="center", transform=axis.transAxes)
            continue
        measured_base, predicted_base = base[0].measured_s, base[0].fitted_s
        labels = [setting_label(p.cell.config) for p in cells]
        axis.bar(labels, [measured_base / p.measured_s for p in cells], label="measured")
        axis.plot(labels, [predicted_base / p.fitted_s for p in cells], "o", color="black",
                  label="predicted (held out)")
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_ylabel("speedup over sequential")
        axis.tick_params(axis="x", labelrotation=45, labelsize=7)
    axes[0].legend(fontsize=7)
    return _save(figure, path)


def plot_predicted_vs_measured(path: Path, predictions: Sequence[CellPrediction]) -> Path:
    models = sorted({p.cell.model for p in predictions})
    figure, axes = _panels(len(models), width=3.2, height=3.4)
    for axis, model in zip(axes, models):
        rows = [p for p in predictions if p.cell.model == model]
        measured = [p.measured_s for p in rows]
        axis.plot(measured, [p.raw_s for p in rows], "x", label="raw equation")
        axis.plot(measured, [p.fitted_s for p in rows], "o", mfc="none", label="fitted, held out")
        top = max(measured + [p.raw_s for p in rows] + [p.fitted_s for p in rows]) * 1.1
        axis.plot([0, top], [0, top], color="grey", linewidth=0.8)
        axis.set_xlim(0, top)
        axis.set_ylim(0, top)
        axis.set_title(model, fontsize=9)
        axis.set_xlabel("measured s/epoch")
        axis.set_ylabel("predicted s/epoch")
    axes[0].legend(fontsize=7)
    return _save(figure, path)


def plot_memory(path: Path, predictions: Sequence[CellPrediction]) -> Path:
    figure, axis = plt.subplots(figsize=(max(4.0, 0.5 * len(predictions) + 2), 3.5))
    labels = [f"{p.cell.workload[1]} {setting_label(p.cell.config)}" for p in predictions]
    positions = range(len(predictions))
    axis.bar([x - 0.2 for x in positions], [p.cell.peak_memory_mb for p in predictions],
             width=0.4, label="measured peak")
    axis.bar([x + 0.2 for x in positions], [p.memory_fitted_mb for p in predictions],
             width=0.4, label="predicted (held out)")
    axis.set_xticks(list(positions), labels, rotation=60, fontsize=6, ha="right")
    axis.set_ylabel("MB per worker (largest)")
    axis.legend(fontsize=7)
    return _save(figure, path)


def _panels(count: int, *, width: float, height: float) -> tuple[plt.Figure, list[plt.Axes]]:
    """A row of `count` plots (at least one), each `width` x `height` inches."""
    count = max(1, count)
    figure, axes = plt.subplots(1, count, squeeze=False, figsize=(width * count, height))
    return figure, list(axes[0])


def _save(figure: plt.Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
