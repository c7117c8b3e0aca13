"""Predictions for a cell: the cost models (`harness.costs`) fed with a cell's facts.

`cell` (a cell's epoch terms and memory per worker, by its distribution model's spec),
`parameters` (every free parameter, the models' own included), `facts` (what the models need
to know about a workload, gathered once: kept on disk per hardware, measured where missing by
the measurements a command passes in), `recorded` (step times read from the one-worker cells
recorded in MLflow), `ties` (options the predictions cannot tell apart) and `labels` (a
configuration in a few characters). The analysis, the recommender and the dry run call it.

Above the distribution models and the records, which it reads. It imports neither the worker
(`harness.worker`) nor a training module (a model's trainer, `harness.distributions.base`,
`loop`, `pipeline`, `onefoneb`, `state`): a prediction from kept facts starts no worker and
loads no trainer (tests/meta/test_import_graph.py).
"""
