"""What the performance models need to know about a cell's workload, gathered once.

Three kinds of facts:
- static ones, free: parameter and activation sizes per layer (`harness.describe`, traced on
  the meta device);
- measured ones, on one device of the target kind: the sequential step time at the batch a
  model trains at (the thesis' statistical model), and for pipelines each layer's share of the
  compute (the profiler), the stage plan and the stages timed in place;
- measured ones for the memory model, on this machine's CPU: what autograd saves per layer
  (once per network and dataset, seconds) and a worker process's runtime share (once per
  dataset, a fresh process).

Modules:
- `store`: the facts file, `<run.output_dir>/facts/<hardware>.json` (`FactsStore`: its schema
  checked at load, read by key, saved atomically), the keys a fact is kept under, and
  `MissingMeasurement`;
- `policy`: `FactsPolicy`, what a command allows (probe or not, reuse kept facts or measure
  again, where the facts file and the MLflow store are), its flags checked;
- `measurements`: `Measurements`, what measures on this machine, as a protocol;
- `cache`: `FactsCache`, the policy, the measurements, the facts found so far and a log of
  what was measured here, and `cache_for`;
- `gather`: `gather`, a cell's facts, and the decisions on the way (where a step time comes
  from, when a layer profile is taken or estimated, what is kept);
- `speed`: a step time moved to the machine speed a measured cell ran at.

Whatever is measured is kept in the facts file, so that the same question gets the same
answer: with `FactsPolicy.reuse` (the recommender's default) what the file holds for this
machine's device is used instead of measuring again. Where the hardware's device is not on
this machine (`hardware.device=cuda` on a login node without CUDA), with `probe=False`, or with
no `Measurements` given, no step is timed: the step times come from that file and from the
sequential cells recorded in MLflow (`harness.predict.recorded`), by the rule of
`harness.profiles.steps.choose_step_time`; with neither, a `MissingMeasurement` says what to
run where.

The measuring itself lives with the workers (`harness.worker.measurements`), which the
commands that measure pass in: nothing here imports `harness.worker` or a training module
(`harness.distributions.base`, `loop`, `pipeline`, `onefoneb`, `state`, a model's `trainer`),
so that predicting from kept facts starts no worker and loads no trainer
(tests/meta/test_import_graph.py). It imports the layers below prediction otherwise:
`harness.config`, `cli`, `profiles`, `costs`, `measure` (timing rules, the meta-device trace),
`runtime.environment` (the machine's name), the distribution models' specs
(`harness.distributions.registry`) and `harness.predict.recorded`. The package imports none
of its modules.
"""
