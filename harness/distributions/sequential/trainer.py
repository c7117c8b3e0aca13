"""How `sequential` trains (its spec, what it costs and offers: the package's __init__). Imported
by a worker only: predicting and the commands never load a trainer."""

from __future__ import annotations

from harness.distributions.base import TrainingContext
from harness.distributions.layer_training import prepare_layers
from harness.distributions.loop import BatchLoopTrainer
from harness.distributions.sequential import SequentialConfig
from workloads.networks import to_layer_list


def sequential_trainer(context: TrainingContext) -> BatchLoopTrainer:
    settings = context.config.distribution
    assert isinstance(settings, SequentialConfig), settings
    model = context.workload.model.to(context.device)
    prepare_layers(model, settings, lambda: to_layer_list(context.config.network.ref, model))
    return BatchLoopTrainer(context, model, precision=settings.precision)
