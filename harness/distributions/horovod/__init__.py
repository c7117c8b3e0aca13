"""`horovod`: data parallelism with Horovod's ring-allreduce and Tensor Fusion.

Horovod's ranks are normally started by `horovodrun`; here they are the cell's workers that
submitit (locally or on SLURM) already started, so the harness does what `horovodrun` would:
rank 0 runs Horovod's rendezvous server, every rank gets the HOROVOD_* environment that names
its place, then `hvd.init()`. The rendezvous address and port travel through the
torch.distributed process group the cell already has. The server and Horovod's gloo sockets
listen on the worker's `listen_address` (loopback on one machine), never on every interface.
Tensor Fusion is configured from `distribution.fusion_threshold_mb` (the `th` of Eq. 5.1) and
`distribution.cycle_time_ms`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.config.accepts import number
from harness.config.schema import MAX_BUFFER_MB, DistbenchConfig, DistributionConfig
from harness.costs import memory
from harness.costs.terms import (
    BACKWARD_SHARE,
    CellFacts,
    EpochTerms,
    FreeParameter,
    data_parallel_terms,
    replica_memory,
)
from harness.distributions.spec import DistributionSpec, at_every_count, trainer_in, workers_label
from harness.profiles.collectives import Collective
from harness.profiles.hardware import HardwareProfile

MAX_CYCLE_TIME_MS = 1e6  # 1,000 s between fusion cycles: a cell would never finish

# Horovod's own free parameter: its background thread wakes every cycle to negotiate and fuse
# whatever gradients are ready, all through the step, not only while it communicates, and on
# workers that share their cores it takes a share of them from the compute.
BACKGROUND = FreeParameter(
    "horovod_background",
    "share of a core Horovod's background thread (a negotiation cycle every "
    "cycle_time_ms, all through the step) takes from workers that share their cores; "
    "Horovod only, 0 where workers have devices of their own",
    0.0,
    5.0,
)


@dataclass
class HorovodConfig(DistributionConfig):
    """Horovod's Tensor Fusion settings."""

    name: str = "horovod"
    # Fusion threshold `th` in MB (Eq. 5.1; Horovod's default 64): gradients are fused into
    # buffers of up to this many MB (0: no fusion).
    fusion_threshold_mb: float = field(default=64.0, metadata=number(0, MAX_BUFFER_MB, "MB"))
    # How often, in ms, Horovod's background thread fuses and sends what is ready.
    cycle_time_ms: float = field(
        default=1.0, metadata=number(0, MAX_CYCLE_TIME_MS, "ms", low_open=True)
    )

    def weight_shards(self, cell: DistbenchConfig) -> int:
        """Every worker holds a whole replica."""
        return 1


def horovod_settings(config: DistbenchConfig) -> HorovodConfig:
    assert isinstance(config.distribution, HorovodConfig), config.distribution
    return config.distribution


def horovod_allreduces(
    gradient_mb: float,
    gradient_tensors: int,
    threshold_mb: float,
    cycle_time_ms: float,
    backward_s: float,
) -> int:
    """Horovod's allreduces per step: every cycle (`cycle_time_ms`) its background thread
    fuses the gradients that became ready since the last one into one allreduce (at most
    `threshold_mb` each). A backward pass spanning many cycles hands over a few tensors per
    cycle, so the count is the number of cycles it spans, bounded by the tensors (one each)
    and at least what the threshold forces (Tensor Fusion's buffers)."""
    by_threshold = math.ceil(gradient_mb / threshold_mb) if threshold_mb > 0 else gradient_tensors
    cycles = math.ceil(backward_s * 1000 / cycle_time_ms)
    return max(1, by_threshold, min(gradient_tensors, cycles))


def epoch_terms(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile | None
) -> EpochTerms:
    """Eq. 5.1 with Tensor Fusion: the last fused buffer exposed on a GPU; on CPU workers
    every per-cycle fusion's allreduce, and the background thread's share of the cores.
    Across nodes a CPU worker's allreduces run beside the backward still to run, one per layer
    (`fused_mb_per_allreduce`)."""
    assert profile is not None
    settings = horovod_settings(config)
    messages = horovod_allreduces(
        facts.gradient_mb,
        facts.gradient_tensors,
        settings.fusion_threshold_mb,
        settings.cycle_time_ms,
        BACKWARD_SHARE * facts.step_seconds,
    )
    return data_parallel_terms(
        config,
        facts,
        profile,
        exposed_threshold_mb=fused_mb_per_allreduce(config),
        messages=messages,
        background=BACKGROUND,
    )


def fused_mb_per_allreduce(config: DistbenchConfig) -> float:
    """How much one of Horovod's allreduces carries where they overlap the backward (MB; 0: a
    layer's gradients). A CPU worker's backward spans many of the background thread's cycles
    (1 ms each), and each cycle fuses only the gradients that became ready since the last one:
    a layer's, not a buffer filled to the threshold (`horovod_allreduces` counts them the same
    way). Measured across emulated nodes, Horovod trains as fast as DDP, whose buckets overlap;
    priced as whole 64 MB buffers it would overlap nothing. On a GPU the thesis' Tensor Fusion
    buffer of the threshold."""
    if config.hardware.device.value == "cuda":
        return horovod_settings(config).fusion_threshold_mb
    return 0.0


def horovod_buffer_mb(gradient_mb: float, fusion_threshold_mb: float) -> float:
    """Horovod's fusion buffer is allocated at the threshold, but a fusion fills (touches)
    at most all the gradients: min(th, G); no fusion (th = 0), no buffer."""
    return min(fusion_threshold_mb, gradient_mb) if fusion_threshold_mb > 0 else 0.0


def memory_per_worker(config: DistbenchConfig, facts: CellFacts) -> list[memory.WorkerMemory]:
    """A replica per worker, plus the fusion buffer. Horovod reads its threshold in MiB (this
    module's trainer): 64 -> 67.1 MB."""
    buffer = horovod_buffer_mb(
        facts.gradient_mb, horovod_settings(config).fusion_threshold_mb * 1.048576
    )
    return [replica_memory(config, facts, buffer_mb=buffer)] * config.world_size


SPEC = DistributionSpec(
    name="horovod",
    title="Horovod",
    settings=HorovodConfig,
    trainer=trainer_in(f"{__name__}.trainer", "horovod_trainer"),
    epoch_terms=epoch_terms,
    memory_per_worker=memory_per_worker,
    candidates=at_every_count(HorovodConfig),
    label=workers_label("horovod"),
    frameworks=("horovod",),
    free_parameters=(BACKGROUND,),
    probed_collectives=(
        Collective.point_to_point,  # the ring over the links, on GPUs
        Collective.allreduce,
        Collective.allreduce_beside_compute,
    ),
)
