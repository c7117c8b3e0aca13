"""`python -m harness.analysis`: the performance models against a measured grid.

- `grid`: the measured cells of an MLflow experiment, with the configs they trained;
- `fit`: least-squares fits of each model's free parameters and cross-validated errors;
- `recommendations`: the fastest model per workload, predicted against measured;
- `report`: the Markdown report and its plots;
- `calibration`: what it writes (`fit.json`) read back for a prediction: `Fitted`, and
  `choose_fit` (which fit of an output root covers a hardware and its models).
"""
