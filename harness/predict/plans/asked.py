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
    """The plan of a `distribution=mesh` config over every GPU of its hardware; refused in one
    line for another distribution model."""
    from harness.distributions.layer_settings import Checkpointing
    from harness.distributions.mesh import MeshConfig

    settings = config.distribution
    if not isinstance(settings, MeshConfig):
        raise ConfigError(
            f"distribution={settings.name} is invalid with --predict: a plan is "
            f"distribution=mesh with its degrees (docs/plans.md); allowed: distribution=mesh"
        )
    world = world_of(config)
    fixed = settings.dp_replicate * settings.tp * settings.pp
    shard = settings.dp_shard if settings.dp_shard is not None else world // fixed
    if shard < 1 or fixed * shard != world:
        raise ConfigError(
            f"distribution.dp_shard={settings.dp_shard} is invalid: dp_replicate x dp_shard x "
            f"tp x pp = {settings.dp_replicate} x {shard} x {settings.tp} x {settings.pp} must "
            f"be the hardware's {world} GPUs; allowed: degrees whose product is {world}"
        )
    global_batch = global_batch_of(config)
    data_parallel = settings.dp_replicate * shard
    if global_batch % data_parallel:
        raise ConfigError(
            f"run.global_batch={global_batch} is invalid: it must divide over the plan's "
            f"{data_parallel} data-parallel positions; allowed: a multiple of {data_parallel}"
        )
    local = global_batch // data_parallel
    micro = settings.micro_batch_size or (
        local // settings.pp if settings.pp > 1 and local % settings.pp == 0 else local
    )
    if local % micro:
        raise ConfigError(
            f"distribution.micro_batch_size={micro} is invalid: it must divide each "
            f"data-parallel position's {local} sequences; allowed: a divisor of {local}"
        )
    recompute = {
        Checkpointing.none: Recompute.none,
        Checkpointing.full: Recompute.full,
        Checkpointing.selective: Recompute.layers,
    }[settings.activation_checkpointing]
    return PlanShape(
        dp_replicate=settings.dp_replicate,
        dp_shard=shard,
        tp=settings.tp,
        pp=settings.pp,
        global_batch=global_batch,
        micro_batch=micro,
        schedule=settings.schedule,
        virtual=settings.virtual_stages(),
        sequence_parallel=settings.sequence_parallel,
        recompute=recompute,
        recompute_every=settings.checkpoint_every,
        precision=settings.precision.value,
        optimizer_states=config.optimizer.state_buffers,
    )
