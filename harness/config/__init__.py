"""Configuration: what a cell is, typed and checked, before anything runs.

`schema` (the dataclasses Hydra composes into: dataset, network, distribution, hardware, run;
their validation, and `ConfigError`, the bad input every command refuses in one line),
`accepts` (the checks a value of any setting passes: integers, finite numbers, names),
`batch_sizes` (Table 3.3's batch size per network and model), `units` (MB) and
`weight_memory` (whether a network's weights, gradients and optimizer state can fit a worker's
memory at all, from the parameter count its check on the meta device gives).

The lowest layer of `harness`: it imports no other package of `harness`, only `workloads`'
dataset and network specs, and loads no torch (a command's `--help` and bad input stay fast).
"""
