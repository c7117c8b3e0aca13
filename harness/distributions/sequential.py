"""`sequential`: plain PyTorch on one device, the baseline every speedup is measured against."""

from __future__ import annotations

from harness.distributions.base import TrainingContext
from harness.distributions.loop import BatchLoopTrainer


def sequential_trainer(context: TrainingContext) -> BatchLoopTrainer:
    return BatchLoopTrainer(context, context.workload.model.to(context.device))
