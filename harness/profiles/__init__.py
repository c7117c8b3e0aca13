"""Profiles: what was measured about a network and the hardware, as records the cost models read.

`network` (a network's per-layer profile: forward, backward, update times and sizes),
`hardware` (the probe's links, allreduce and compute-lost figures, loaded from and saved to
the hardware's profile file), `rounds` (a probed figure measured in rounds: median, spread),
`stages` (a pipeline's stages timed in place) and `steps` (a sequential step time, where it
was measured, and the rule that chooses one).

Records only: they measure nothing and load no torch. Imports `harness.config` and
`harness.cli` (a damaged file is refused in one line), nothing above.
"""
