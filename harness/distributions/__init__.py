"""Distribution models. Each is one package here: its `__init__` ends with its `SPEC`
(`harness.distributions.spec`: its settings, its time and memory equations, its recommender
candidates and its label, and the name of its trainer), its `trainer` module trains it. The
registry (`harness.distributions.registry`) imports every package here and nothing else, so
predicting, planning and checking a cell never load a trainer (nor torch); a worker imports
its model's trainer when it builds it.

The plain modules are what the models share: the settings of the pipelines
(`pipeline_config`), and, for training only, the trainer protocol (`base`), the one-replica
loop (`loop`), pipeline plumbing (`pipeline`) and weight snapshots (`state`); the 1F1B
schedule as data is `harness.costs.onefoneb`, which the cost models share."""
