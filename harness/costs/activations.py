"""What autograd really keeps for the backward pass, per entry of a network's layer list.

The layer list (`workloads.networks.to_layer_list`) is what pipelines partition, but its
entries are coarse: a ResNet's entry is a whole residual block, whose forward saves the
inputs of each convolution, each BatchNorm and each activation inside it, and a max-pool saves
its int64 indices besides its input. Counting each entry's *output* as its activation memory
(what `harness.describe` traces on the meta device) misses most of it. So the bytes are
measured (`harness.measure.saved_activations`): one forward pass of a small real batch on the
CPU, in train mode, under `torch.autograd.graph.saved_tensors_hooks`, which sees every tensor
autograd saves.

Counting rules:

- a tensor is counted by its storage, once, however many views of it are saved (an in-place
  ReLU's result is the storage of its input, a Flatten's output that of the pooling before);
- the parameters and buffers are not activations (they are the weights), and are left out;
- a storage is charged to the layer that saves it; when a later layer saves it again (a
  convolution saving its input, which the ReLU before it already saved), that layer records
  which earlier layer saved it last, so that any contiguous range of layers (a pipeline stage)
  counts each storage once, and a stage whose first layer saves its input (the activation it
  received) counts that input: `stage_saved_mb`;
- the loss (CrossEntropy's log-softmax) is charged to the last layer.

Saved bytes are affine in the batch: most tensors hold one slice per sample, while
BatchNorm's saved mean and inverse deviation are per channel, whatever the batch. Measuring
at two batch sizes (1 and 2, or 2 and 4 where a batch of 1 cannot train, e.g. BatchNorm on a
1x1 map) separates the per-sample slope from that constant part, per group; tests check that
the affine form predicts a third batch exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NO_SAVER = -1  # a storage no earlier layer saved


@dataclass(frozen=True)
class SavedGroup:
    """Part of one layer's saved bytes: the storages whose latest earlier saver is
    `previous_saver` (NO_SAVER: new to this layer)."""

    previous_saver: int
    mb_per_sample: float
    mb_constant: float = 0.0

    def mb(self, batch: int) -> float:
        return batch * self.mb_per_sample + self.mb_constant


@dataclass(frozen=True)
class LayerSaved:
    """What one entry of the layer list keeps for the backward pass (float MB)."""

    groups: tuple[SavedGroup, ...]
    output_mb_per_sample: float  # the entry's output: what crosses a pipeline boundary
    saves_input: bool  # whether the entry's own forward saves the tensor it was given
    output_saver: int  # latest layer (<= this one) that saved the output's storage, or -1

    def mb_per_sample(self) -> float:
        """Saved MB per sample of this layer alone (its input included if it saves it)."""
        return sum(group.mb_per_sample for group in self.groups)

    def mb_constant(self) -> float:
        return sum(group.mb_constant for group in self.groups)


@dataclass(frozen=True)
class SavedActivations:
    """Per layer saved bytes of one (network, dataset), and how they were measured."""

    layers: tuple[LayerSaved, ...]
    input_mb_per_sample: float
    batches: tuple[int, int]
    seconds: float


def stage_saved_mb(layers: Sequence[LayerSaved], first: int, end: int, batch: int) -> float:
    """MB autograd holds after the forward of layers [first, end) at `batch` samples: every
    storage saved by a layer of the range, once (module docstring)."""
    total = 0.0
    for layer in layers[first:end]:
        total += sum(group.mb(batch) for group in layer.groups if group.previous_saver < first)
    return total


def stage_boundary_mb(
    layers: Sequence[LayerSaved], first: int, end: int, input_mb_per_sample: float
) -> tuple[float, float]:
    """Per sample MB a stage [first, end) holds per batch in flight besides what autograd
    saves: its input, unless its first layer saves it, and its output, unless a layer of the
    stage saved that storage (a pipeline keeps both until the batch's backward)."""
    entering = input_mb_per_sample if first == 0 else layers[first - 1].output_mb_per_sample
    held_input = 0.0 if layers[first].saves_input else entering
    held_output = (
        0.0 if layers[end - 1].output_saver >= first else layers[end - 1].output_mb_per_sample
    )
    return held_input, held_output
