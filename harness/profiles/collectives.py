"""What the hardware probe can measure between workers, by name: a distribution model declares
the ones its time terms read (`DistributionSpec.probed_collectives`), and `python -m
harness.probe` measures the union of what the registered models declare
(`harness.distributions.registry.probed_collectives`), so that a model's needs are its own
spec's, and the probe holds no code of any model.

Each is measured where it prices something: a figure no model's terms read on that hardware
is not measured (the probe's minutes are the user's).
"""

from __future__ import annotations

from enum import Enum


class Collective(str, Enum):
    """A transfer the probe times, with the profile entry it fills
    (`harness.profiles.hardware.HardwareProfile`)."""

    # Ping-pong between every pair of workers at every probe size: the profile's `links`
    # (latency and bandwidth of each), which a pipeline's transfers between stages and the
    # ring allreduce's steps are priced by.
    point_to_point = "point_to_point"
    # An allreduce among the first k workers for k = 2..W, at every size: the profile's
    # `allreduce` (a data-parallel model's gradients, a replicated stage's, HSDP's).
    allreduce = "allreduce"
    # On CPU workers of nodes of their own: the compute an allreduce between nodes takes from
    # the cores it runs beside (`facts.compute_lost_ms_per_mb`), where a model's allreduces
    # run beside its backward pass.
    allreduce_beside_compute = "allreduce_beside_compute"
    # On CPU workers: an all-gather among all the workers after a stretch of compute, at
    # every size (`facts.collectives_after_compute.all_gather`: FSDP's weights).
    all_gather = "all_gather"
    # On CPU workers: a reduce-scatter among all the workers after compute, at every size
    # (`facts.collectives_after_compute.reduce_scatter`: FSDP's gradients).
    reduce_scatter = "reduce_scatter"


# The collectives the probe times after a stretch of compute, as the profile keeps them
# (`COLLECTIVES_AFTER_COMPUTE_FACT`), in the order it times them at each size.
AFTER_COMPUTE = (Collective.all_gather, Collective.reduce_scatter)
