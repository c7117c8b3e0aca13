"""`python -m harness.recommend --plans` and `--predict`: plans priced from data sheets.

`--plans` enumerates every plan of the hardware's GPUs at the global batch (harness.predict.
plans.space), prunes those whose memory per rank exceeds a GPU's, ranks the rest by predicted
step time and prints the fastest with the command that trains each, memory per rank, tokens/s
per GPU, model FLOPs utilization and what bounds it; plans within the source's error of the
fastest are said to be tied with it. `--predict` prices the one plan `distribution=mesh`
describes, as JSON, ranking nothing. Nothing is measured or written.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

from harness.commands.compose import compose_config
from harness.config.schema import DistbenchConfig, validate
from harness.costs.plan_step import (
    GIB,
    Cluster,
    MemoryPrediction,
    PlanShape,
    StepPrediction,
    predict_step,
)
from harness.costs.transformer import TransformerShape
from harness.distributions.mesh.plan_shape import plan_label, plan_of, plan_overrides
from harness.predict.plans.cluster import cluster_of
from harness.predict.plans.search import PricedPlan, price, search, tied_with_best
from harness.predict.plans.shape import remember_network, shape_of
from harness.predict.plans.source import data_sheet_error


def world_of(config: DistbenchConfig) -> int:
    return config.hardware.nodes * config.hardware.workers_per_node


def global_batch_of(config: DistbenchConfig) -> int:
    """`run.global_batch`, or one sequence per GPU."""
    return config.run.global_batch or world_of(config)


# Overrides of the user's that the plan's own replace in the command that trains it.
PLAN_KEYS = ("distribution", "run.global_batch")


# What a language model trains on and with unless the user names another (distbench's own
# defaults are the thesis' image networks and SGD).
PLANNING_DEFAULTS = ("dataset=tokens", "optimizer.name=adamw")


def _group(override: str) -> str:
    """The config group or key an override sets ("optimizer.name" for both the group and its
    key, so that either given by the user keeps the default out)."""
    key = override.split("=", 1)[0].lstrip("+~")
    return "optimizer.name" if key == "optimizer" else key


def with_planning_defaults(overrides: Sequence[str]) -> list[str]:
    given = list(overrides)
    named = {_group(override) for override in given}
    return [default for default in PLANNING_DEFAULTS if _group(default) not in named] + given


def planning_config(overrides: Sequence[str]) -> DistbenchConfig:
    """The config the planner reads: token data and AdamW unless others are named; a network
    whose weights do not fit the asked model is no bad input here (which plans fit is the
    planner's answer)."""
    return validate(compose_config(with_planning_defaults(overrides)), weights_must_fit=False)


def _kept_overrides(overrides: Sequence[str]) -> list[str]:
    return [
        override
        for override in overrides
        if not override.split("=", 1)[0].lstrip("+~").startswith(PLAN_KEYS)
    ]


def train_command(config: DistbenchConfig, overrides: Sequence[str], plan: PlanShape) -> str:
    """`python -m harness ...` that trains `plan` on the asked network, data and hardware."""
    words = _kept_overrides(with_planning_defaults(overrides))
    if config.hardware.nodes > 1 and not any("hydra/launcher" in word for word in words):
        words.append("hydra/launcher=submitit_slurm")
    return "python -m harness " + shlex.join([*words, *plan_overrides(plan)])


def cost_per_million_tokens(config: DistbenchConfig, tokens_per_s_per_gpu: float) -> float | None:
    """What a million trained tokens cost at `hardware.price_per_device_hour` (None without a
    price): every plan of a search uses all the hardware's GPUs, so ranking by cost is ranking
    by time; the figure prices the recommendation."""
    price = config.hardware.price_per_device_hour
    if price is None or tokens_per_s_per_gpu <= 0:
        return None
    return price / 3600 / tokens_per_s_per_gpu * 1e6


def _gib(value: float) -> float:
    return round(value / GIB, 2)


def plan_record(
    config: DistbenchConfig,
    overrides: Sequence[str],
    priced: PricedPlan,
    cluster: Cluster,
) -> dict[str, Any]:
    """One priced plan as JSON."""
    memory: MemoryPrediction = priced.memory
    record: dict[str, Any] = {
        "plan": plan_label(priced.plan),
        "command": train_command(config, overrides, priced.plan),
        "fits": priced.fits,
        "memory_per_rank_gib": _gib(memory.total),
        "device_memory_gib": _gib(cluster.memory_bytes),
        "memory_gib": {
            "weights": _gib(memory.weights),
            "gradients": _gib(memory.gradients),
            "optimizer": _gib(memory.optimizer),
            "gathered_weights": _gib(memory.gathered),
            "activations": _gib(memory.activations),
            "logits": _gib(memory.logits),
            "runtime": _gib(memory.runtime),
        },
        "block_activations_gib": {
            "counted": _gib(memory.block_activations),
            "korthikanti_2022": _gib(memory.korthikanti_block),
        },
    }
    step: StepPrediction | None = priced.step
    if step is not None:
        record |= {
            "step_seconds": round(step.seconds, 4),
            "tokens_per_s_per_gpu": round(step.tokens_per_s_per_gpu, 1),
            "mfu": round(step.mfu, 4),
            "bound": step.bound,
            "cost_per_million_tokens": cost_per_million_tokens(config, step.tokens_per_s_per_gpu),
            "currency": config.hardware.currency,
            "seconds": {
                "compute": round(step.compute, 4),
                "of_which_recompute": round(step.recompute, 4),
                "bubble": round(step.bubble, 4),
                "tensor_parallel": round(step.tensor_parallel, 4),
                "pipeline_sends": round(step.pipeline_sends, 4),
                "data_parallel_exposed": round(step.data_parallel, 4),
                "optimizer": round(step.optimizer, 4),
            },
        }
    return record


def _heading(config: DistbenchConfig, shape: TransformerShape, cluster: Cluster, batch: int) -> str:
    return (
        f"plans for network={config.network.label} ({shape.params / 1e9:.1f} B parameters, "
        f"sequence {shape.seq_len}) on hardware={config.hardware.name}: {cluster.nodes} "
        f"node(s) x {cluster.gpus_per_node} {cluster.accelerator.name} "
        f"({cluster.memory_bytes / GIB:.1f} GiB each), global batch {batch} sequences"
    )


def predict_one(overrides: Sequence[str]) -> None:
    """`--predict`: the plan `distribution=mesh` describes, as JSON."""
    config = planning_config(overrides)
    shape, cluster, plan = shape_of(config), cluster_of(config.hardware), plan_of(config)
    priced = price(shape, plan, cluster)

    error = data_sheet_error()
    answer = plan_record(config, overrides, priced, cluster) | {
        "network": config.network.label,
        "hardware": config.hardware.name,
        "gpus": world_of(config),
        "sequence_length": shape.seq_len,
        "global_batch": plan.global_batch,
        "source": error.line(),
    }
    if priced.step is None:
        # Timed even when it does not fit: a table of configurations scripted against this
        # wants both figures.
        step = predict_step(shape, plan, cluster)
        answer |= {
            "step_seconds": round(step.seconds, 4),
            "tokens_per_s_per_gpu": round(step.tokens_per_s_per_gpu, 1),
            "mfu": round(step.mfu, 4),
            "bound": "memory",
        }
    print(json.dumps(answer, indent=2))
    remember_network(config)


def rank_plans(overrides: Sequence[str], top: int, as_json: bool) -> None:
    """`--plans`: every plan of the hardware's GPUs, those that fit ranked by step time."""
    config = planning_config(overrides)
    _show_plans(config, overrides, top, as_json)
    remember_network(config)  # answered: a later ask about this network builds nothing


def _show_plans(config: DistbenchConfig, overrides: Sequence[str], top: int, as_json: bool) -> None:
    shape, cluster = shape_of(config), cluster_of(config.hardware)
    batch = global_batch_of(config)
    started = time.perf_counter()
    found = search(shape, cluster, world_of(config), batch, config.optimizer.state_buffers)
    elapsed = time.perf_counter() - started
    error = data_sheet_error()
    tied = tied_with_best(found.ranked, error.mape)
    shown = found.ranked[:top]
    if as_json:
        print(
            json.dumps(
                {
                    "network": config.network.label,
                    "hardware": config.hardware.name,
                    "gpus": world_of(config),
                    "sequence_length": shape.seq_len,
                    "global_batch": batch,
                    "source": error.line(),
                    "priced": found.priced,
                    "do_not_fit": found.too_big,
                    "tied_with_fastest": len(tied),
                    "plans": [plan_record(config, overrides, one, cluster) for one in shown],
                    "closest_to_fitting": (
                        plan_record(config, overrides, found.smallest_too_big, cluster)
                        if found.smallest_too_big
                        else None
                    ),
                },
                indent=2,
            )
        )
        print(f"the search took {elapsed:.1f} s", file=sys.stderr)
        return
    print(_heading(config, shape, cluster, batch))
    print(error.line())
    print(
        f"priced {found.priced:,} plans in {elapsed:.1f} s: {len(found.ranked):,} fit, "
        f"{found.too_big:,} need more than a GPU's memory"
    )
    if not found.ranked:
        closest = found.smallest_too_big
        needs = (
            f"{closest.memory.total / GIB:.1f} GiB per GPU ({plan_label(closest.plan)})"
            if closest
            else "-"
        )
        print(
            f"no plan fits: the smallest needs {needs}; allowed: more GPUs "
            f"(hardware.nodes), a smaller run.global_batch or dataset.seq_len, or GPUs with "
            f"more memory"
        )
        return
    print()
    width = max(len(plan_label(one.plan)) for one in shown)
    priced = config.hardware.price_per_device_hour is not None
    cost_column = f"  {'cost/1M tok':>11}" if priced else ""
    columns = f"{'s/step':>8}  {'tokens/s/GPU':>12}  {'MFU':>5}  {'GiB/GPU':>7}{cost_column}  bound"
    print(f"{'#':>3}  {'plan':<{width}}  {columns}")
    for index, one in enumerate(shown, 1):
        step = one.step
        assert step is not None
        cost = cost_per_million_tokens(config, step.tokens_per_s_per_gpu)
        shown_cost = f"  {cost:>11.3f}" if cost is not None else ""
        print(
            f"{index:>3}  {plan_label(one.plan):<{width}}  {step.seconds:>8.3f}  "
            f"{step.tokens_per_s_per_gpu:>12,.0f}  {step.mfu:>5.1%}  "
            f"{one.memory.total / GIB:>7.1f}{shown_cost}  {step.bound}"
        )
    if priced:
        print(
            f"cost in {config.hardware.currency or 'the price unit'} per million tokens at "
            f"{config.hardware.price_per_device_hour} a GPU-hour: every plan uses all "
            f"{world_of(config)} GPUs, so the cheapest is the fastest"
        )
    best = found.ranked[0]
    print()
    if len(tied) > 1:
        print(
            f"tied: the {len(tied)} fastest plans lie within {error.mape:.0%} of one another "
            f"(the source's mean error): the prediction cannot order them; time the first few "
            f"(python -m harness ... run.epochs=1) on the cluster to choose"
        )
    print(f"recommended: {plan_label(best.plan)}: {train_command(config, overrides, best.plan)}")
