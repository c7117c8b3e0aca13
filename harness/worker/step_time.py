"""The sequential model (thesis ch. 4): train a few batches on the target device and
extrapolate the time per batch to the whole epoch (`harness.predict.cell.epoch_terms`: the
measured step once per full batch, as the harness trains).

`measure_batch_seconds` is the only part that runs anything: up to `probe_batches` timed
training steps (after up to `warmup_batches` untimed ones) of the real network on one device,
with the device synchronised around each; how many is `harness.measure.timing_rule.ProbeLength`'s
rule. The median is robust to the odd slow step (a page fault, another process); the spread is
returned so that a caller can say how sure the number is.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from harness.config.schema import DistbenchConfig
from harness.measure.timing_rule import ProbeLength
from harness.profiles.steps import BatchTiming


def measure_batch_seconds(
    config: DistbenchConfig,
    *,
    batch_size: int,
    probe_batches: int,
    warmup_batches: int = 2,
    steady_spread: float = 0.0,
) -> BatchTiming:
    """Time up to `probe_batches` training steps of the cell's network at `batch_size` on the
    configured device (one worker, the sequential trainer), as `ProbeLength` says."""
    # Imported here: torch, harness.worker.run and the trainers are much that the equations and
    # the commands' --help never need.
    import torch

    from harness.distributions.base import TrainingContext
    from harness.distributions.sequential.trainer import sequential_trainer
    from harness.measure.allocator import keep_freed_memory
    from harness.measure.metrics import PhaseClock
    from harness.runtime.distributed import Peers
    from harness.runtime.workload import build_workload
    from harness.system.worker_env import WorkerEnvironment
    from harness.worker.run import select_device

    if probe_batches < 1:
        raise ValueError(f"probe_batches={probe_batches}: at least one timed batch is needed")
    distribution = replace(config.distribution, batch_size=batch_size)
    dataset = replace(config.dataset, num_samples=batch_size * (probe_batches + warmup_batches))
    probe_config = replace(config, distribution=distribution, dataset=dataset)
    device = select_device(probe_config)
    keep_freed_memory()  # timed as a worker steps (harness.measure.allocator)
    if probe_config.hardware.cpu_threads is not None:
        torch.set_num_threads(probe_config.hardware.cpu_threads)
    context = TrainingContext(
        config=probe_config,
        workload=build_workload(probe_config),
        device=device,
        clock=PhaseClock(device, enabled=False),
        peers=Peers(WorkerEnvironment(), backend=None),
        heartbeat=lambda: None,
    )
    trainer = sequential_trainer(context)
    length = ProbeLength(warmup_batches, probe_batches, steady_spread)
    seconds = length.timed(
        trainer.time_batches(warmup_batches + probe_batches, enough=length.enough)
    )
    return BatchTiming(
        batch_size=batch_size,
        median_s=statistics.median(seconds),
        std_s=statistics.stdev(seconds) if len(seconds) > 1 else 0.0,
        batches=len(seconds),
        seconds=tuple(seconds),
    )
