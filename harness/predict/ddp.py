"""DDP: the form of Eq. 5.1 with DDP's gradient bucket (`bucket_cap_mb`) in place of Horovod's
fusion threshold `th`: DDP allreduces buckets as they fill during the backward pass, so only the
last bucket's allreduce is exposed. DDP's first bucket is smaller (1 MB by default), but it is
the last to be reduced in a backward pass only for the first layers, so the exposed one is a
full bucket, bounded by the gradients' size."""

from __future__ import annotations

from harness.hardware_profile import HardwareProfile
from harness.predict import horovod


def epoch_seconds(t_seq_batch_s: float, samples_per_epoch: int, batch_size: int,
                  workers: int, gradient_mb: float, bucket_cap_mb: float,
                  profile: HardwareProfile, *, overhead_s: float = 0.0,
                  bandwidth_scale: float = 1.0) -> float:
    return horovod.epoch_seconds(t_seq_batch_s, samples_per_epoch, batch_size, workers,
                                 gradient_mb, bucket_cap_mb, profile, overhead_s=overhead_s,
                                 bandwidth_scale=bandwidth_scale)
