"""The records: what a cell leaves behind and how it is found again.

A cell's result file (`results`); MLflow, opened one way (`mlflow_store`), with a run per cell
(`tracking`) nested under its sweep's parent run (`sweep_runs`), and read back typed
(`recorded_runs`); the record a store refused kept on disk (`record`, `pending`,
`empty_store`); a cell that did not end `ok` (`outcome`); a cell's identity and whether an
earlier sweep finished it (`cell`, `resume`); a sweep's summary (`sweep_summary`) and the
MLPerf event logs (`eventlog`).

They sit above the distribution models and below the worker (`harness.worker`), which writes
them, and below the launchers, prediction and analysis, which read them. None loads torch: a
launcher records a failed cell without it. The package imports none of its modules."""
