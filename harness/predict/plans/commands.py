"""A plan as the overrides that train it (`python -m harness distribution=mesh ...`) and as a
few words."""

from __future__ import annotations

from harness.costs.plan_step import PlanShape
from harness.costs.transformer import Recompute


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
