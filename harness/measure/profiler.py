"""Per-layer profile of a network's layer list on one device: what the partitioners balance.

Each layer is timed on the output of the previous one, forward, backward and an optimizer step
separately (device synchronised around every timing), after warm-up runs, as the median of
repeats (fewer of both once steady, with a `spread`: `harness.measure.timing_rule.ProbeLength`). The
update matters for balancing: PipeDream updates every stage after every minibatch, and an update
costs in proportion to the weights, not to the compute. The backward of a layer is timed with
its input requiring grad, as inside a pipeline, where every stage but the first sends gradients
upstream. Output activation and parameter sizes are recorded too: they are the A_i and W_i of
the performance models (Table 5.1, docs/thesis.md).

Profiling a large network takes tens of seconds: it says so when it starts and shows its
progress over the layers (`workloads.progress`: a bar on a terminal, lines in a file).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch
from torch import nn

from harness.config.units import BYTES_PER_MB
from harness.measure.metrics import device_time, median_seconds
from harness.measure.timing_rule import ProbeLength
from harness.profiles.network import LayerProfile, NetworkProfile
from workloads.progress import say, steps

MS_PER_S = 1000.0


def profile_layers(
    layers: Sequence[nn.Module],
    sample: torch.Tensor,
    *,
    warmup: int = 2,
    repeats: int = 5,
    spread: float = 0.0,
) -> NetworkProfile:
    """Profile `layers` (in order) on `sample`, a batch on the device the layers live on: each
    layer's forward and backward run at most `warmup` times untimed, then `repeats` timed,
    fewer once steady within `spread` (0: always all; `harness.measure.timing_rule.ProbeLength`).

    Gradients are cleared and buffers (BatchNorm running statistics) restored afterwards, so
    profiling a model that is about to be trained changes nothing but the time spent.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    device = sample.device
    say(
        f"profiling {len(layers)} layers at batch {sample.shape[0]} on {device} "
        f"({warmup + repeats} passes each{', fewer once steady' if spread > 0 else ''})"
    )
    profiles = []
    activation = sample.detach()
    with steps(len(layers), "profiling layers", "layer(s)") as shown:
        for index, layer in enumerate(layers):
            profile, activation = _profile_layer(
                index, layer, activation, ProbeLength(warmup, repeats, spread)
            )
            profiles.append(profile)
            shown.update()
    return NetworkProfile(batch_size=sample.shape[0], device=str(device), layers=profiles)


def _profile_layer(
    index: int, layer: nn.Module, activation: torch.Tensor, length: ProbeLength
) -> tuple[LayerProfile, torch.Tensor]:
    """One layer's profile on `activation` (the previous layer's output), and its output."""
    device = activation.device
    needs_input_grad = index > 0  # stage inputs after the first carry gradients back
    forward: list[float] = []  # ms of each run's forward
    backward: list[float] = []  # and of its backward
    runs: list[float] = []  # seconds of each run, both passes
    saved_buffers = [buffer.detach().clone() for buffer in layer.buffers()]
    while not length.enough(runs):
        leaf = activation.detach().requires_grad_(
            needs_input_grad and activation.is_floating_point()
        )
        # A copy: in-place layers (ReLU(inplace=True)) must not modify `activation`, nor a
        # leaf that requires grad, which autograd forbids.
        x = leaf.clone()
        start = device_time(device)
        y = layer(x)
        middle = device_time(device)
        if y.requires_grad:
            y.backward(torch.ones_like(y))
        end = device_time(device)
        runs.append(end - start)
        forward.append((middle - start) * MS_PER_S)
        backward.append((end - middle) * MS_PER_S)
    warmed = length.warmup_count(runs)
    forward, backward = forward[warmed:], backward[warmed:]
    update = _update_ms(layer, device, length.warmup_batches, length.probe_batches)
    layer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for buffer, saved in zip(layer.buffers(), saved_buffers):
            buffer.copy_(saved)
    output = y.detach()
    return LayerProfile(
        index=index,
        type=type(layer).__name__,
        forward_ms=statistics.median(forward),
        backward_ms=statistics.median(backward),
        update_ms=update,
        activation_mb=output.numel() * output.element_size() / BYTES_PER_MB,
        parameter_mb=sum(p.numel() * p.element_size() for p in layer.parameters()) / BYTES_PER_MB,
    ), output


def _update_ms(layer: nn.Module, device: torch.device, warmup: int, repeats: int) -> float:
    """Median time of an optimizer step on the layer's weights and the gradients they hold.

    SGD with momentum and weight decay, as the harness trains with, at learning rate 0 so
    the weights stay as they are; the first step (which allocates the momentum) is not timed.
    """
    parameters = [p for p in layer.parameters() if p.grad is not None]
    if not parameters:
        return 0.0
    optimizer = torch.optim.SGD(parameters, lr=0.0, momentum=0.9, weight_decay=5e-4)
    return median_seconds(optimizer.step, device, warmup=1 + warmup, repeats=repeats) * MS_PER_S
