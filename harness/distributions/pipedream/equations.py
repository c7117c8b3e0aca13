"""PipeDream: a time model for 1F1B with replicated stages (the thesis built none).

A minibatch flows through the S stages; stage s runs on r_s replicas and round-robin routing
gives each replica every r_s-th minibatch. In the steady state of 1F1B every stage alternates
one forward and one backward, each followed by this implementation's weight update (and, on a
replicated stage, the allreduce of its gradients among its replicas). A minibatch's work on
stage s is therefore

    w_s = f_s + b_s + u_s        (compute: forward, backward, update)
    x_s = 2 * (c_in(s) + c_out(s)) + AR_s(r_s)   (communication: activations in and out,
                                                  their gradients back, the replicas' allreduce)

and the pipeline delivers one minibatch every

    I = max_s (w_s + x_s) / r_s

(the replicas of a stage share its minibatches). The first minibatch needs the whole pipeline
depth, sum_s w_s + 2 * sum_boundaries c_j, before the steady state takes over. Each replica of
the bottleneck stage b (the argmax of I) then trains its N / r_b minibatches one after another,
and its first r_b minibatches start together, so an epoch of N minibatches takes

    T = (sum_s w_s + 2 * sum_j c_j) + (N / r_b - 1) * (w_b + x_b) + AR_b(r_b)

(the depth holds no allreduce: the first minibatch's is the last term). With r_b = 1 this is
depth + (N - 1) * I. Counting the depth and then N - 1 intervals I for a replicated bottleneck,
as this model did before, over-counts w_b and its transfers by (1 - 1/r_b) of them and under-counts
AR_b / r_b: on the kept emulated calibration (8 minibatches an epoch) PipeDream `2` of VGG-16 at
100 Mbit/s was 10 % under its measurement, ResNet-50's at 1 Gbit/s 10 % over
(docs/benchmarks/2026-11-29-pipedream-replicated-epoch.md, "A replicated stage's epoch counted per
replica (2026-11-29)").

The fill at the start and the drain at the end of 1F1B's warm-up are this depth once: the
warm-up's extra forwards are done while the first minibatch still travels. The bottleneck
stage b (the argmax of I) is chosen with the raw costs; the epoch time is then split into its
compute part and its communication part, so that `harness.analysis` can scale each with a
fitted factor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.config.units import BYTES_PER_MB
from harness.costs.allreduce import ring_allreduce_seconds
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
class PipelineStage:
    """One stage of a PipeDream plan, per minibatch."""

    compute_s: float  # w_s: forward + backward + update of the stage's layers
    replicas: int  # r_s
    weights_mb: float  # the stage's parameters: what its replicas allreduce
    output_mb: float  # activations leaving the stage for the next one (0 for the last)


@dataclass(frozen=True)
class EpochSplit:
    """An epoch's predicted seconds, as compute and communication parts (the latter as
    activation transfers between stages and allreduces among a stage's replicas)."""

    compute_s: float
    transfer_s: float
    allreduce_s: float = 0.0
    # MB of gradients the bottleneck's replica flattens into its allreduce's one message
    # (and reads back out) in the epoch: its weights once per minibatch it trains, 0 where
    # the bottleneck is not replicated (the model's `FLATTEN` term prices them).
    flattened_mb: float = 0.0

    @property
    def communication_s(self) -> float:
        return self.transfer_s + self.allreduce_s

    @property
    def seconds(self) -> float:
        return self.compute_s + self.communication_s


def boundary_seconds(
    stages: Sequence[PipelineStage], profile: HardwareProfile, *, burst_bytes: float = 0.0
) -> list[float]:
    """c_j, one transfer of a minibatch's activations from stage j to stage j+1 (between the
    first workers of the two stages: replicas of a stage are on neighbouring workers); the
    first `burst_bytes` of each pass at once (`predict.terms.burst_bytes`)."""
    starts = _first_workers(stages)
    return [
        profile.link(starts[j], starts[j + 1]).seconds(
            stages[j].output_mb * BYTES_PER_MB, burst_bytes=burst_bytes
        )
        for j in range(len(stages) - 1)
    ]


def stage_transfer_seconds(
    stages: Sequence[PipelineStage], boundaries: Sequence[float]
) -> list[float]:
    """2 (c_in + c_out) for every stage: its activations in and out, their gradients back."""
    return [
        2
        * ((boundaries[s - 1] if s > 0 else 0.0) + (boundaries[s] if s < len(stages) - 1 else 0.0))
        for s in range(len(stages))
    ]


def stage_allreduce_seconds(
    stages: Sequence[PipelineStage], profile: HardwareProfile
) -> list[float]:
    """AR_s for every stage: one allreduce of its gradients among its replicas (the trainer
    flattens them into one message). The probe's measured allreduce among that many workers
    when the profile has one, else the ring over the stage's links."""
    starts = _first_workers(stages)
    result = []
    for s, stage in enumerate(stages):
        if stage.replicas < 2:
            result.append(0.0)
            continue
        try:
            cost = profile.allreduce_cost(stage.replicas)
            result.append(cost.seconds(stage.weights_mb * BYTES_PER_MB))
        except KeyError:
            result.append(
                ring_allreduce_seconds(
                    profile, stage.replicas, stage.weights_mb, first_rank=starts[s]
                )
            )
    return result


def stage_communication_seconds(
    stages: Sequence[PipelineStage], boundaries: Sequence[float], profile: HardwareProfile
) -> list[float]:
    """x_s for every stage: 2 (c_in + c_out) plus the allreduce among its replicas."""
    return [
        transfer + allreduce
        for transfer, allreduce in zip(
            stage_transfer_seconds(stages, boundaries), stage_allreduce_seconds(stages, profile)
        )
    ]


def epoch_split(
    stages: Sequence[PipelineStage],
    minibatches: int,
    profile: HardwareProfile,
    *,
    burst_bytes: float = 0.0,
) -> EpochSplit:
    """T = depth + (N - 1) * I, split into compute and communication (module docstring);
    `burst_bytes`: what an emulated link lets through at once (`boundary_seconds`)."""
    if minibatches < 1:
        return EpochSplit(0.0, 0.0)
    boundaries = boundary_seconds(stages, profile, burst_bytes=burst_bytes)
    transfers = stage_transfer_seconds(stages, boundaries)
    allreduces = stage_allreduce_seconds(stages, profile)
    bottleneck = max(
        range(len(stages)),
        key=lambda s: (stages[s].compute_s + transfers[s] + allreduces[s]) / stages[s].replicas,
    )
    # Each replica of the bottleneck trains its N / r minibatches one after another: after the
    # first one's depth, N / r - 1 more of its periods (r = 1: the N - 1 intervals). Its first
    # r minibatches start together, so the depth counts one of them, not r. Every minibatch
    # on a replica ends in the replicas' allreduce, the first one's too (the depth has none).
    per_replica = minibatches / stages[bottleneck].replicas
    compute = (
        sum(stage.compute_s for stage in stages) + (per_replica - 1) * stages[bottleneck].compute_s
    )
    transfer = 2 * sum(boundaries) + (per_replica - 1) * transfers[bottleneck]
    flattened = (
        per_replica * stages[bottleneck].weights_mb if stages[bottleneck].replicas > 1 else 0.0
    )
    return EpochSplit(compute, transfer, per_replica * allreduces[bottleneck], flattened)


def _first_workers(stages: Sequence[PipelineStage]) -> list[int]:
    """The rank of each stage's first replica: stages take consecutive ranks, in order."""
    starts, rank = [], 0
    for stage in stages:
        starts.append(rank)
        rank += stage.replicas
    return starts


def replica_allreduce_buffer_mb(stage_gradient_mb: float, replicas: int) -> float:
    """A replicated PipeDream stage flattens its gradients into one tensor for the allreduce
    (torch.cat: a copy); an unreplicated stage reduces nothing."""
    return stage_gradient_mb if replicas > 1 else 0.0


def held_sends_mb(
    stage: StageFacts, batch_size: int, minibatches: int, *, first: bool, last: bool
) -> float:
    """What a PipeDream stage sent in an epoch and still holds: its output (to the next
    stage) and its input's gradient (to the previous one), per minibatch, for `minibatches`
    minibatches (over gloo, all of the epoch's: see the module docstring)."""
    per_sample = (0.0 if last else stage.output_mb_per_sample) + (
        0.0 if first else stage.input_mb_per_sample
    )
    return minibatches * batch_size * per_sample


def in_flight_minibatches(replicas: Sequence[int], stage: int) -> int:
    """Minibatches a worker of `stage` holds between forward and backward in 1F1B's steady
    state: its warm-up depth, ceil(workers of stages s.. / replicas of s)."""
    return math.ceil(sum(replicas[stage:]) / replicas[stage])


def stashed_versions(replicas: Sequence[int], stage: int, batches: int = 64) -> int:
    """The most stashed weight copies a worker of `stage` holds at once, by running the
    trainer's rule over its 1F1B op list: a forward needs a stashed copy when a backward (an
    update) comes between it and its own backward; a copy is made once per weight version
    and freed when its last minibatch's backward is done (the newest is kept for reuse)."""
    from harness.costs.onefoneb import Kind, worker_ops

    ops = worker_ops(list(replicas), stage, 0, batches)
    needs_copy = set()
    open_forwards: set[int] = set()
    for op in ops:
        if op.kind is Kind.forward:
            open_forwards.add(op.minibatch)
        else:
            open_forwards.discard(op.minibatch)
            needs_copy |= open_forwards
            open_forwards.clear()
    version, newest, users, most = 0, None, {}, 0
    for op in ops:
        if op.kind is Kind.forward and op.minibatch in needs_copy:
            users[op.minibatch] = version
            newest = version
            most = max(most, len(set(users.values()) | {newest}))
        elif op.kind is Kind.backward:
            users.pop(op.minibatch, None)
            version += 1
    return most


def pipedream_stage_memory(
    stage: StageFacts,
    batch_size: int,
    replicas: Sequence[int],
    index: int,
    *,
    held_sends: int = 0,
    optimizer_states: int = 1,
    runtime_mb: float = 0.0,
) -> WorkerMemory:
    """A PipeDream stage replica: one batch's activations per minibatch in flight, one copy
    of the stage's weights per stashed version, a replicated stage's allreduce buffer, and
    the tensors of `held_sends` minibatches it sent and still holds (`held_sends_mb`)."""
    in_flight = in_flight_minibatches(replicas, index)
    sent = held_sends_mb(
        stage, batch_size, held_sends, first=index == 0, last=index == len(replicas) - 1
    )
    return WorkerMemory(
        stage.weights_mb,
        gradients_mb(stage.weights_mb),
        optimizer_state_mb(stage.weights_mb, optimizer_states),
        replica_allreduce_buffer_mb(stage.weights_mb, replicas[index]) + sent,
        in_flight * activations_mb(stage, batch_size),
        backward=backward_temporaries_mb(stage, batch_size),
        stashed=stashed_versions(replicas, index) * stage.weights_mb,
        runtime=runtime_mb,
    )
