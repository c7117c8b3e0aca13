"""The plan search: price every plan (`space`), keep those that fit, rank by step time, and say
which are tied within the source's error."""

from __future__ import annotations

from dataclasses import dataclass

from harness.costs.plan_step import (
    Cluster,
    MemoryPrediction,
    PlanShape,
    StepPrediction,
    predict_memory,
    predict_step,
)
from harness.costs.transformer import TransformerShape
from harness.predict.plans.space import plans


@dataclass(frozen=True)
class PricedPlan:
    plan: PlanShape
    memory: MemoryPrediction
    step: StepPrediction | None  # None: it does not fit, so it is not timed

    @property
    def fits(self) -> bool:
        return self.step is not None


@dataclass(frozen=True)
class Search:
    """What the search found: the plans that fit, fastest first, and how many were priced."""

    ranked: list[PricedPlan]
    priced: int
    too_big: int
    smallest_too_big: PricedPlan | None  # the plan that came closest to fitting, when none did


def price(shape: TransformerShape, plan: PlanShape, cluster: Cluster) -> PricedPlan:
    """One plan's memory and, where it fits, its step."""
    memory = predict_memory(shape, plan)
    if memory.total > cluster.memory_bytes:
        return PricedPlan(plan, memory, None)
    return PricedPlan(plan, memory, predict_step(shape, plan, cluster))


def search(
    shape: TransformerShape,
    cluster: Cluster,
    world: int,
    global_batch: int,
    optimizer_states: int = 2,
) -> Search:
    """Every plan of `world` GPUs at `global_batch`, those that fit ranked by step time."""
    fitting: list[PricedPlan] = []
    priced = too_big = 0
    closest: PricedPlan | None = None
    for plan in plans(shape, cluster, world, global_batch, optimizer_states):
        priced += 1
        one = price(shape, plan, cluster)
        if one.fits:
            fitting.append(one)
            continue
        too_big += 1
        if closest is None or one.memory.total < closest.memory.total:
            closest = one
    fitting.sort(key=lambda one: (one.step.seconds if one.step else 0.0, one.memory.total))
    return Search(fitting, priced, too_big, closest if not fitting else None)


def tied_with_best(ranked: list[PricedPlan], error: float) -> list[PricedPlan]:
    """The plans whose predicted step lies within `error` (a share) of the fastest's: what
    the prediction cannot tell apart from it."""
    if not ranked or ranked[0].step is None:
        return []
    best = ranked[0].step.seconds
    return [
        one for one in ranked if one.step is not None and one.step.seconds <= best * (1 + error)
    ]
