"""Measured cells out of MLflow, side by side: `python -m harness.sweeps` (`harness.sweeps.cli`).

Modules: `table` (what a selection means, and its cells as a pandas table), `compare`,
`scaling`, `mlperf`, `cli` (the command line and its usage text).
"""
