"""How `sequential` trains (its spec, what it costs and offers: the package's __init__). Imported
by a worker only: predicting and the commands never load a trainer."""

from __future__ import annotations

from harness.distributions.base import TrainingContext
from harness.distributions.loop import BatchLoopTrainer


def sequential_trainer(context: TrainingContext) -> BatchLoopTrainer:
    return BatchLoopTrainer(context, context.workload.model.to(context.device))
