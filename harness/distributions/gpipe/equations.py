"""GPipe: Eq. 6.1 (compute) + Eq. 6.2 (communication) of the thesis, per batch.

    T_comp = T_seq * (W + #mb - 1) / (W * #mb)

with T_seq the sequential time of the whole batch trained as #mb micro-batches (so measured at
the micro-batch size: T_seq = #mb * t_mb). With W stages and #mb micro-batches the pipeline
needs W + #mb - 1 steps of one stage's share of a micro-batch, t_mb / W.

    T_comm = 2 * ( sum_{i=1}^{W-2} max_{j<=i} c_j + (#mb - (W-2)) * max_j c_j
                   + sum_{i=2}^{W-1} max_{j>=i} c_j ),   c_j = L_{j,j+1} + mb * A_j / BW_{j,j+1}

The workers move in lock-step, so each step costs its slowest active link: while the pipeline
fills, the links up to i are active; in the full pipeline, all; while it drains, those from i
on. Activations forward and gradients backward cost the same (the factor 2). A_j is the MB of
activations per sample leaving stage j (the output of its last layer). The epoch, over the
plan's real stages, is `harness.distributions.gpipe.epoch_terms`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.config.units import BYTES_PER_MB
from harness.costs.memory import (
    StageFacts,
    WorkerMemory,
    activations_mb,
    backward_temporaries_mb,
    gradients_mb,
    optimizer_state_mb,
)
from harness.profiles.hardware import HardwareProfile


@dataclass(frozen=True)
class StageWork:
    """One stage's compute for one micro-batch (seconds), and its one update per batch."""

    forward_s: float
    backward_s: float
    update_s: float


def schedule_seconds(stages: Sequence[StageWork], micro_batches: int, recomputed: float) -> float:
    """One batch of GPipe's fill-drain schedule over stages of unequal work.

    All micro-batches run forward, then all run backward (torch's ScheduleGPipe). In each
    phase the first micro-batch crosses every stage, and each further one leaves the pipeline
    one slowest-stage time later:  sum_s t_s + (#mb - 1) * max_s t_s. With activation
    recomputation a stage's backward of a micro-batch runs its forward again first
    (`recomputed`: the share of micro-batches that do, `distributions.gpipe.recompute_share`).
    Every stage then updates its weights once, all at the same time. With W equal stages
    (t_s = t / W), no recomputation and no update this is Eq. 6.1: t (W + #mb - 1) / W per
    micro-batch time t.
    """
    forward = [stage.forward_s for stage in stages]
    backward = [recomputed * stage.forward_s + stage.backward_s for stage in stages]
    fill_drain = sum(sum(phase) + (micro_batches - 1) * max(phase) for phase in (forward, backward))
    return fill_drain + max(stage.update_s for stage in stages)


def link_costs(
    boundary_activation_mb: Sequence[float],
    micro_batch_size: int,
    profile: HardwareProfile,
    *,
    bandwidth_scale: float = 1.0,
    burst_bytes: float = 0.0,
) -> list[float]:
    """c_j for the W-1 links between consecutive stages (stage j on worker j); the first
    `burst_bytes` of each transfer pass at once (an emulated link's token bucket:
    `predict.terms.burst_bytes`)."""
    return [
        profile.link(j, j + 1).seconds_for(
            micro_batch_size * mb * BYTES_PER_MB,
            bandwidth_scale=bandwidth_scale,
            burst_bytes=burst_bytes,
        )
        for j, mb in enumerate(boundary_activation_mb)
    ]


def communication_seconds(costs: Sequence[float], micro_batches: int) -> float:
    """Eq. 6.2 for the link costs c_1..c_{W-1} (`costs[0]` is c_1)."""
    if not costs:
        return 0.0
    stages = len(costs) + 1
    c = [0.0, *costs]  # 1-based, as in the equation
    filling = sum(max(c[1 : i + 1]) for i in range(1, stages - 1))
    full = (micro_batches - (stages - 2)) * max(c[1:])
    draining = sum(max(c[i:stages]) for i in range(2, stages))
    return 2 * (filling + full + draining)


def gpipe_activations_mb(
    stage: StageFacts, micro_batch_size: int, micro_batches: int, recompute: str
) -> float:
    """A GPipe stage after the forwards of all #mb micro-batches (its peak, the backwards then
    free them in turn).

    `always`: a checkpointed micro-batch keeps only its stage input (what the recomputation
    starts from) and its output (the pipeline's cache, for the backward); the one being
    recomputed holds its saved activations again. `except_last`: the last micro-batch is not
    checkpointed, so it holds its saved activations (and boundaries), and the others their
    input and output. `never`: every micro-batch holds its saved activations."""
    boundary = micro_batch_size * (stage.input_mb_per_sample + stage.output_mb_per_sample)
    full = activations_mb(stage, micro_batch_size)
    if recompute == "always":
        return micro_batches * boundary + stage.saved_mb(micro_batch_size)
    if recompute == "except_last":
        return (micro_batches - 1) * boundary + full
    if recompute == "never":
        return micro_batches * full
    raise ValueError(f"unknown recompute mode {recompute!r}; allowed: always, except_last, never")


def gpipe_stage_memory(
    stage: StageFacts,
    micro_batch_size: int,
    micro_batches: int,
    recompute: str,
    *,
    optimizer_states: int = 1,
    runtime_mb: float = 0.0,
) -> WorkerMemory:
    """A GPipe stage: its weights, the gradients it accumulates over the micro-batches, its
    momentum, and the micro-batches' activations (`gpipe_activations_mb`)."""
    return WorkerMemory(
        stage.weights_mb,
        gradients_mb(stage.weights_mb),
        optimizer_state_mb(stage.weights_mb, optimizer_states),
        0.0,
        gpipe_activations_mb(stage, micro_batch_size, micro_batches, recompute),
        backward=backward_temporaries_mb(stage, micro_batch_size),
        runtime=runtime_mb,
    )
