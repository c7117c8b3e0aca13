"""Splitting a network's layer list into pipeline stages.

A stage is a contiguous run of layers; the pipeline runs at the pace of its slowest stage, so
the GPipe partitioner minimises the largest stage time (forward + backward, as profiled by
`harness.measure.profiler`). PipeDream additionally replicates stages (data parallelism inside a
stage): its planner follows the PipeDream paper's dynamic programme, where a stage replicated `r`
times takes `max(compute, allreduce) / r` per minibatch and a stage boundary costs the transfer of
the activations forward and their gradients backward.

Everything here is pure: costs in, plan out, so the planner is testable with hand-made
profiles and usable without any process group (`python -m harness.plan`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MS_PER_S = 1000.0


@dataclass(frozen=True)
class Stage:
    """Layers [first, first + layers) of the layer list, trained by `replicas` workers."""

    first: int
    layers: int
    replicas: int = 1

    @property
    def end(self) -> int:
        return self.first + self.layers


@dataclass(frozen=True)
class StagePlan:
    """Stages in pipeline order; workers are assigned stage by stage in rank order."""

    stages: tuple[Stage, ...]

    @classmethod
    def of(cls, balance: Sequence[int], replicas: Sequence[int] | None = None) -> StagePlan:
        replicas = list(replicas) if replicas is not None else [1] * len(balance)
        if len(replicas) != len(balance):
            raise ValueError(
                f"{len(balance)} stages in the balance but {len(replicas)} replica counts"
            )
        starts = [sum(balance[:i]) for i in range(len(balance))]
        return cls(
            tuple(
                Stage(first, layers, count)
                for first, layers, count in zip(starts, balance, replicas)
            )
        )

    @property
    def balance(self) -> list[int]:
        return [stage.layers for stage in self.stages]

    @property
    def replicas(self) -> list[int]:
        return [stage.replicas for stage in self.stages]

    @property
    def workers(self) -> int:
        return sum(self.replicas)

    @property
    def replica_lcm(self) -> int:
        """The batch count every replica of every stage shares evenly is a multiple of this."""
        return math.lcm(*self.replicas)

    def describe(self) -> str:
        """Compact form for records, e.g. '2x[0:12]-1x[12:20]'."""
        return "-".join(f"{s.replicas}x[{s.first}:{s.end}]" for s in self.stages)

    def stage_string(self) -> str:
        """The `distribution.stages` form: replica counts, e.g. '2-1'."""
        return "-".join(str(count) for count in self.replicas)

    def stage_of(self, rank: int) -> tuple[int, int]:
        """(stage index, replica index within the stage) of worker `rank`."""
        first = 0
        for index, stage in enumerate(self.stages):
            if rank < first + stage.replicas:
                return index, rank - first
            first += stage.replicas
        raise ValueError(f"rank {rank} is outside the plan's {self.workers} workers")

    def ranks_of(self, stage: int) -> list[int]:
        """The workers of stage `stage`, in replica order."""
        first = sum(self.replicas[:stage])
        return list(range(first, first + self.replicas[stage]))

    def to_dict(self) -> dict[str, object]:
        return {
            "stages": self.stage_string(),
            "balance": self.balance,
            "layers": [[s.first, s.end] for s in self.stages],
            "plan": self.describe(),
        }


def parse_stages(text: str) -> list[int]:
    """'2-1-1' -> [2, 1, 1]; ValueError says what is allowed."""
    try:
        counts = [int(part) for part in str(text).split("-")]
    except ValueError:
        counts = []
    if not counts or any(count < 1 for count in counts):
        raise ValueError("allowed: replica counts of 1 or more joined by '-', e.g. '2-1-1'")
    return counts


def check_balance(balance: Sequence[int], num_layers: int, stages: int) -> list[int]:
    """A given `distribution.balance`, checked against the layer list and the stage count."""
    balance = list(balance)
    if len(balance) != stages or sum(balance) != num_layers or min(balance) < 1:
        raise ValueError(
            f"distribution.balance={balance} is invalid: needs {stages} layer counts of 1 or "
            f"more that sum to the network's {num_layers} layers"
        )
    return balance


def balanced_partition(costs: Sequence[float], stages: int) -> list[int]:
    """Layers per stage that minimise the largest stage cost (contiguous, each stage >= 1 layer).

    Exact dynamic programme over (first i layers, k stages); among equal optima each stage
    starts at the earliest layer that keeps the optimum (working from the last stage back),
    which keeps the result deterministic.
    """
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot split {n} layers into {stages} stages (1 to {n} allowed)")
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    # best[k][i]: smallest max stage cost of the first i layers in k stages; cut[k][i]: the
    # start of the k-th stage in that optimum.
    best = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i] - 1e-12:
                    best[k][i], cut[k][i] = value, j
    balance, end = [], n
    for k in range(stages, 0, -1):
        start = cut[k][end]
        balance.append(end - start)
        end = start
    return balance[::-1]


@dataclass(frozen=True)
class LinkModel:
    """What the PipeDream planner assumes about communication (one bandwidth for all links)."""

    bandwidth_mbps: float = 10_000.0  # MB/s

    def transfer_ms(self, megabytes: float) -> float:
        return megabytes / self.bandwidth_mbps * MS_PER_S

    def allreduce_ms(self, megabytes: float, replicas: int) -> float:
        """Ring allreduce of `megabytes` over `replicas` workers."""
        return 2 * (replicas - 1) / replicas * self.transfer_ms(megabytes)


def plan_pipedream(
    compute_ms: Sequence[float],
    parameter_mb: Sequence[float],
    activation_mb: Sequence[float],
    workers: int,
    link: LinkModel = LinkModel(),
) -> StagePlan:
    """PipeDream's partitioning: stages and replica counts that minimise the slowest step.

    A stage of layers [i, j) on r replicas costs max(compute, allreduce of its weights) / r per
    minibatch (each replica trains every r-th minibatch; the allreduce overlaps compute); the
    boundary after layer j-1 costs 2 x the transfer of its activations (forward and backward).
    The pipeline's time per minibatch is the largest of these; all `workers` are used.
    Ties prefer fewer stages, then earlier cuts.
    """
    n = len(compute_ms)
    if not (len(parameter_mb) == len(activation_mb) == n) or n == 0:
        raise ValueError("compute_ms, parameter_mb and activation_mb need one value per layer")
    if workers < 1:
        raise ValueError(f"workers={workers}: need at least 1")
    prefix_c, prefix_p = [0.0], [0.0]
    for c, p in zip(compute_ms, parameter_mb):
        prefix_c.append(prefix_c[-1] + c)
        prefix_p.append(prefix_p[-1] + p)

    def stage_ms(i: int, j: int, r: int) -> float:
        compute = prefix_c[j] - prefix_c[i]
        return max(compute, link.allreduce_ms(prefix_p[j] - prefix_p[i], r)) / r

    # best[j][w]: (time, stages, plan) for layers [0, j) on exactly w workers.
    best: dict[tuple[int, int], tuple[float, int, tuple[Stage, ...]]] = {}
    for j in range(1, n + 1):
        for w in range(1, workers + 1):
            candidate: tuple[float, int, tuple[Stage, ...]] = (
                stage_ms(0, j, w),
                1,
                (Stage(0, j, w),),
            )
            for i in range(1, j):
                boundary = 2 * link.transfer_ms(activation_mb[i - 1])
                for r in range(1, w):
                    previous = best.get((i, w - r))
                    if previous is None:
                        continue
                    value = max(previous[0], boundary, stage_ms(i, j, r))
                    option = (value, previous[1] + 1, previous[2] + (Stage(i, j - i, r),))
                    if _better(option, candidate):
                        candidate = option
            best[(j, w)] = candidate
    return StagePlan(best[(n, workers)][2])


def _better(
    option: tuple[float, int, tuple[Stage, ...]], current: tuple[float, int, tuple[Stage, ...]]
) -> bool:
    """Strictly faster, or as fast (within rounding) with fewer stages."""
    if option[0] < current[0] - 1e-9:
        return True
    return abs(option[0] - current[0]) <= 1e-9 and option[1] < current[1]
