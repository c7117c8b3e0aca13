"""How `ddp` trains (its spec, what it costs and offers: the package's __init__). Imported
by a worker only: predicting and the commands never load a trainer."""

from __future__ import annotations

import threading
import time

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from harness.distributions.base import TrainingContext
from harness.distributions.ddp import ddp_settings
from harness.distributions.layer_training import prepare_layers
from harness.distributions.loop import BatchLoopTrainer
from workloads.networks import to_layer_list


class TimedAllreduce:
    """A DDP communication hook (`hook`): DDP's default allreduce, with launch and finish
    times."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # completion callbacks run on the backend's threads
        self._last_launch = 0.0
        self._last_finish = 0.0

    # No annotations: DDP checks a hook's annotations against the real classes, and this
    # module's are strings (`from __future__ import annotations`). The arguments are the
    # process group (None: the default one) and a dist.GradBucket; it returns a Future[Tensor].
    def hook(self, process_group, bucket):  # noqa: ANN001, ANN201
        with self._lock:
            self._last_launch = time.perf_counter()
        averaged = default_hooks.allreduce_hook(process_group, bucket)
        return averaged.then(self._finished)

    def _finished(self, future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        with self._lock:
            self._last_finish = max(self._last_finish, time.perf_counter())
        return future.value()

    # GradientSync
    def waited_in_backward(self) -> float:
        with self._lock:
            waited = self._last_finish - self._last_launch
            self._last_launch = self._last_finish = 0.0
        return max(waited, 0.0)

    def wait(self, optimizer: torch.optim.Optimizer) -> None:
        """DDP's backward has already waited for every bucket."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()


def ddp_trainer(context: TrainingContext) -> BatchLoopTrainer:
    device = context.device
    settings = ddp_settings(context.config)
    model = context.workload.model.to(device)
    prepare_layers(model, settings, lambda: to_layer_list(context.config.network.ref, model))
    if not context.peers.env.is_distributed:
        return BatchLoopTrainer(context, model, precision=settings.precision)
    # DDP broadcasts rank 0's parameters at construction: every replica starts equal.
    model = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=settings.bucket_cap_mb,
    )
    timed_allreduce = TimedAllreduce()
    model.register_comm_hook(state=None, hook=timed_allreduce.hook)
    return BatchLoopTrainer(
        context, model, gradient_sync=timed_allreduce, precision=settings.precision
    )
