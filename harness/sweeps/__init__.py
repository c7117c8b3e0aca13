"""`python -m harness.sweeps` (`distbench-sweeps`): measured cells out of MLflow, side by side.

- `export SELECTION... --out FILE.csv|FILE.parquet`: one row per cell run (config axes, status,
  every metric, run and sweep ids, start and end);
- `compare A B`: two selections cell by cell, seconds per epoch B/A with its 95 % interval
  where both cells have repeats, and the cells measured on one side only;
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

Modules: `table` (what a selection means, and its cells as a pandas table), `compare`,
`scaling`, `mlperf`, `cli`.
"""

from harness.sweeps.cli import main

__all__ = ["main"]
