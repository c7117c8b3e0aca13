"""Predictions for a cell: the cost models (`harness.costs`) fed with a cell's facts.

`cell` (a cell's epoch terms and memory per worker, by its distribution model's spec),
`parameters` (every free parameter, the models' own included), `facts` (what the models need
to know about a workload, gathered once: kept on disk per hardware, measured where missing),
`recorded` (step times read from the one-worker cells recorded in MLflow) and `ties` (options
the predictions cannot tell apart). The analysis, the recommender and the dry run call it.

Above the distribution models and the records, which it reads.
"""
