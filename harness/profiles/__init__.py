"""Profiles: what was measured about a network and the hardware, as records the cost models read.

`network` (a network's per-layer profile: forward, backward, update times and sizes),
`hardware` (the probe's links, allreduce and compute-lost figures, loaded from and saved to
the hardware's profile file), `rounds` (a probed figure measured in rounds: median, spread),
`stages` (a pipeline's stages timed in place), `steps` (a sequential step time as a probe
timed it, where it was measured, and the rule that chooses one), `runtime` (a worker
process's memory besides the model) and `collectives` (what the probe can measure between
workers, by name: what a distribution model declares it needs measured).

Records only: they measure nothing and load no torch. Imports `harness.config` and
`harness.cli` (a damaged file is refused in one line), nothing above.
"""
