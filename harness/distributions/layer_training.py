"""How a worker applies a model's activation checkpointing and precision
(`harness.distributions.layer_settings`) to its network: for the trainers only."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from harness.distributions.layer_settings import Checkpointing, LayerSettingsConfig, Precision


def checkpointed(layer: nn.Module) -> None:
    """`layer` recomputes its forward in the backward: non-reentrant `torch.utils.checkpoint`
    around its own forward, so the hooks others put around the module call (FSDP2's
    all-gathers, tensor parallelism's redistributions) stay outside the recomputed part and
    run as they would (the same order torchtitan gets by wrapping before `fully_shard`)."""
    forward = layer.forward

    def recomputing(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    layer.forward = functools.update_wrapper(recomputing, forward)


def prepare_layers(
    network: nn.Module, settings: LayerSettingsConfig, layers: Callable[[], list[nn.Module]]
) -> None:
    """Before any data-parallel wrapping: bfloat16 parameters (`bf16`), then the chosen
    entries of the network's layer list (`layers()`, asked for only when some recompute: a
    network without one trains without checkpointing) made to recompute."""
    if settings.precision is Precision.bf16:
        network.to(torch.bfloat16)
    if settings.activation_checkpointing is Checkpointing.none:
        return
    entries = layers()
    for index in settings.checkpointed(len(entries)):
        checkpointed(entries[index])


def compute_context(
    precision: Precision, device: torch.device, cast_elsewhere: bool = False
) -> AbstractContextManager[Any]:
    """Where the forward runs: autocast to bfloat16 for `bf16_mixed` unless the parameters are
    cast elsewhere (FSDP2's MixedPrecisionPolicy gathers them in bfloat16 already)."""
    if precision is Precision.bf16_mixed and not cast_elsewhere:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def as_input(images: torch.Tensor, precision: Precision) -> torch.Tensor:
    """Floating-point inputs in the parameters' dtype (`bf16`); token ids as they are."""
    if precision is Precision.bf16 and images.is_floating_point():
        return images.to(torch.bfloat16)
    return images


def loss_dtype(output: torch.Tensor) -> torch.Tensor:
    """Logits widened to float32 at least for the loss (bfloat16 ones lose the loss's digits)."""
    return output.to(torch.promote_types(output.dtype, torch.float32))


def compute_dtype(precision: Precision) -> torch.dtype | None:
    """MLPerf's lowest precision of the compute where it is not the parameters' dtype
    (`Trainer.compute_dtype`)."""
    return None if precision is Precision.fp32 else torch.bfloat16
