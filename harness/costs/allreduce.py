"""The ring allreduce of the data-parallel models (Horovod, DDP, PipeDream's replicated stages,
FSDP's HSDP): the communication terms of Eq. 5.1 of the thesis, written for Horovod.

    T_horovod = T_seq / W + 2(W-1) * max_i ( L_{i,i+1} + min(G, th) / (W * BW_{i,i+1}) )

Every worker trains its own batch (Table 3.3's per-worker size), so a step of the W workers
does the work of W sequential batches in the time of one: the compute term is T_seq / W of
the sequential time of the same images. Tensor Fusion packs gradients into buffers of up to
`th` MB whose ring-allreduces overlap the backward pass, except the last one; a ring-allreduce
of m MB takes 2(W-1) steps of m/W MB each, and the ring moves at the pace of its slowest link.

The equation over an epoch, for DDP (whose bucket plays th's part) and Horovod alike, is
`harness.costs.terms.data_parallel_terms`, which each model's spec calls with its own buffer
size; `bandwidth_scale` is the share of the link's bandwidth an allreduce achieves (1: the
thesis' raw equation).
"""

from __future__ import annotations

from harness.config.units import BYTES_PER_MB
from harness.profiles.hardware import HardwareProfile


def ring_allreduce_seconds(
    profile: HardwareProfile,
    workers: int,
    message_mb: float,
    *,
    bandwidth_scale: float = 1.0,
    first_rank: int = 0,
) -> float:
    """The exposed ring-allreduce of the last `message_mb` MB among `workers` workers (ranks
    `first_rank`.. `first_rank + workers - 1`):
    2(W-1) * max_i (L_{i,i+1} + m / (W * BW_{i,i+1}))."""
    if workers < 2:
        return 0.0
    ring = [first_rank + i for i in range(workers)]
    slowest_step = max(
        profile.link(ring[i], ring[(i + 1) % workers]).seconds_for(
            message_mb * BYTES_PER_MB / workers, bandwidth_scale=bandwidth_scale
        )
        for i in range(workers)
    )
    return 2 * (workers - 1) * slowest_step


def exposed_mb(gradient_mb: float, threshold_mb: float) -> float:
    """The last buffer's MB, whose allreduce the backward pass cannot hide: min(G, th);
    th = 0 turns fusion off, leaving the last tensor, bounded by G."""
    return min(gradient_mb, threshold_mb) if threshold_mb > 0 else gradient_mb
