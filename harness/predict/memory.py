"""Memory per worker, predicted for every distribution model, to rule out what will not fit.

A worker's peak is the sum of what it holds at the moment its memory peaks: the end of a
forward pass, as the backward pass starts producing gradients. Each term below is one small
function (float32, MB = 10^6 bytes):

- weights P, their gradients G (= P for trainable parameters; produced during the backward
  pass, on top of the activations not yet freed), and the optimizer's state (SGD with
  momentum: one buffer, P; AdamW: two, 2P);
- communication buffers: DDP's gradient buckets (a second copy of the gradients, G), Horovod's
  fusion buffer (min(th, G): only what a fusion fills is touched), a replicated PipeDream
  stage's flattened gradients (G of the stage, for its allreduce);
- activations: what autograd saves for the backward pass, measured per layer
  (`predict.activations`: affine in the batch), plus what a pipeline stage holds per batch in
  flight (its input and output, unless autograd saved them already);
- backward temporaries: while one entry of the layer list runs its backward, its saved
  tensors are still held and the gradients of its inputs and internal tensors are being
  made, about as many bytes again: the largest entry's saved bytes (a whole residual block for
  a ResNet, one layer for a VGG);
- GPipe per recompute mode: `always` keeps each micro-batch's stage input and output, plus one
  micro-batch's saved activations while it is recomputed; `except_last` keeps the last
  micro-batch's saved activations instead of recomputing them; `never` keeps every
  micro-batch's;
- PipeDream: each minibatch in flight on the stage (1F1B's warm-up depth) keeps its
  activations, and each weight version a forward used and an update superseded before its
  backward is a stashed copy of the stage's weights (`stashed_versions`, the trainer's rule);
  and over gloo (CPU) every tensor the stage sent in an epoch is held until the epoch ends:
  gloo's send reports completion only once it is waited for, which the trainer does at the
  epoch's end (`held_sends_mb`);
- the runtime share: what the process holds besides the model (on a CPU the interpreter,
  torch's libraries, the dataset and data loader, measured by `predict.runtime`; on CUDA
  the context), plus what an analysis learnt from other networks' cells (a remainder).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class StageFacts:
    """One worker's part of the network, as the memory terms need it.

    `saved_mb` maps a batch size to the MB autograd saves in a forward of the stage at that
    batch (affine: most of it per sample, BatchNorm's statistics per channel); the boundary
    terms are per sample."""

    weights_mb: float
    saved_mb_per_sample: float  # slope of the saved bytes in the batch
    saved_mb_constant: float = 0.0  # the part that does not grow with the batch
    input_mb_per_sample: float = 0.0  # the activation entering the stage
    output_mb_per_sample: float = 0.0  # the activation leaving it
    held_mb_per_sample: float = 0.0  # input/output kept besides what autograd saved
    largest_entry_mb_per_sample: float = 0.0  # saved by the stage's largest layer-list entry
    largest_entry_mb_constant: float = 0.0

    def saved_mb(self, batch: int) -> float:
        return batch * self.saved_mb_per_sample + self.saved_mb_constant


@dataclass(frozen=True)
class WorkerMemory:
    """One worker's predicted peak, term by term (MB)."""

    weights: float
    gradients: float
    optimizer: float
    buffers: float
    activations: float
    backward: float = 0.0  # backward temporaries
    stashed: float = 0.0
    runtime: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


def gradients_mb(trainable_mb: float) -> float:
    """One gradient per trainable parameter, the size of the parameter. Counted whole at the
    peak: the backward pass allocates them while the activations are still held."""
    return trainable_mb


def optimizer_state_mb(weights_mb: float, states: int) -> float:
    """The optimizer's buffers, each the size of the weights: SGD's momentum (one, none
    without momentum), AdamW's first and second moments (two)."""
    return weights_mb * states


def ddp_buffer_mb(gradient_mb: float) -> float:
    """DDP's buckets are a flat copy of all the gradients, allocated once, kept throughout."""
    return gradient_mb


def horovod_buffer_mb(gradient_mb: float, fusion_threshold_mb: float) -> float:
    """Horovod's fusion buffer is allocated at the threshold, but a fusion fills (touches)
    at most all the gradients: min(th, G); no fusion (th = 0), no buffer."""
    return min(fusion_threshold_mb, gradient_mb) if fusion_threshold_mb > 0 else 0.0


def replica_allreduce_buffer_mb(stage_gradient_mb: float, replicas: int) -> float:
    """A replicated PipeDream stage flattens its gradients into one tensor for the allreduce
    (torch.cat: a copy); an unreplicated stage reduces nothing."""
    return stage_gradient_mb if replicas > 1 else 0.0


def activations_mb(stage: StageFacts, batch: int) -> float:
    """One batch through the stage: what autograd saves, plus the boundary tensors it keeps."""
    return stage.saved_mb(batch) + batch * stage.held_mb_per_sample


def backward_temporaries_mb(stage: StageFacts, batch: int) -> float:
    """The backward of one layer-list entry makes a gradient for each tensor it saved (its
    input's and its internal tensors') while those are still held: the largest entry's saved
    bytes, once (the entries run their backwards one after the other)."""
    return batch * stage.largest_entry_mb_per_sample + stage.largest_entry_mb_constant


def held_sends_mb(stage: StageFacts, batch_size: int, minibatches: int, *, first: bool,
                  last: bool) -> float:
    """What a PipeDream stage sent in an epoch and still holds: its output (to the next
    stage) and its input's gradient (to the previous one), per minibatch, for `minibatches`
    minibatches (over gloo, all of the epoch's: see the module docstring)."""
    per_sample = (0.0 if last else stage.output_mb_per_sample) + \
        (0.0 if first else stage.input_mb_per_sample)
    return minibatches * batch_size * per_sample


def gpipe_activations_mb(stage: StageFacts, micro_batch_size: int, micro_batches: int,
                         recompute: str) -> float:
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
    raise ValueError(f"unknown recompute mode {recompute!r}; allowed: always, except_last, "
                     f"never")


def in_flight_minibatches(replicas: Sequence[int], stage: int) -> int:
    """Minibatches a worker of `stage` holds between forward and backward in 1F1B's steady
    state: its warm-up depth, ceil(workers of stages s.. / replicas of s)."""
    return math.ceil(sum(replicas[stage:]) / replicas[stage])


def stashed_versions(replicas: Sequence[int], stage: int, batches: int = 64) -> int:
    """The most stashed weight copies a worker of `stage` holds at once, by running the
    trainer's rule over its 1F1B op list: a forward needs a stashed copy when a backward (an
    update) comes between it and its own backward; a copy is made once per weight version
    and freed when its last minibatch's backward is done (the newest is kept for reuse)."""
    from harness.distributions.onefoneb import Kind, worker_ops

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


def data_parallel_memory(weights_mb: float, trainable_mb: float, stage: StageFacts,
                         batch_size: int, *, buffer_mb: float, optimizer_states: int = 1,
                         runtime_mb: float = 0.0) -> WorkerMemory:
    """Sequential (no buffer), Horovod and DDP: a whole replica trains a whole batch."""
    return WorkerMemory(weights_mb, gradients_mb(trainable_mb),
                        optimizer_state_mb(weights_mb, optimizer_states), buffer_mb,
                        activations_mb(stage, batch_size),
                        backward=backward_temporaries_mb(stage, batch_size), runtime=runtime_mb)


def gpipe_stage_memory(stage: StageFacts, micro_batch_size: int, micro_batches: int,
                       recompute: str, *, optimizer_states: int = 1,
                       runtime_mb: float = 0.0) -> WorkerMemory:
    """A GPipe stage: its weights, the gradients it accumulates over the micro-batches, its
    momentum, and the micro-batches' activations (`gpipe_activations_mb`)."""
    return WorkerMemory(stage.weights_mb, gradients_mb(stage.weights_mb),
                        optimizer_state_mb(stage.weights_mb, optimizer_states), 0.0,
                        gpipe_activations_mb(stage, micro_batch_size, micro_batches,
                                             recompute),
                        backward=backward_temporaries_mb(stage, micro_batch_size),
                        runtime=runtime_mb)


def pipedream_stage_memory(stage: StageFacts, batch_size: int, replicas: Sequence[int],
                           index: int, *, held_sends: int = 0, optimizer_states: int = 1,
                           runtime_mb: float = 0.0) -> WorkerMemory:
    """A PipeDream stage replica: one batch's activations per minibatch in flight, one copy
    of the stage's weights per stashed version, a replicated stage's allreduce buffer, and
    the tensors of `held_sends` minibatches it sent and still holds (`held_sends_mb`)."""
    in_flight = in_flight_minibatches(replicas, index)
    sent = held_sends_mb(stage, batch_size, held_sends, first=index == 0,
                         last=index == len(replicas) - 1)
    return WorkerMemory(stage.weights_mb, gradients_mb(stage.weights_mb),
                        optimizer_state_mb(stage.weights_mb, optimizer_states),
                        replica_allreduce_buffer_mb(stage.weights_mb, replicas[index]) + sent,
                        in_flight * activations_mb(stage, batch_size),
                        backward=backward_temporaries_mb(stage, batch_size),
                        stashed=stashed_versions(replicas, index) * stage.weights_mb,
                        runtime=runtime_mb)


def fits(predicted_mb: Sequence[float], device_memory_gb: float | None) -> bool:
    """Whether every worker fits its device; unknown device memory rules nothing out."""
    return device_memory_gb is None or max(predicted_mb) <= device_memory_gb * 1000
