"""`ddp`: torch DistributedDataParallel, data parallelism maintained by PyTorch itself.

Every worker trains its own shard of each epoch (Table 3.3's batch per worker); DDP averages
gradients with bucketed allreduces that start while the backward pass is still running, which
is the overlap Horovod's Tensor Fusion also aims for, so the two compare side by side.

The allreduces go through a communication hook that does what DDP's default does (average
each bucket with one allreduce) and notes when each bucket was launched and when it finished.
The backward pass's last bucket is launched when the last gradients are computed, so
`last finish - last launch` is the time backward spent waiting for communication alone: the
`comm_wait` of the batch. (With NCCL the finish is when the completion callback runs, which
follows the GPU's work with some delay.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.config.accepts import number
from harness.config.schema import MAX_BUFFER_MB, DistbenchConfig
from harness.costs import memory
from harness.costs.terms import CellFacts, EpochTerms, data_parallel_terms, replica_memory
from harness.distributions.layer_settings import LayerSettingsConfig
from harness.distributions.spec import DistributionSpec, at_every_count, trainer_in, workers_label
from harness.profiles.collectives import Collective
from harness.profiles.hardware import HardwareProfile

# DDP's first gradient bucket is small (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES), so
# that the first allreduce starts early in the backward pass.
DDP_FIRST_BUCKET_MB = 1.0


@dataclass
class DDPConfig(LayerSettingsConfig):
    """torch DistributedDataParallel's settings (and activation checkpointing and precision,
    `LayerSettingsConfig`)."""

    name: str = "ddp"
    # Gradient bucket size in MB (torch's default 25); its counterpart of Horovod's `th`.
    bucket_cap_mb: float = field(
        default=25.0, metadata=number(0, MAX_BUFFER_MB, "MB", low_open=True)
    )

    def run_name_parts(self, cell: DistbenchConfig) -> list[str]:
        return self.layer_name_parts()

    def weight_shards(self, cell: DistbenchConfig) -> int:
        """Every worker holds a whole replica."""
        return 1


def ddp_settings(config: DistbenchConfig) -> DDPConfig:
    assert isinstance(config.distribution, DDPConfig), config.distribution
    return config.distribution


def ddp_buckets(gradient_mb: float, bucket_cap_mb: float) -> int:
    """DDP's allreduces per step: a small first bucket, then buckets of `bucket_cap_mb`."""
    first = min(gradient_mb, DDP_FIRST_BUCKET_MB)
    return 1 + math.ceil(max(gradient_mb - first, 0.0) / bucket_cap_mb)


def epoch_terms(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile | None
) -> EpochTerms:
    """Eq. 5.1 with DDP's buckets: the last bucket exposed on a GPU, every bucket's
    allreduce (each with its latency) on CPU workers (`predict.terms.data_parallel_terms`)."""
    assert profile is not None
    bucket_mb = ddp_settings(config).bucket_cap_mb
    return data_parallel_terms(
        config,
        facts,
        profile,
        exposed_threshold_mb=bucket_mb,
        messages=ddp_buckets(facts.gradient_mb, bucket_mb),
    )


def ddp_buffer_mb(gradient_mb: float) -> float:
    """DDP's buckets are a flat copy of all the gradients, allocated once, kept throughout."""
    return gradient_mb


def memory_per_worker(config: DistbenchConfig, facts: CellFacts) -> list[memory.WorkerMemory]:
    """A replica per worker, plus DDP's buckets: a second copy of the gradients."""
    return [
        replica_memory(config, facts, buffer_mb=ddp_buffer_mb(facts.gradient_mb))
    ] * config.world_size


SPEC = DistributionSpec(
    name="ddp",
    title="PyTorch DDP",
    settings=DDPConfig,
    trainer=trainer_in(f"{__name__}.trainer", "ddp_trainer"),
    epoch_terms=epoch_terms,
    memory_per_worker=memory_per_worker,
    candidates=at_every_count(DDPConfig),
    label=workers_label("ddp"),
    probed_collectives=(
        Collective.point_to_point,  # the ring over the links, on GPUs
        Collective.allreduce,
        Collective.allreduce_beside_compute,
    ),
)
