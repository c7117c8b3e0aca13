"""`python -m harness.sweeps`: export, compare and scaling on a real SQLite MLflow store that
holds real tiny cells (a 2-cell sweep, sequential and DDP on two CPU workers, and the sequential
cell measured again under another experiment), measured once for the module."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image
from scipy import stats

from harness.commands.compose import compose_config
from harness.measure.steadiness import UNSTEADY_FOOTNOTE, UNSTEADY_MARK
from harness.records.cell import check_cell
from harness.records.eventlog import log_file_name
from harness.sweeps.cli import comparison_text, main
from harness.sweeps.compare import FASTER, NOISE, SLOWER, compare
from harness.sweeps.scaling import NO_SINGLE_WORKER, scaling
from harness.worker.run import run_cell
from tests.helpers import run_module
from tests.unit.harness.sweeps.test_mlperf import BENCHMARK, run_minutes

# Small enough to train in seconds; three repeats give every cell a confidence interval and
# an MLPerf score (the summarizer's olympic mean drops the best and the worst run).
TINY = [
    "dataset=mnist",
    "network=mobilenetv2",
    "hardware=local_2cpu",
    "distribution.batch_size=8",
    "dataset.num_samples=16",
    "run.epochs=1",
    "run.repeats=3",
    "run.warmup_batches=1",
    "run.progress=false",
]
SERIES = ["epoch_seconds", "repeat_seconds_per_epoch", "repeat_seed"]


@dataclass(frozen=True)
class Store:
    root: Path  # run.output_dir: the SQLite store is in it
    sweep_dir: Path  # sweep A's directory (experiment sweeps_a)
    client: MlflowClient
    sweep_output: str  # what sweep A printed (stdout, then stderr)

    @property
    def override(self) -> str:
        return f"run.output_dir={self.root}"

    def cell_runs(self, experiment: str) -> dict[str, object]:
        """distribution -> the experiment's cell run, read straight from the store."""
        found = self.client.get_experiment_by_name(experiment)
        runs = self.client.search_runs([found.experiment_id], "tags.status = 'ok'")
        return {run.data.params["distribution.name"]: run for run in runs}

    def repeats(self, run: object) -> list[float]:
        history = self.client.get_metric_history(run.info.run_id, "repeat_seconds_per_epoch")
        return [m.value for m in sorted(history, key=lambda m: m.step)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """Sweep A (experiment sweeps_a): sequential and DDP; then the sequential cell alone (the
    cheapest: no worker processes) under experiment sweeps_b, measured in this process as
    `python -m harness` measures a cell of one worker (an interpreter of its own would import
    torch and MLflow anew). The autouse environment fixture is per test: set the same here."""
    root = tmp_path_factory.mktemp("sweeps") / "outputs"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DISTBENCH_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "dataset-cache"))
        env.delenv("MLFLOW_TRACKING_URI", raising=False)
        env.delenv("DISTBENCH_PARENT_RUN_ID", raising=False)
        common = [*TINY, f"run.output_dir={root}"]
        sweep = run_module(
            "harness",
            ["-m", "distribution=sequential,ddp", *common, "tracking.experiment=sweeps_a"],
            cwd=root.parent,
        )
        assert sweep.returncode == 0, sweep.stderr[-3000:]
        again = run_cell(
            check_cell(
                compose_config(["distribution=sequential", *common, "tracking.experiment=sweeps_b"])
            ),
            output_dir=root / "runs" / "sweeps_b",
        )
        assert again["status"] == "ok", again["error"]
        (sweep_dir,) = (root / "sweeps" / "sweeps_a").iterdir()
        yield Store(
            root,
            sweep_dir,
            MlflowClient(f"sqlite:///{root / 'mlflow.db'}"),
            sweep.stdout + sweep.stderr,
        )


def test_export_writes_one_row_per_cell_with_its_axes_status_and_every_metric(
    store: Store, tmp_path: Path
) -> None:
    out = tmp_path / "a.csv"
    done = run_module(
        "harness.sweeps",
        ["export", str(store.sweep_dir), "--out", str(out), store.override],
        cwd=store.root.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"{out}: 2 cells (2 ok)")
    table = pd.read_csv(out)
    runs = store.cell_runs("sweeps_a")
    assert sorted(table["run_id"]) == sorted(run.info.run_id for run in runs.values())
    (parent,) = {run.data.tags["mlflow.parentRunId"] for run in runs.values()}
    assert set(table["parent_run_id"]) == {parent}
    assert set(table["sweep"]) == {store.client.get_run(parent).info.run_name}
    rows = table.set_index("distribution")
    assert rows.loc["sequential", "workers"] == 1 and rows.loc["ddp", "workers"] == 2
    assert rows.loc["ddp", "global_batch_size"] == 16
    for column in (
        "dataset",
        "network",
        "hardware",
        "nodes",
        "batch_size",
        "num_samples",
        "status",
        "started",
        "ended",
        "cell_key",
        "output_dir",
    ):
        assert column in table.columns
    for name, run in runs.items():
        scalars = (
            set(run.data.metrics)
            - set(SERIES)
            - {key for key in run.data.metrics if key.startswith("epoch_")}
        )
        for key in scalars:  # every metric the run holds, with the run's value
            assert rows.loc[name, key] == pytest.approx(run.data.metrics[key]), key
        assert rows.loc[name, "status"] == "ok"
    # The same sweep by its parent run id and by its run name; the two experiments to Parquet,
    # where the per-repeat series keep every value.
    by_id, by_name = tmp_path / "id.csv", tmp_path / "name.csv"
    main(["export", parent, "--out", str(by_id), store.override])
    main(
        [
            "export",
            store.client.get_run(parent).info.run_name,
            "--out",
            str(by_name),
            store.override,
        ]
    )
    assert (
        sorted(pd.read_csv(by_id)["run_id"])
        == sorted(pd.read_csv(by_name)["run_id"])
        == sorted(table["run_id"])
    )
    both = tmp_path / "both.parquet"
    main(["export", "sweeps_a", "sweeps_b", "--out", str(both), store.override])
    parquet = pd.read_parquet(both)
    assert sorted(parquet["experiment"]) == ["sweeps_a", "sweeps_a", "sweeps_b"]
    again = parquet[parquet["experiment"] == "sweeps_b"].iloc[0]
    assert pd.isna(again["sweep"])  # a single run, no sweep
    assert list(again["repeat_seconds_per_epoch"]) == pytest.approx(
        store.repeats(store.cell_runs("sweeps_b")["sequential"])
    )


def test_compare_gives_the_ratio_and_its_interval_computed_from_the_store(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "compare.csv"
    main(["compare", str(store.sweep_dir), "sweeps_b", "--out", str(out), store.override])
    printed = capsys.readouterr().out
    table = pd.read_csv(out).set_index("distribution")
    a, b = store.cell_runs("sweeps_a")["sequential"], store.cell_runs("sweeps_b")["sequential"]
    # The cell keys differ (they hash the experiment's name): matched on the config axes.
    assert a.data.tags["distbench.cell_key"] != b.data.tags["distbench.cell_key"]
    both = table.loc["sequential"]
    assert both["side"] == "both" and (both["a_run_id"], both["b_run_id"]) == (
        a.info.run_id,
        b.info.run_id,
    )
    ratio = b.data.metrics["seconds_per_epoch"] / a.data.metrics["seconds_per_epoch"]
    assert both["ratio"] == pytest.approx(ratio)
    # By hand from the repeats' values: the log ratio's standard error, Welch's freedom.
    low, high = _ratio_interval(store.repeats(a), store.repeats(b))
    assert (both["ratio_ci95_low"], both["ratio_ci95_high"]) == (
        pytest.approx(low),
        pytest.approx(high),
    )
    assert low < ratio < high
    assert both["a_seconds_per_epoch_ci95_low"] == pytest.approx(
        a.data.metrics["seconds_per_epoch_ci95_low"]
    )
    ddp = table.loc["ddp"]
    assert ddp["side"] == "only A" and math.isnan(ddp["ratio"])
    assert f"{ratio:.3f} [{low:.3f}, {high:.3f}]" in printed
    assert "1 cells on both sides, 1 only in A, 0 only in B" in printed
    # The verdict: B/A differs from 1 only where its 95 % interval excludes 1.
    verdict = FASTER if high < 1 else SLOWER if low > 1 else NOISE
    assert both["verdict"] == verdict and pd.isna(ddp["verdict"])
    (row,) = [line for line in printed.splitlines() if line.split()[:1] == ["both"]]
    assert row.endswith(verdict)
    assert (
        f"verdict: B faster in {int(verdict == FASTER)} of 1 cells, slower in "
        f"{int(verdict == SLOWER)}, no difference beyond noise in {int(verdict == NOISE)} "
        f"(where B/A's 95 % interval excludes 1 or not)"
    ) in printed.splitlines()


def test_compare_gives_no_verdict_where_a_side_ran_one_repeat(store: Store, tmp_path: Path) -> None:
    """A cell of one repeat measured no spread: no interval, no verdict, and the output says
    so, instead of treating its time as exact. (Sweep A's sequential cell as a cell of one
    repeat records it: `repeats` 1, no spread over repeats, no interval.)"""
    a = pd.read_csv(exported(store, tmp_path, store.sweep_dir.name))
    once = a["distribution"] == "sequential"
    a.loc[once, "repeats"] = 1.0
    a.loc[
        once,
        [
            "seconds_per_epoch_repeat_std",
            "seconds_per_epoch_ci95_low",
            "seconds_per_epoch_ci95_high",
        ],
    ] = math.nan
    b = pd.read_csv(exported(store, tmp_path, "sweeps_b"))
    result = compare(a, b)
    row = result.table.set_index("distribution").loc["sequential"]
    assert row["verdict"] == "no verdict: 1 repeat in A, no spread"
    assert not math.isnan(row["ratio"]) and math.isnan(row["ratio_ci95_low"])
    text = comparison_text(result)
    assert "no verdict: 1 repeat in A, no spread" in text
    assert text.splitlines()[-1] == (
        "verdict: B faster in 0 of 1 cells, slower in 0, no difference beyond noise in 0 "
        "(where B/A's 95 % interval excludes 1 or not); 1 without a verdict: a side ran 1 "
        "repeat and measured no spread (run.repeats=3 or more measures one)"
    )


def test_the_sweep_prints_each_cells_spread_over_its_repeats(store: Store) -> None:
    """Sweep A's cells ran 3 repeats: the record's line gives their spread and interval, and
    the summary table's std is the spread over the repeats."""
    for run in store.cell_runs("sweeps_a").values():
        metrics = run.data.metrics
        std = metrics["seconds_per_epoch_repeat_std"]
        workers = int(metrics["world_size"])
        rule = f", the slowest of {workers} workers'" if workers > 1 else ""
        assert (
            f"{run.info.run_name}: {metrics['seconds_per_epoch']:.3f} s/epoch{rule} (3 repeats: "
            f"std {std:.3f}, 95 % interval [{metrics['seconds_per_epoch_ci95_low']:.3f}, "
            f"{metrics['seconds_per_epoch_ci95_high']:.3f}])"
        ) in store.sweep_output
        (row,) = [
            line
            for line in store.sweep_output.splitlines()
            if re.match(rf" +\d+  {re.escape(run.info.run_name)} ", line)
        ]
        assert row.split()[row.split().index("ok") + 2] == f"{std:.3f}"
    assert "1 repeat, no spread measured" not in store.sweep_output  # no footnote needed


def _ratio_interval(a: list[float], b: list[float]) -> tuple[float, float]:
    ratio = statistics.fmean(b) / statistics.fmean(a)
    cv2 = [statistics.variance(x) / len(x) / statistics.fmean(x) ** 2 for x in (a, b)]
    freedom = sum(cv2) ** 2 / sum(v**2 / (len(x) - 1) for v, x in zip(cv2, (a, b)))
    half = stats.t.ppf(0.975, freedom) * math.sqrt(sum(cv2))
    return ratio * math.exp(-half), ratio * math.exp(half)


def test_scaling_plots_speedup_and_efficiency_against_workers(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "scaling.png"
    main(["scaling", "sweeps_a", "--out", str(plot), store.override])
    printed = capsys.readouterr().out
    runs = store.cell_runs("sweeps_a")
    speedup = (
        runs["sequential"].data.metrics["seconds_per_epoch"]
        / runs["ddp"].data.metrics["seconds_per_epoch"]
    )
    assert "baseline: sequential b8, 1 worker" in printed
    (ddp_line,) = [line for line in printed.splitlines() if line.strip().startswith("ddp b8")]
    assert ddp_line.split()[-2:] == [f"{speedup:.3f}", f"{speedup / 2:.3f}"]
    image = Image.open(plot)
    assert image.size[0] > 300 and image.size[1] > 300
    title = image.text["Title"]  # what the plot shows, in the PNG's own metadata
    assert "speedup and efficiency against workers" in title
    assert "mobilenetv2 / mnist" in title and "ddp b8" in title and "sequential b8" in title
    # Without a 1-worker cell (the sweep's cells less the sequential one), each model is its
    # own baseline at its fewest workers, counted as ideal, and the output says so.
    cells = pd.read_csv(exported(store, tmp_path, "sweeps_a"))
    alone = scaling(cells[cells["workers"] > 1])
    assert list(alone.baselines.values()) == [NO_SINGLE_WORKER]
    assert list(alone.points["speedup"]) == [2.0] and list(alone.points["efficiency"]) == [1.0]


def test_mlperf_folder_is_scored_by_mlperfs_summarizer(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sweep A as an MLPerf results folder (harness.sweeps.mlperf): a system per cell, a result
    file per repeat (the cell's own logs, from its MLflow run), and the score MLPerf's result
    summarizer computes: the olympic mean of run_stop - run_start, of 3 runs the middle one."""
    out = tmp_path / "mlperf"
    main(["mlperf", store.sweep_dir.name, "--out", str(out), store.override])
    printed = capsys.readouterr().out
    assert printed.startswith(
        f"{out}: 2 system(s), 2 system x benchmark folder(s), 6 result files, from sweep "
    )
    table = pd.read_csv(out / "summary.csv").set_index("system")
    systems = {"sequential": "local_2cpu-sequential-1w", "ddp": "local_2cpu-ddp-2w"}
    assert sorted(table.index) == sorted(systems.values())  # a row per system
    for model, run in store.cell_runs("sweeps_a").items():
        logs = [Path(run.data.tags["output_dir"]) / log_file_name(k) for k in range(3)]
        folder = out / "results" / systems[model] / BENCHMARK
        assert [(folder / f"result_{k}.txt").read_text() for k in range(3)] == [
            log.read_text() for log in logs
        ]
        middle = sorted(run_minutes(log) for log in logs)[1]
        score = table.at[systems[model], BENCHMARK]
        assert score == pytest.approx(middle, abs=1e-6)
        (line,) = [line for line in printed.splitlines() if line.split()[:1] == [systems[model]]]
        assert line.split()[1:5] == [BENCHMARK, "3", "0", f"{score:.4f}"]


def exported(store: Store, folder: Path, selection: str) -> Path:
    out = folder / f"{selection}.csv"
    main(["export", selection, "--out", str(out), store.override])
    return out


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["export", "no_such_experiment", "--out", "{tmp}/x.csv"], "no_such_experiment"),
        (["export", "sweeps_a", "--out", "{tmp}/x.xlsx"], "--out"),
        (["scaling", "sweeps_a", "--out", "{tmp}/x.csv"], "--out"),
        (["compare", "sweeps_a", "sweeps_b", "--on", "dataset,colour"], "colour"),
        (["export", "sweeps_a"], "--out"),
        (
            ["export", "sweeps_a", "--out", "{tmp}/x.csv", "run.output_dir={tmp}/nothing"],
            "no MLflow store",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], names: str
) -> None:
    argv = [argument.format(tmp=tmp_path) for argument in argv]
    where = [] if any(a.startswith("run.output_dir=") for a in argv) else [store.override]
    with pytest.raises(SystemExit) as ended:
        main([*argv, *where])
    error = capsys.readouterr().err
    assert ended.value.code == 2
    assert error.startswith("distbench: ") and error.count("\n") == 1 and names in error
    assert not list(tmp_path.iterdir())  # nothing written, no empty store created


def test_compare_marks_a_cell_measured_on_an_unsteady_machine(store: Store, tmp_path: Path) -> None:
    """A side's time measured while the machine was unsteady carries `~`, with the footnote
    that says what it means, as the sweep's own table does."""
    a = pd.read_csv(exported(store, tmp_path, store.sweep_dir.name))
    b = pd.read_csv(exported(store, tmp_path, "sweeps_b"))
    a["steady"], b["steady"] = 1.0, 1.0
    a.loc[a["distribution"] == "sequential", "steady"] = 0.0
    text = comparison_text(compare(a, b))
    (row,) = [line for line in text.splitlines() if line.split()[:1] == ["both"]]
    seconds = {
        side: cells.loc[cells["distribution"] == "sequential", "seconds_per_epoch"].iloc[0]
        for side, cells in (("a", a), ("b", b))
    }
    assert f"{UNSTEADY_MARK}{seconds['a']:.3f}" in row
    assert f"{UNSTEADY_MARK}{seconds['b']:.3f}" not in row and UNSTEADY_FOOTNOTE in text
    a["steady"] = 1.0
    assert UNSTEADY_FOOTNOTE not in comparison_text(compare(a, b))
