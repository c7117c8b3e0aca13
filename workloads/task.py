"""The training task's loss and accuracy, for image classification and language modelling alike.

An image network returns (N, classes) logits for (N,) labels; a language model returns
(N, T, vocab) logits for (N, T) next-token targets. Both are cross entropy over the last
dimension once the leading dimensions are flattened, so every trainer, the evaluation and the
profilers share one criterion, and an image cell computes exactly what `nn.CrossEntropyLoss`
computed before language models joined.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional


def task_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross entropy of every prediction (one per image, or one per token position)."""
    return functional.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction=reduction)


class TaskLoss(nn.Module):
    """`task_loss` as a module: what the trainers hold as their criterion."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return task_loss(logits, targets, self.reduction)


def correct_predictions(logits: torch.Tensor, targets: torch.Tensor) -> int:
    """Predictions whose top-1 is the target (images: per sample; tokens: per position)."""
    return int((logits.argmax(dim=-1) == targets).sum())


def prediction_count(targets: torch.Tensor) -> int:
    """Predictions a batch makes: its samples, or its samples x positions for tokens."""
    return targets.numel()
