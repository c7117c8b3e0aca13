"""Memory per worker, predicted for every distribution model, to rule out what will not fit.

What a worker holds while it trains (float32, MB):

- weights P, gradients P, and the optimizer's state (SGD with momentum: one buffer, P);
- communication buffers: Horovod's fusion buffer (th), DDP's gradient buckets (a copy of
  the gradients, G);
- activations kept for the backward pass: batch x activation MB per sample of the layers
  the worker runs (for a pipeline, per micro-batch and per micro-batch in flight);
- PipeDream's stashed weight versions: a stage keeps one version per mini-batch in flight
  after the current one, which is the number of stages after it (1F1B's warm-up depth);
- `runtime_mb`, what the framework itself occupies (the CUDA context, or the process's
  libraries on a CPU); a free parameter fitted against measured peaks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StageFacts:
    """One worker's part of the network: parameter MB and activation MB per sample."""

    weights_mb: float
    activation_mb_per_sample: float
    input_mb_per_sample: float  # the activation entering the stage (kept for recomputation)


def _model_state_mb(weights_mb: float, momentum: bool) -> float:
    return weights_mb * (3 if momentum else 2)  # weights, gradients, momentum buffer


def data_parallel_mb(weights_mb: float, activation_mb_per_sample: float, batch_size: int, *,
                     communication_buffer_mb: float, momentum: bool = True,
                     runtime_mb: float = 0.0) -> float:
    """Sequential (buffer 0), Horovod (buffer th) and DDP (buffer G): a whole replica."""
    return (runtime_mb + _model_state_mb(weights_mb, momentum) + communication_buffer_mb
            + batch_size * activation_mb_per_sample)


def gpipe_stage_mb(stage: StageFacts, micro_batch_size: int, micro_batches: int,
                   recompute: str, *, momentum: bool = True, runtime_mb: float = 0.0) -> float:
    """A GPipe stage: with recomputation only each micro-batch's stage input is kept, plus
    the activations of the one micro-batch being recomputed (`except_last` also keeps the
    last micro-batch's); without it, every micro-batch's activations."""
    full = micro_batch_size * stage.activation_mb_per_sample
    inputs = micro_batches * micro_batch_size * stage.input_mb_per_sample
    activations = {"always": inputs + full, "except_last": inputs + 2 * full,
                   "never": micro_batches * full}[recompute]
    return runtime_mb + _model_state_mb(stage.weights_mb, momentum) + activations


def pipedream_stage_mb(stage: StageFacts, batch_size: int, stages_after: int,
                       replicas: int, *, momentum: bool = True,
                       runtime_mb: float = 0.0) -> float:
    """A PipeDream stage replica: 1 + `stages_after` mini-batches in flight, each with its
    activations and its stashed weight version (round-robin routing over `replicas` replicas
    spreads the in-flight mini-batches among them)."""
    in_flight = -(-(1 + stages_after) // replicas)  # ceil
    stashed = (in_flight - 1) * stage.weights_mb
    return (runtime_mb + _model_state_mb(stage.weights_mb, momentum) + stashed
            + in_flight * batch_size * stage.activation_mb_per_sample)


def fits(predicted_mb: Sequence[float], device_memory_gb: float | None) -> bool:
    """Whether every worker fits its device; unknown device memory rules nothing out."""
    return device_memory_gb is None or max(predicted_mb) <= device_memory_gb * 1000
