"""`ddp`: torch DistributedDataParallel, data parallelism maintained by PyTorch itself.

Every worker trains its own shard of each epoch (Table 3.3's batch per worker); DDP averages
gradients with bucketed allreduces that start while the backward pass is still running, which
is the overlap Horovod's Tensor Fusion also aims for, so the two compare side by side.
"""

from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from harness.distributions.base import TrainingContext
from harness.distributions.loop import BatchLoopTrainer


def ddp_trainer(context: TrainingContext) -> BatchLoopTrainer:
    device = context.device
    model = context.workload.model.to(device)
    if context.session.env.is_distributed:
        # DDP broadcasts rank 0's parameters at construction: every replica starts equal.
        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=context.config.distribution.bucket_cap_mb,
        )
    return BatchLoopTrainer(context, model)
