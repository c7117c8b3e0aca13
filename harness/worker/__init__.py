"""The worker: one cell on one worker process, and what watches it while it trains.

`run` trains and times a cell (`run_cell`, the worker's entry point that the launchers
submit) and writes its records (`harness.records`); `divergence` ends a cell whose loss is no
longer finite, `interruption` records a single-process cell ended by a signal, `watchdog`
ends a worker that stops making progress (a hang), `memory_limit` holds a CPU cell to
`hardware.device_memory_gb`; `probe_worker` is what the workers of `python -m harness.probe`
measure, `step_time` a sequential step timed on one worker (the statistical model's T_seq),
`runtime_memory` a worker process's memory besides the model, in a fresh process, and
`measurements` all of these and the other measurements a prediction may need, as the facts
cache asks for them (`harness.predict.facts.measurements.Measurements`).

Above the records and the distribution models; below prediction, analysis, the commands and
the launchers, which start workers but never import what they train with (`run` loads torch).
The package imports none of its modules."""
