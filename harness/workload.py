"""A grid cell's workload: the dataset, its loader, the network and the optimizer recipe."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from harness.config import DistbenchConfig, OptimizerConfig
from harness.seeding import seed_everything
from workloads.datasets import DatasetSpec, EpochLoader, build_dataset, dataset_spec
from workloads.networks import build_network


@dataclass
class Workload:
    spec: DatasetSpec
    model: nn.Module
    loader: EpochLoader
    make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def build_workload(config: DistbenchConfig, *, rank: int = 0, world_size: int = 1) -> Workload:
    """Build the cell's data (this worker's shard) and network, seeded from run.seed (the
    synthetic data, the data order and, through every RNG, the initial parameters)."""
    seed_everything(config.run.seed)
    spec = dataset_spec(config.dataset.name.value)
    dataset = build_dataset(
        spec,
        source=config.dataset.source.value,
        num_samples=config.dataset.num_samples,
        seed=config.run.seed,
        cache_dir=Path(config.dataset.cache_dir).expanduser(),
        root=config.dataset.root,
        synthetic_unique_samples=config.dataset.synthetic_unique_samples,
    )
    loader = EpochLoader(
        dataset, config.batch_size, seed=config.run.seed,
        num_workers=config.dataset.num_workers, rank=rank, world_size=world_size,
    )
    if len(loader) == 0:
        raise ValueError(
            f"dataset.num_samples={len(dataset)} gives no full batch of "
            f"distribution.batch_size={config.batch_size} per worker "
            f"(world size {world_size}); use at least {config.batch_size * world_size} samples"
        )
    model = build_network(config.network.name.value, spec)
    return Workload(spec=spec, model=model, loader=loader,
                    make_optimizer=lambda params: build_optimizer(params, config.optimizer))


def build_optimizer(params: Iterable[nn.Parameter],
                    config: OptimizerConfig) -> torch.optim.Optimizer:
    """SGD with momentum and weight decay, the optimizer of the thesis' benchmarks."""
    return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay)
