"""A plan the planner prices (`harness.costs.plan_step.PlanShape`) as this model's settings:
the overrides that train it, its label, and a validated config's plan read back."""

from __future__ import annotations

from harness.config.schema import ConfigError, DistbenchConfig
from harness.costs.plan_step import PlanShape
from harness.costs.transformer import Recompute
from harness.distributions.layer_settings import Checkpointing


def plan_overrides(plan: PlanShape) -> list[str]:
    """The `distribution=mesh` settings and global batch of `plan`."""
    overrides = [
        "distribution=mesh",
        f"distribution.dp_replicate={plan.dp_replicate}",
        f"distribution.dp_shard={plan.dp_shard}",
        f"distribution.tp={plan.tp}",
        f"distribution.pp={plan.pp}",
        f"distribution.micro_batch_size={plan.micro_batch}",
        f"distribution.precision={plan.precision}",
        f"run.global_batch={plan.global_batch}",
    ]
    if plan.sequence_parallel:
        overrides.append("distribution.sequence_parallel=true")
    if plan.pp > 1:
        overrides += [
            f"distribution.schedule={plan.schedule}",
            f"distribution.stages_per_rank={plan.virtual}",
        ]
    if plan.recompute is Recompute.full:
        overrides.append("distribution.activation_checkpointing=full")
    elif plan.recompute is Recompute.layers:
        overrides += [
            "distribution.activation_checkpointing=selective",
            f"distribution.checkpoint_every={plan.recompute_every}",
        ]
    return overrides


def plan_label(plan: PlanShape) -> str:
    """The plan in a few words, axes outermost first: "fsdp8 x tp8 sp x pp4 interleaved_1f1b v2
    mb1 ac=sel2 bf16"."""
    words = []
    if plan.dp_replicate > 1:
        words.append(f"dp{plan.dp_replicate}")
    if plan.dp_shard > 1:
        words.append(f"fsdp{plan.dp_shard}")
    if plan.tp > 1:
        words.append(f"tp{plan.tp}" + (" sp" if plan.sequence_parallel else ""))
    if plan.pp > 1:
        virtual = (
            f" v{plan.virtual}"
            if plan.virtual > 1 and plan.schedule not in ("zbv", "dualpipev")
            else ""
        )
        words.append(f"pp{plan.pp} {plan.schedule}{virtual}")
    label = " x ".join(words) or "one GPU"
    tail = [f"mb{plan.micro_batch}"]
    if plan.recompute is Recompute.full:
        tail.append("ac=full")
    elif plan.recompute is Recompute.layers:
        tail.append(f"ac=sel{plan.recompute_every}")
    elif plan.recompute is not Recompute.none:
        tail.append(f"ac={plan.recompute.value}")
    tail.append({"bf16_mixed": "bf16", "bf16": "bf16p", "fp32": "fp32"}[plan.precision])
    return f"{label} {' '.join(tail)}"


def plan_of(config: DistbenchConfig) -> PlanShape:
    """The plan of a validated `distribution=mesh` config over every GPU of its hardware (its
    global batch `run.global_batch`, or the per-worker batch times the data-parallel
    positions); refused in one line for another distribution model."""
    from harness.distributions.mesh.settings import MeshConfig

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
