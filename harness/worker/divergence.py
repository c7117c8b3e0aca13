"""A training whose loss is no longer finite has diverged: its timings measure arithmetic on
garbage (NaN and infinity propagate at full speed), so the cell stops at the first epoch that
shows it and is recorded `diverged`, not `ok`; a re-run then trains it again
(harness.records.resume).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


class DivergedError(RuntimeError):
    """The loss became NaN or infinite: the message names where and the value."""


def check_finite_losses(batch_losses: dict[int, float], where: str) -> None:
    """Raise DivergedError naming the first batch of the epoch `where` whose loss is not
    finite (batches this worker computed a loss for; an empty dict passes)."""
    for batch in sorted(batch_losses):
        if not math.isfinite(batch_losses[batch]):
            raise DivergedError(
                f"training loss {batch_losses[batch]} at {where}, batch "
                f"{batch + 1}: not finite (lower optimizer.lr, or check the "
                f"data)"
            )


def check_finite_eval_loss(loss: float, where: str, forward_batch: int, model: nn.Module) -> None:
    """Raise DivergedError when the evaluation after the epoch `where` gave a non-finite loss.

    It is checked after the epoch's training losses were found finite, so what differs is the
    network's evaluation mode. Where the network keeps running statistics (BatchNorm's: looked
    up in `model` only once the loss is not finite, since it walks every module), it normalises
    by those it gathered from `forward_batch` samples at a time (a pipeline's micro-batch)
    instead of the batch's own. Measured: torchvision's EfficientNet-B0 on CIFAR-10 trained one
    short epoch at forward passes of 2 samples (GPipe, batch 8, 4 micro-batches) evaluates to NaN at
    any learning rate tried (0.01, 0.001), and evaluates finite from 4 samples on
    (docs/benchmarks/2026-11-25-transformers-and-open-networks.md, "Run again; EfficientNet-B0's
    GPipe cell had been recorded `diverged` (2026-12-01)").
    """
    if math.isfinite(loss):
        return
    if keeps_running_statistics(model):
        cause = (
            f"in evaluation mode the network normalises by the running statistics "
            f"(BatchNorm's) it gathered from forward passes of {forward_batch} sample(s): "
            f"more samples per forward pass (distribution.batch_size, fewer "
            f"distribution.micro_batches), or"
        )
    else:
        cause = (
            f"the network computes otherwise in evaluation mode (forward passes of "
            f"{forward_batch} sample(s) in training):"
        )
    raise DivergedError(
        f"eval loss {loss} after {where}: not finite, though every training "
        f"loss of the epoch was; {cause} run.eval=false to time the training "
        f"alone (else lower optimizer.lr, or check the data)"
    )


def keeps_running_statistics(model: nn.Module) -> bool:
    """Whether a module of `model` normalises by statistics it keeps from training (BatchNorm,
    an InstanceNorm that tracks them) rather than by the batch's own in evaluation mode."""
    return any(
        getattr(module, "track_running_stats", False)
        and getattr(module, "running_var", None) is not None
        for module in model.modules()
    )
