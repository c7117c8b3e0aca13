"""Horovod: Eq. 5.1 of the thesis, per training step and per epoch.

    T_horovod = T_seq / W + 2(W-1) * max_i ( L_{i,i+1} + min(G, th) / (W * BW_{i,i+1}) )

Every worker trains its own batch (Table 3.3's per-worker size), so a step of the W workers
does the work of W sequential batches in the time of one: the compute term is T_seq / W of
the sequential time of the same images. Tensor Fusion packs gradients into buffers of up to
`th` MB whose ring-allreduces overlap the backward pass, except the last one; a ring-allreduce
of m MB takes 2(W-1) steps of m/W MB each, and the ring moves at the pace of its slowest link.

`overhead_s` (a fixed cost per step: negotiation, buffer copies) and `bandwidth_scale` (the
share of the link's bandwidth an allreduce achieves) are the model's free parameters: 0 and 1
are the thesis' raw equation; `harness.analysis` fits them against measured cells.
"""

from __future__ import annotations

import math

from harness.hardware_profile import HardwareProfile
from harness.metrics import BYTES_PER_MB


def ring_allreduce_seconds(profile: HardwareProfile, workers: int, message_mb: float, *,
                           bandwidth_scale: float = 1.0, first_rank: int = 0) -> float:
    """The exposed ring-allreduce of the last `message_mb` MB among `workers` workers (ranks
    `first_rank`.. `first_rank + workers - 1`): 2(W-1) * max_i (L_{i,i+1} + m / (W * BW_{i,i+1}))."""
    if workers < 2:
        return 0.0
    ring = [first_rank + i for i in range(workers)]
    slowest_step = max(
        profile.link(ring[i], ring[(i + 1) % workers]).seconds_for(
            message_mb * BYTES_PER_MB / workers, bandwidth_scale=bandwidth_scale)
        for i in range(workers))
    return 2 * (workers - 1) * slowest_step


def exposed_mb(gradient_mb: float, threshold_mb: float) -> float:
    """The last buffer's MB, whose allreduce the backward pass cannot hide: min(G, th);
    th = 0 turns fusion off, leaving the last tensor, bounded by G."""
    return min(gradient_mb, threshold_mb) if threshold_mb > 0 else gradient_mb


def step_seconds(t_seq_batch_s: float, workers: int, gradient_mb: float,
                 fusion_threshold_mb: float, profile: HardwareProfile, *,
                 overhead_s: float = 0.0, bandwidth_scale: float = 1.0) -> float:
    """One step of W workers, each on its own batch: compute of one sequential batch plus the
    last fused buffer's allreduce (Eq. 5.1 with T_seq taken over W batches)."""
    communication = ring_allreduce_seconds(profile, workers,
                                           exposed_mb(gradient_mb, fusion_threshold_mb),
                                           bandwidth_scale=bandwidth_scale)
    return t_seq_batch_s + communication + (overhead_s if workers > 1 else 0.0)


def epoch_seconds(t_seq_batch_s: float, samples_per_epoch: int, batch_size: int,
                  workers: int, gradient_mb: float, fusion_threshold_mb: float,
                  profile: HardwareProfile, *, overhead_s: float = 0.0,
                  bandwidth_scale: float = 1.0) -> float:
    """An epoch: each worker trains samples / (W * batch) steps."""
    steps = math.floor(samples_per_epoch / (workers * batch_size))
    return steps * step_seconds(t_seq_batch_s, workers, gradient_mb, fusion_threshold_mb,
                                profile, overhead_s=overhead_s,
                                bandwidth_scale=bandwidth_scale)
