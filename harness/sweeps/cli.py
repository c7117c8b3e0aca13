"""`python -m harness.sweeps` (`distbench-sweeps`): measured cells out of MLflow, side by side.

- `export SELECTION... --out FILE.csv|FILE.parquet`: one row per cell run (config axes, status,
  every metric, run and sweep ids, start and end);
- `compare A B`: two selections cell by cell, seconds per epoch B/A with its 95 % interval
  where both cells have repeats, a verdict per cell and overall (B faster or slower where the
  interval excludes 1, else no difference beyond noise; none where a side ran one repeat), and
  the cells measured on one side only;
- `scaling SELECTION... --out plot.png`: speedup and efficiency against workers, per
  distribution model, one panel per network and dataset.
- `mlperf SELECTION... --out DIR`: the cells as an MLPerf results folder (a system per
  hardware, distribution model and workers; a log per repeat) and MLPerf's result summarizer's
  scores of it.

A SELECTION is an MLflow experiment (every cell run in it) or one sweep: its parent run id, its
directory (`outputs/sweeps/<experiment>/<time>`), that directory's last part(s), or the parent
run's name (`sweep-<time>`). Trailing `key=value` arguments are config overrides that say where
the store is, as for the other commands: `run.output_dir=...` (the SQLite store in it) or
`tracking.uri=...`.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from harness.cli.arguments import ArgumentParser
from harness.cli.errors import command
from harness.cli.preflight import check_writable_dir
from harness.commands.compose import compose_config
from harness.config.schema import ConfigError, validate
from harness.measure.steadiness import UNSTEADY_FOOTNOTE, UNSTEADY_MARK
from harness.records.mlflow_store import tracking_uri
from harness.sweeps.compare import (
    FASTER,
    MATCH_ON,
    NO_VERDICT,
    NOISE,
    SLOWER,
    Comparison,
    check_on,
    compare,
)
from harness.sweeps.table import Selection, cells_table, client_for, select

PROG = "python -m harness.sweeps"
TABLE_SUFFIXES = (".csv", ".parquet")
# A config override as Hydra reads one (`run.output_dir=x`, `+key=v`), told apart from
# a selection (an experiment, a run id, a sweep directory: no `=` after a bare key) and from
# a flag (`--out=x`).
_OVERRIDE = re.compile(r"[+~]{0,2}[A-Za-z_][\w.]*=")


def parser() -> argparse.ArgumentParser:
    top = ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    export = commands.add_parser("export", help="cells to a CSV or Parquet file")
    export.add_argument("selections", nargs="+", metavar="EXPERIMENT_OR_SWEEP")
    export.add_argument("--out", type=Path, required=True, help="FILE.csv or FILE.parquet")
    pair = commands.add_parser("compare", help="two sweeps or experiments cell by cell")
    pair.add_argument("a", metavar="A")
    pair.add_argument("b", metavar="B")
    pair.add_argument(
        "--on",
        default=",".join(MATCH_ON),
        help=f"comma-separated axes that match a cell (default: {','.join(MATCH_ON)})",
    )
    pair.add_argument(
        "--out",
        type=Path,
        default=None,
        help="also write the comparison to FILE.csv or FILE.parquet",
    )
    scale = commands.add_parser("scaling", help="speedup and efficiency against workers")
    scale.add_argument("selections", nargs="+", metavar="EXPERIMENT_OR_SWEEP")
    scale.add_argument("--out", type=Path, required=True, help="the plot: FILE.png, .svg or .pdf")
    mlperf = commands.add_parser(
        "mlperf", help="an MLPerf results folder, and MLPerf's result summarizer's scores of it"
    )
    mlperf.add_argument("selections", nargs="+", metavar="EXPERIMENT_OR_SWEEP")
    mlperf.add_argument("--out", type=Path, required=True, help="DIR: a new or empty directory")
    return top


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the command's own arguments, config overrides that say where the store is)."""
    own: list[str] = []
    overrides: list[str] = []
    for argument in argv:
        is_override = _OVERRIDE.match(argument) is not None
        (overrides if is_override else own).append(argument)
    return own, overrides


@command
def main(argv: Sequence[str] | None = None) -> None:
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    options = parser().parse_args(own)
    out: Path | None = getattr(options, "out", None)
    if out is not None:  # before reading anything: a wrong file name costs nothing
        _check_out(out, options.command)
    if options.command == "compare":
        on = check_on([column for column in options.on.split(",") if column])
    config = validate(compose_config(overrides))
    client = client_for(tracking_uri(config.tracking.uri, config.run.output_dir))
    if options.command == "compare":
        _compare(client, options.a, options.b, on, out)
        return
    assert out is not None  # required by every other command's parser
    if options.command == "export":
        _export(client, options.selections, out)
    elif options.command == "mlperf":
        _mlperf(client, options.selections, out)
    else:
        _scaling(client, options.selections, out)


def _check_out(out: Path, command_: str) -> None:
    if command_ == "scaling":
        from harness.sweeps.scaling import check_plot_suffix

        check_plot_suffix(out)
    elif command_ == "mlperf":
        from harness.sweeps.mlperf import check_out

        check_writable_dir("--out", str(out))
        check_out(out)
        return
    elif out.suffix.lower() not in TABLE_SUFFIXES:
        raise ConfigError(
            f"--out={out} is invalid: allowed: a file name ending in {' or '.join(TABLE_SUFFIXES)}"
        )
    check_writable_dir("--out", str(out.parent))


def _cells(client: object, texts: Sequence[str]) -> tuple[list[Selection], pd.DataFrame]:
    chosen = [select(client, text) for text in texts]
    table = cells_table(client, chosen)
    if table.empty:
        raise ConfigError(
            f"selection {' '.join(texts)!r} is invalid: "
            + "; ".join(map(str, chosen))
            + " holds no cell runs; allowed: an "
            "experiment or sweep with measured cells"
        )
    return chosen, table


def write_table(table: pd.DataFrame, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".parquet":
        table.to_parquet(out, index=False)
    else:
        table.to_csv(out, index=False)


def _export(client: object, texts: Sequence[str], out: Path) -> None:
    chosen, table = _cells(client, texts)
    write_table(table, out)
    statuses = ", ".join(f"{n} {s}" for s, n in table["status"].value_counts().items())
    print(
        f"{out}: {len(table)} cells ({statuses}), {len(table.columns)} columns, from "
        + "; ".join(map(str, chosen))
    )


def _compare(client: object, a: str, b: str, on: list[str], out: Path | None) -> None:
    (side_a,), cells_a = _cells(client, [a])
    (side_b,), cells_b = _cells(client, [b])
    result = compare(cells_a, cells_b, on)
    print(f"A: {side_a}, {len(cells_a)} cells\nB: {side_b}, {len(cells_b)} cells")
    print(comparison_text(result))
    if out is not None:
        write_table(result.table, out)
        print(f"{out}: {len(result.table)} rows")


def comparison_text(result: Comparison) -> str:
    """The comparison as a reader scans it: the axes that differ between cells, each side's
    seconds per epoch (with its 95 % interval), B/A with its own and its verdict; then the
    verdict over every cell (`overall_verdict`)."""
    table = result.table
    # A model's own setting (None for the other models) is shown where it takes two values.
    varying = [c for c in result.on if table[c].nunique() > 1]
    constant = [
        f"{c}={table[c].dropna().iloc[0]}"
        for c in result.on
        if c not in varying and table[c].notna().any()
    ]
    shown = pd.DataFrame({"in": table["side"]})
    for column in varying:
        shown[column] = table[column].astype("string").fillna("-")
    for side in ("a", "b"):
        shown[f"{side.upper()} s/epoch"] = [
            _seconds(*row)
            for row in zip(
                table[f"{side}_status"],
                table[f"{side}_seconds_per_epoch"],
                table[f"{side}_seconds_per_epoch_ci95_low"],
                table[f"{side}_seconds_per_epoch_ci95_high"],
                table[f"{side}_steady"],
            )
        ]
    shown["B/A"] = [
        _ratio(*row)
        for row in zip(table["ratio"], table["ratio_ci95_low"], table["ratio_ci95_high"])
    ]
    shown["verdict"] = table["verdict"].replace("", "-")
    lines = [f"matched on: {', '.join(result.on)}"]
    if constant:
        lines.append(f"the same wherever set: {' '.join(constant)}")
    lines.append(shown.to_string(index=False))
    if any((table[f"{side}_steady"] == 0).any() for side in ("a", "b")):
        lines.append(UNSTEADY_FOOTNOTE)
    both = table[table["side"] == "both"]
    lines.append(
        f"{len(both)} cells on both sides, {int((table['side'] == 'only A').sum())} "
        f"only in A, {int((table['side'] == 'only B').sum())} only in B; B/A < 1: "
        "B is faster; [95% interval] where both cells have 2 or more repeats"
    )
    lines.append(overall_verdict(list(table["verdict"])))
    for side, count in result.set_aside.items():
        if count:
            lines.append(
                f"{side.upper()}: {count} earlier run(s) of a cell set aside (the "
                f"latest ok run stands for each cell)"
            )
    return "\n".join(lines)


def overall_verdict(verdicts: Sequence[str]) -> str:
    """'verdict: B faster in 1 of 3 cells, slower in 0, no difference beyond noise in 1; 1
    without a verdict (...)', over the cells both sides measured."""
    judged = [v for v in verdicts if v]
    if not judged:
        return "verdict: none, no cell ended ok on both sides"
    count = {kind: sum(v == kind for v in judged) for kind in (FASTER, SLOWER, NOISE)}
    unjudged = sum(v.startswith(NO_VERDICT) for v in judged)
    text = (
        f"verdict: B faster in {count[FASTER]} of {len(judged)} cells, slower in "
        f"{count[SLOWER]}, no difference beyond noise in {count[NOISE]} (where B/A's 95 % "
        f"interval excludes 1 or not)"
    )
    if unjudged:
        text += (
            f"; {unjudged} without a verdict: a side ran 1 repeat and measured no spread "
            f"(run.repeats=3 or more measures one)"
        )
    return text


def _seconds(status: object, mean: float, low: float, high: float, steady: float) -> str:
    if pd.isna(status):
        return "-"
    if status != "ok":
        return str(status)
    interval = "" if pd.isna(low) else f" [{low:.3f}, {high:.3f}]"
    mark = UNSTEADY_MARK if steady == 0 else ""  # NaN: recorded before steadiness was judged
    return f"{mark}{mean:.3f}{interval}"


def _ratio(ratio: float, low: float, high: float) -> str:
    if math.isnan(ratio):
        return "-"
    return f"{ratio:.3f}" + ("" if math.isnan(low) else f" [{low:.3f}, {high:.3f}]")


def _mlperf(client: object, texts: Sequence[str], out: Path) -> None:
    from harness.sweeps import mlperf

    chosen, table = _cells(client, texts)
    folder = mlperf.write_folder(client, table, out)
    if not folder.entries:
        raise ConfigError(
            f"selection {' '.join(texts)!r} is invalid: no cell ended ok with "
            f"MLPerf logs; allowed: an experiment or sweep with finished cells"
        )
    print(mlperf.report(folder, mlperf.summarize(out), "; ".join(map(str, chosen))))


def _scaling(client: object, texts: Sequence[str], out: Path) -> None:
    from harness.sweeps.scaling import plot, scaling

    chosen, table = _cells(client, texts)
    result = scaling(table)
    if result.points.empty:
        raise ConfigError(
            f"selection {' '.join(texts)!r} is invalid: no cell ended ok; "
            f"allowed: an experiment or sweep with finished cells"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(result, out, title="; ".join(map(str, chosen)))
    for workload, baseline in result.baselines.items():
        points = result.points[result.points["workload"] == workload]
        print(f"{workload}\n  baseline: {baseline}")
        print(
            points[["series", "workers", "seconds_per_epoch", "speedup", "efficiency"]].to_string(
                index=False, float_format=lambda v: f"{v:.3f}"
            )
        )
    if result.set_aside:
        print(
            f"{result.set_aside} slower cell(s) of a model at a worker count it already has "
            f"are not plotted (the fastest stands for each)"
        )
    print(f"{out}: speedup and efficiency against workers, {len(result.points)} cells")
