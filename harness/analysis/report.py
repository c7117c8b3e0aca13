"""The analysis report: Markdown tables and PNG plots in one folder.

- `speedup.png`: measured (bars) and predicted (dots) speedup over the sequential cell of the
  same workload (the thesis' Figures 3.1/3.2);
- `predicted_vs_measured.png`: one panel per model, raw equations and held-out fits against
  the measurement (Figures 4.1, 5.1, 6.2);
- `residuals.png`: every cell's signed error per model, by network (network held out);
- `memory.png`: peak memory per worker, predicted against measured;
- `report.md`: accuracy per model, every cell, the recommendations against the measured fastest
  (Tables 8.1, 8.2) and the fitted parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from harness.analysis.fit import (
    Accuracy,
    CellPrediction,
    signed_error,
)
from harness.analysis.noise import NoiseFloor
from harness.analysis.recommendations import MemoryVerdict, WorkloadVerdict, tie_summary
from harness.distributions.registry import baseline
from harness.predict.labels import setting_label
from harness.predict.parameters import PARAMETERS
from harness.profiles.steps import StepTime

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from harness.analysis.step_from_cells import StepFromCells


def workload_label(workload: tuple[str, str]) -> str:
    return f"{workload[1]} / {workload[0]}"


def _tied(verdict: WorkloadVerdict) -> str:
    """The options the tie rule held tied (the measured fastest in bold), with the margin."""
    if verdict.tie is None:
        return "-"
    labels = [
        f"**{setting_label(p.cell.config)}**"
        if p is verdict.fastest
        else setting_label(p.cell.config)
        for p in verdict.tied_predictions
    ]
    return f"{', '.join(labels)} ({verdict.tie.margin_percent:.1f} %)"


def _on_hardware(verdict: WorkloadVerdict, verdicts: Sequence[WorkloadVerdict]) -> str:
    """' on <hardware>' where the verdicts span several hardware, else nothing."""
    return f" on {verdict.hardware}" if len({v.hardware for v in verdicts}) > 1 else ""


def _family_section(table: Sequence[Accuracy]) -> list[str]:
    """Leave one family out, where the cells hold both image networks and language models."""
    rows = [a for a in table if a.family_mape == a.family_mape]
    if not rows:
        return []
    return [
        "",
        "## Accuracy per distribution model, family held out",
        "",
        "Every cell predicted from parameters fitted on the other family's cells only "
        "(image networks predicting language models, and the reverse); per-cell residuals "
        "are in fit.json (`residuals`).",
        "",
        "| model | MAPE | worst | bias |",
        "|---|---:|---:|---:|",
        *(
            f"| {a.model} | {a.family_mape:.1f} | {a.family_worst:.1f} | {a.family_bias:+.1f} |"
            for a in rows
        ),
    ]


def _step_time_section(
    step_times: Sequence[tuple[str, StepTime]], speed: Sequence[str] = ()
) -> list[str]:
    """Where each step time the predictions stand on came from: a step time scaled per sample
    from another batch (`*`) is a guess the cells of that batch are judged against."""
    if not step_times:
        return []
    lines = [
        "",
        "## Step times the predictions used (a step of the whole network, one worker)",
        "",
        *(f"- {workload}, {step.describe()}" for workload, step in step_times),
    ]
    if any(step.scaled for _, step in step_times):
        lines += [
            "",
            "`*`: scaled per sample from another batch size; the cells stepping at "
            "that batch are judged against a guess. Measure it (the analysis without "
            "`--no-probe`, on the device, right after the cells) for a firmer number.",
        ]
    if speed:  # how the machine's speed while the cells ran moved or unsettles them
        lines += ["", *(f"- {line[0].upper()}{line[1:]}." for line in speed)]
    return lines


def _noise(floor: NoiseFloor | None) -> str:
    return f"{floor.percent:.1f}" if floor is not None and floor.measured else "-"


def write_report(
    folder: Path,
    *,
    experiment: str,
    uri: str,
    by_cell: Sequence[CellPrediction],
    by_network: Sequence[CellPrediction],
    table: Sequence[Accuracy],
    verdicts: Sequence[WorkloadVerdict],
    params: dict[str, dict[str, float]],
    runtime_mb: dict[str, float],
    probe_seconds: float,
    fit_verdicts: Sequence[MemoryVerdict] = (),
    single_network: str | None = None,
    noise: dict[str, NoiseFloor] | None = None,
    overall_noise: NoiseFloor | None = None,
    step_times: Sequence[tuple[str, StepTime]] = (),
    speed: Sequence[str] = (),
    links: Sequence[str] = (),
    at_cells_step: StepFromCells | None = None,
) -> list[Path]:
    """Write the plots and report.md into `folder`; return the files written.
    `single_network`: why leave one network out could not be measured (`fit.
    leave_one_network_out_note`), said first; its columns then read n/a. `noise`: each
    model's measurement noise floor (harness.analysis.noise), beside its errors.
    `step_times`: the sequential step times the predictions used, each with its workload;
    `links`: where each hardware's link speeds came from (`analysis.link_lines`);
    `at_cells_step`: the models judged with each network's step time from its own one-worker
    cells (`analysis.step_from_cells`), None where the grid has none."""
    noise = noise or {}
    folder.mkdir(parents=True, exist_ok=True)
    plots = [
        plot_speedup(folder / "speedup.png", by_network),
        plot_predicted_vs_measured(folder / "predicted_vs_measured.png", by_network),
        plot_residuals(folder / "residuals.png", by_network),
        plot_memory(folder / "memory.png", by_network),
    ]
    networks = sorted({p.cell.network for p in by_cell})
    lines = [
        f"# distbench analysis: experiment `{experiment}`",
        "",
        f"{len(by_cell)} measured cells of {len(networks)} networks ({', '.join(networks)}) "
        f"from `{uri}`. Every error below is on cells held out of the fit. **Leave one network "
        "out** (first): every cell of a network is predicted from parameters fitted on the "
        "other networks' cells only, as for a network never measured; that is what a "
        "recommendation relies on. Leave one cell out is given beside it. Measuring the facts "
        f"took {probe_seconds:.1f} s.",
        *_single_network_section(single_network),
        "",
        "## Accuracy per distribution model, network held out",
        "",
        "Percent error of seconds per epoch (bias: mean signed error, + = predicted slower "
        "than measured) and of peak memory per worker; noise: the measurement noise floor, "
        "the typical difference between two measurements of the same cell (an error below it "
        "cannot be told from noise; '-': no cell of the model was measured twice).",
        *(["", f"Over the grid, {overall_noise.text()}."] if overall_noise else []),
        "",
        "| model | cells | MAPE | worst | bias | noise | memory MAPE | leave one cell out MAPE "
        "| raw equations MAPE | raw worst |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {a.model} | {a.cells} | {_percent(a.network_mape)} | "
            f"{_percent(a.network_worst)} | {_percent(a.network_bias, '+.1f')} | "
            f"{_noise(noise.get(a.model))} | "
            f"{_percent(a.memory_mape)} | {a.cell_mape:.1f} | "
            f"{a.raw_mape:.1f} | {a.raw_worst:.1f} |"
            for a in table
        ),
        *_family_section(table),
        *_step_from_cells_section(at_cells_step),
        "",
        "## Recommendations, network held out, against the measured fastest",
        "",
        "| workload | configurations | measured fastest | recommended | right | time lost % "
        "| tied within error and noise | the tie rule names | right | time lost % "
        "| raw equations recommend | raw time lost % |",
        "|---|---:|---|---|---|---:|---|---|---|---:|---|---:|",
        *(
            f"| {workload_label(v.workload)}{_on_hardware(v, verdicts)} | {v.candidates} | "
            f"{setting_label(v.fastest.cell.config)} ({v.fastest.measured_s:.3f} s) | "
            f"{setting_label(v.recommended.cell.config)} | {'yes' if v.correct else 'no'} | "
            f"{v.time_lost_percent:.1f} | {_tied(v)} | {setting_label(v.named.cell.config)} | "
            f"{'yes' if v.named_correct else 'no'} | {v.named_time_lost_percent:.1f} | "
            f"{setting_label(v.raw_recommended.cell.config)} | "
            f"{v.raw_time_lost_percent:.1f} |"
            for v in verdicts
        ),
        "",
        f"Right: {sum(v.correct for v in verdicts)} of {len(verdicts)} workloads"
        f"{'; ' + ties if (ties := tie_summary(verdicts)) else ''}.",
        *_fit_section(fit_verdicts),
        "",
        "## Fitted parameters (all cells of each hardware; what the recommender uses)",
        "",
        "| hardware | parameter | value | prior | meaning |",
        "|---|---|---:|---:|---|",
        *(
            f"| {hardware} | {name} | {value:.3f} | {PARAMETERS[name].prior:g} | "
            f"{PARAMETERS[name].meaning} |"
            for hardware, values in params.items()
            for name, value in values.items()
        ),
        "",
        *(
            f"Memory on {hardware}: what the memory model misses, learnt from the cells (the "
            f"median gap; the runtime share itself is measured) is {mb:.0f} MB per worker."
            for hardware, mb in runtime_mb.items()
        ),
        *_step_time_section(step_times, speed),
        *(
            ["", "## Links the predictions used", "", *(f"- {line}" for line in links)]
            if links
            else []
        ),
        "",
        "## Every cell, network held out",
        "",
        "Measured: the median of a cell's steady runs, where it was measured in several "
        "(`runs`: a cell measured once carries the machine's drift of that minute).",
        "",
        "| workload | configuration | hardware | measured s | runs | raw s | raw err % "
        "| predicted s | err % | compute s | allreduce s | transfer s | peak MB | predicted MB "
        "| mem err % |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_cell_row(p) for p in by_network),
        "",
        *(f"![{plot.stem}]({plot.name})" for plot in plots),
        "",
    ]
    report = folder / "report.md"
    report.write_text("\n".join(lines))
    return [report, *plots]


def _step_from_cells_section(judged: StepFromCells | None) -> list[str]:
    """The models judged again with each network's step time from its own one-worker cells:
    the gap to the table above is the probe's drift from the cells, not the models'."""
    if judged is None:
        return []
    return [
        "",
        "## Accuracy with each network's step time from its own one-worker cells",
        "",
        f"The same fit and hold-out, {judged.cells} of {judged.of} cells predicted from "
        "the step time their network's one-worker cells measured (minutes from its other "
        "cells; scaled by the reference kernels) instead of the probe's: what is left is "
        "the models' own error, and the gap to the table above is the step time's. Not "
        "judged here: the one-worker model (its cells are its step time) and cells at a "
        "batch no one-worker cell ran (a pipeline's micro-batches). Recommendations right "
        f"for {judged.right} of {len(judged.verdicts)} workloads (worst time lost "
        f"{judged.worst_lost:.1f} %).",
        "",
        "| model | cells | MAPE | worst | bias |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {row.model} | {row.cells} | {row.network_mape:.1f} | "
            f"{row.network_worst:.1f} | {row.network_bias:+.1f} |"
            for row in judged.table
        ),
    ]


def _percent(value: float, spec: str = ".1f") -> str:
    """A percentage, or n/a where it could not be measured (NaN)."""
    return "n/a" if value != value else format(value, spec)


def _single_network_section(note: str | None) -> list[str]:
    """Said first where some hardware's cells hold one network: no error below is a
    leave-one-network-out error there."""
    if note is None:
        return []
    return [
        "",
        f"**{note[0].upper()}{note[1:]}.** The network-held-out columns read n/a "
        "for those cells, no recommendation is judged on them, and `harness.recommend` "
        "counts this fit's error as unknown (uncalibrated ranges). Measure a second "
        "network on the same hardware to measure it.",
    ]


def _fit_section(verdicts: Sequence[MemoryVerdict]) -> list[str]:
    """Fit / no fit predicted against what happened, for cells with a memory limit."""
    if not verdicts:
        return []
    return [
        "",
        "## Fits in memory? Predicted (network held out) against what happened",
        "",
        "| workload | configuration | hardware | limit MB | predicted MB | predicted | measured "
        "| right |",
        "|---|---|---|---:|---:|---|---|---|",
        *(
            f"| {workload_label(v.cell.workload)} | {setting_label(v.cell.config)} | "
            f"{v.cell.config.hardware.name} | {v.limit_mb:.0f} | {v.predicted_mb:.0f} | "
            f"{'fits' if v.predicted_fit else 'does not fit'} | "
            f"{'ran' if v.cell.fitted_in_memory else 'oom'} | {'yes' if v.right else 'no'} |"
            for v in verdicts
        ),
        "",
        f"Right: {sum(v.right for v in verdicts)} of {len(verdicts)} cells.",
    ]


def _cell_row(p: CellPrediction) -> str:
    config, terms = p.cell.config, p.terms
    return (
        f"| {workload_label(p.cell.workload)} | {setting_label(config)} | "
        f"{config.hardware.name} | {p.measured_s:.3f} | {p.cell.runs} | {p.raw_s:.3f} | "
        f"{signed_error(p.raw_s, p.measured_s):+.1f} | {p.fitted_s:.3f} | "
        f"{signed_error(p.fitted_s, p.measured_s):+.1f} | {terms.compute_s:.3f} | "
        f"{terms.allreduce_s:.3f} | {terms.transfer_s:.3f} | "
        f"{p.cell.peak_memory_mb:.0f} | {p.memory_fitted_mb:.0f} | "
        f"{signed_error(p.memory_fitted_mb, p.cell.peak_memory_mb):+.1f} |"
    )


def plot_residuals(path: Path, predictions: Sequence[CellPrediction]) -> Path:
    """Signed error of every cell (network held out), one panel per model, by network: a
    model that misses one kind of network shows it as a column off the zero line."""
    models = sorted({p.cell.model for p in predictions})
    networks = sorted({p.cell.network for p in predictions})
    figure, axes = _panels(len(models), width=3.0, height=3.2)
    for axis, model in zip(axes, models):
        rows = [p for p in predictions if p.cell.model == model]
        for p in rows:
            marker = "o" if p.cell.config.dataset.name.value == "mnist" else "s"
            axis.plot(
                networks.index(p.cell.network),
                signed_error(p.fitted_s, p.measured_s),
                marker,
                mfc="none",
                color="black",
            )
        axis.axhline(0.0, color="grey", linewidth=0.8)
        for bound in (-5, 5):
            axis.axhline(bound, color="grey", linewidth=0.5, linestyle=":")
        axis.set_xticks(range(len(networks)), networks, rotation=45, fontsize=7)
        axis.set_title(model, fontsize=9)
        axis.set_ylabel("predicted - measured, %")
    axes[0].plot([], [], "o", mfc="none", color="black", label="mnist")
    axes[0].plot([], [], "s", mfc="none", color="black", label="other datasets")
    axes[0].legend(fontsize=7)
    return _save(figure, path)


def plot_speedup(path: Path, predictions: Sequence[CellPrediction]) -> Path:
    workloads = sorted({p.cell.workload for p in predictions})
    reference = baseline().name
    figure, axes = _panels(len(workloads), width=4.0, height=3.5)
    for axis, workload in zip(axes, workloads):
        cells = [p for p in predictions if p.cell.workload == workload]
        base = [p for p in cells if p.cell.model == reference]
        axis.set_title(workload_label(workload), fontsize=9)
        if not base:
            axis.text(0.5, 0.5, f"no {reference} cell", ha="center", transform=axis.transAxes)
            continue
        measured_base, predicted_base = base[0].measured_s, base[0].fitted_s
        labels = [setting_label(p.cell.config) for p in cells]
        axis.bar(labels, [measured_base / p.measured_s for p in cells], label="measured")
        axis.plot(
            labels,
            [predicted_base / p.fitted_s for p in cells],
            "o",
            color="black",
            label="predicted (network held out)",
        )
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_ylabel(f"speedup over {reference}")
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
        axis.plot(
            measured, [p.fitted_s for p in rows], "o", mfc="none", label="fitted, network held out"
        )
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
    figure, axis = _pyplot().subplots(figsize=(max(4.0, 0.5 * len(predictions) + 2), 3.5))
    labels = [f"{p.cell.workload[1]} {setting_label(p.cell.config)}" for p in predictions]
    positions = range(len(predictions))
    axis.bar(
        [x - 0.2 for x in positions],
        [p.cell.peak_memory_mb for p in predictions],
        width=0.4,
        label="measured peak",
    )
    axis.bar(
        [x + 0.2 for x in positions],
        [p.memory_fitted_mb for p in predictions],
        width=0.4,
        label="predicted (network held out)",
    )
    axis.set_xticks(list(positions), labels, rotation=60, fontsize=6, ha="right")
    axis.set_ylabel("MB per worker (largest)")
    axis.legend(fontsize=7)
    return _save(figure, path)


def _pyplot() -> ModuleType:
    """matplotlib's pyplot, drawing to files only (no display on a cluster node); imported
    when a plot is drawn, so that the commands' --help and bad input do not wait for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(count: int, *, width: float, height: float) -> tuple[Figure, list[Axes]]:
    """A row of `count` plots (at least one), each `width` x `height` inches."""
    count = max(1, count)
    figure, axes = _pyplot().subplots(1, count, squeeze=False, figsize=(width * count, height))
    return figure, list(axes[0])


def _save(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    _pyplot().close(figure)
    return path
