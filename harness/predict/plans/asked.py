"""What a user asks the planner, from a validated config: the world (the hardware's GPUs),
the global batch, and, for `--predict`, the plan `distribution=mesh` describes."""

from __future__ import annotations

from harness.config.schema import ConfigError, DistbenchConfig
from harness.costs.plan_step import PlanShape
from harness.costs.transformer import Recompute


def world_of(config: DistbenchConfig) -> int:
    return config.hardware.nodes * config.hardware.workers_per_node


def global_batch_of(config: DistbenchConfig) -> int:
    """`run.global_batch`, or one sequence per GPU."""
    return config.run.global_batch or world_of(config)


def plan_of(config: DistbenchConfig) -> PlanShape:
    """The plan of a validated `distribution=mesh` config over every GPU of its hardware (its
    global batch `run.global_batch`, or the per-worker batch times the data-parallel
    positions); refused in one line for another distribution model."""
    from harness.distributions.layer_settings import Checkpointing
    from harness.distributions.mesh import MeshConfig

    settings = config.distribution
    if not isinstance(settings, MeshConfig):
        raise ConfigError(
            f"distribution={settings.name} is invalid with --predict: a plan is "
            f"distribution=mesh with its degrees (docs/plans.md); allowed: distribution=mesh"
        )
    # The degrees, batch and micro-batch as the config resolves them (validation has
    # checked that they multiply to the world and divide the batch).
    data_parallel = settings.data_parallel(config)
    recompute = {
        Checkpointing.none: Recompute.none,
        Checkpointing.full: Recompute.full,
        Checkpointing.selective: Recompute.layers,
    }[settings.activation_checkpointing]
    return PlanShape(
        dp_replicate=settings.dp_replicate,
        dp_shard=settings.shards(config),
        tp=settings.tp,
        pp=settings.pp,
        global_batch=config.batch_size * data_parallel,
        micro_batch=settings.micro_batch(config),
        schedule=settings.schedule,
        virtual=settings.virtual_stages(),
        sequence_parallel=settings.sequence_parallel,
        recompute=recompute,
        recompute_every=settings.checkpoint_every if recompute is Recompute.layers else 1,
        precision=settings.precision.value,
        optimizer_states=config.optimizer.state_buffers,
    )
