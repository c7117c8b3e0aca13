"""Per-layer profile of a network's layer list on one device: what the partitioners balance.

Each layer is timed on the output of the previous one, forward and backward separately
(device synchronised around every timing), after warm-up runs, as the median of repeats. The
backward of a layer is timed with its input requiring grad, as inside a pipeline, where every
stage but the first sends gradients upstream. Output activation and parameter sizes are
recorded too: they are the A_i and W_i of the performance models (SPEC Table 5.1).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn

from harness.metrics import BYTES_PER_MB, synchronize

MS_PER_S = 1000.0


@dataclass(frozen=True)
class LayerProfile:
    index: int
    type: str
    forward_ms: float  # median over the repeats, for the profiled batch
    backward_ms: float
    activation_mb: float  # the layer's output for the profiled batch
    parameter_mb: float

    @property
    def compute_ms(self) -> float:
        return self.forward_ms + self.backward_ms


@dataclass(frozen=True)
class NetworkProfile:
    batch_size: int
    device: str
    layers: list[LayerProfile]

    def compute_ms(self) -> list[float]:
        return [layer.compute_ms for layer in self.layers]

    def to_dict(self) -> dict[str, object]:
        return {"batch_size": self.batch_size, "device": self.device,
                "layers": [asdict(layer) for layer in self.layers]}


def profile_layers(layers: Sequence[nn.Module], sample: torch.Tensor, *,
                   warmup: int = 2, repeats: int = 5) -> NetworkProfile:
    """Profile `layers` (in order) on `sample`, a batch on the device the layers live on.

    Gradients are cleared and buffers (BatchNorm running statistics) restored afterwards, so
    profiling a model that is about to be trained changes nothing but the time spent.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    device = sample.device
    profiles = []
    activation = sample.detach()
    for index, layer in enumerate(layers):
        needs_input_grad = index > 0  # stage inputs after the first carry gradients back
        forward, backward = [], []
        saved_buffers = [buffer.detach().clone() for buffer in layer.buffers()]
        for run in range(warmup + repeats):
            leaf = activation.detach().requires_grad_(needs_input_grad and
                                                      activation.is_floating_point())
            # A copy: in-place layers (ReLU(inplace=True)) must not modify `activation`, nor a
            # leaf that requires grad, which autograd forbids.
            x = leaf.clone()
            synchronize(device)
            start = time.perf_counter()
            y = layer(x)
            synchronize(device)
            middle = time.perf_counter()
            if y.requires_grad:
                y.backward(torch.ones_like(y))
            synchronize(device)
            end = time.perf_counter()
            if run >= warmup:
                forward.append((middle - start) * MS_PER_S)
                backward.append((end - middle) * MS_PER_S)
        layer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for buffer, saved in zip(layer.buffers(), saved_buffers):
                buffer.copy_(saved)
        activation = y.detach()
        profiles.append(LayerProfile(
            index=index, type=type(layer).__name__,
            forward_ms=statistics.median(forward), backward_ms=statistics.median(backward),
            activation_mb=activation.numel() * activation.element_size() / BYTES_PER_MB,
            parameter_mb=sum(p.numel() * p.element_size() for p in layer.parameters())
            / BYTES_PER_MB,
        ))
    return NetworkProfile(batch_size=sample.shape[0], device=str(device), layers=profiles)
