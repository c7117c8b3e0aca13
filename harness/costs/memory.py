"""Memory per worker, predicted for every distribution model, to rule out what will not fit.

A worker's peak is the sum of what it holds at the moment its memory peaks: the end of a
forward pass, as the backward pass starts producing gradients. Each term below is one small
function (float32, MB = 10^6 bytes); the terms every model shares are here, a model's own
live in its package (`ddp_buffer_mb`, `horovod_buffer_mb` in the spec; GPipe's and
PipeDream's stage memory in their `equations`):

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
  a ResNet, one layer for a VGG), on a CPU. On CUDA none (`held_on_the_device`): each
  entry's saved tensors are freed as its backward runs and the caching allocator hands their
  blocks to the next gradients, so the backward peaked 8-56 MB above the forward's end whatever the
  batch, within the gradients counted whole (on an H200, four networks at batches 32 and 128:
  docs/benchmarks/2026-11-25-cuda-h100-h200.md, "Where the CUDA peak comes from (one H200,
  2026-11-28)");
- on CUDA, the starting weights: a copy of each worker's weights and buffers, taken when its
  trainer is built, from which every repeat starts (`distributions.state.InitialState`; the
  optimizer's state is empty then: momentum is made at the first step). A CPU worker holds the copy
  too, but its resident set was predicted no better with it
  (docs/benchmarks/2026-12-01-cuda-allocator-history.md, "The memory model against the CUDA
  allocator's history (one H200, 2026-12-01)"): what the CPU cells teach stays in the fitted
  remainder there;
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
  the context, and the workspaces cuBLAS and cuBLASLt keep in torch's allocator), plus
  what an analysis learnt from other networks' cells (a remainder).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace


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
    initial: float = 0.0  # the starting weights' copy (`held_on_the_device`)

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


def activations_mb(stage: StageFacts, batch: int) -> float:
    """One batch through the stage: what autograd saves, plus the boundary tensors it keeps."""
    return stage.saved_mb(batch) + batch * stage.held_mb_per_sample


def backward_temporaries_mb(stage: StageFacts, batch: int) -> float:
    """The backward of one layer-list entry makes a gradient for each tensor it saved (its
    input's and its internal tensors') while those are still held: the largest entry's saved
    bytes, once (the entries run their backwards one after the other)."""
    return batch * stage.largest_entry_mb_per_sample + stage.largest_entry_mb_constant


def data_parallel_memory(
    weights_mb: float,
    trainable_mb: float,
    stage: StageFacts,
    batch_size: int,
    *,
    buffer_mb: float,
    optimizer_states: int = 1,
    runtime_mb: float = 0.0,
) -> WorkerMemory:
    """Sequential (no buffer), Horovod and DDP: a whole replica trains a whole batch."""
    return WorkerMemory(
        weights_mb,
        gradients_mb(trainable_mb),
        optimizer_state_mb(weights_mb, optimizer_states),
        buffer_mb,
        activations_mb(stage, batch_size),
        backward=backward_temporaries_mb(stage, batch_size),
        runtime=runtime_mb,
    )


def held_on_the_device(worker: WorkerMemory, *, cuda: bool) -> WorkerMemory:
    """On CUDA, what every model's worker holds besides its model's own terms (module
    docstring): the copy of its starting weights (the size of the weights it holds), and no
    backward temporaries. Both read off the CUDA allocator's history of real cells on an H200
    (docs/benchmarks/2026-12-01-cuda-allocator-history.md, "The memory model against the CUDA
    allocator's history (one H200, 2026-12-01)"); a CPU worker's terms are returned as they
    are."""
    if not cuda:
        return worker
    return replace(worker, initial=worker.weights, backward=0.0)


def fits(predicted_mb: Sequence[float], device_memory_gb: float | None) -> bool:
    """Whether every worker fits its device; unknown device memory rules nothing out."""
    return device_memory_gb is None or max(predicted_mb) <= device_memory_gb * 1000
