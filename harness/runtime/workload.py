"""A grid cell's workload: the dataset, its loader, the network and the optimizer recipe."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from harness.config.schema import DistbenchConfig, OptimizerConfig, OptimizerName
from harness.runtime.evaluation import default_eval_samples
from harness.runtime.seeding import seed_everything
from workloads.datasets import DatasetSpec, EpochLoader, build_dataset
from workloads.datasets.loader import dataset_length
from workloads.networks import build_network


@dataclass
class Workload:
    spec: DatasetSpec
    model: nn.Module
    loader: EpochLoader
    make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
    # The held-out split evaluated after every epoch; None when run.eval is off.
    eval_dataset: Dataset | None = None


def build_workload(config: DistbenchConfig, *, rank: int = 0, world_size: int = 1) -> Workload:
    """Build the cell's data (this worker's shard) and network, seeded from run.seed (the
    synthetic data, the data order and, through every RNG, the initial parameters)."""
    seed_everything(config.run.seed)
    spec = config.dataset.spec
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
        dataset,
        config.batch_size,
        seed=config.run.seed,
        num_workers=config.dataset.num_workers,
        rank=rank,
        world_size=world_size,
    )
    if len(loader) == 0:
        raise ValueError(
            f"dataset.num_samples={dataset_length(dataset)} gives no full batch of "
            f"distribution.batch_size={config.batch_size} per worker "
            f"(world size {world_size}); use at least {config.batch_size * world_size} samples"
        )
    model = build_network(config.network.ref, spec)
    return Workload(
        spec=spec,
        model=model,
        loader=loader,
        make_optimizer=lambda params: build_optimizer(params, config.optimizer),
        eval_dataset=build_eval_dataset(config, spec, dataset_length(dataset))
        if config.run.eval
        else None,
    )


def build_eval_dataset(config: DistbenchConfig, spec: DatasetSpec, train_samples: int) -> Dataset:
    """The held-out split: `dataset.eval_samples` of it, else a tenth of the epoch's samples
    (`harness.runtime.evaluation.default_eval_samples`). Synthetic data generates it like the
    training data from the same run.seed (the same classes), real data reads its test split."""

    def eval_split(num_samples: int | None) -> Dataset:
        return build_dataset(
            spec,
            split="eval",
            num_samples=num_samples,
            source=config.dataset.source.value,
            seed=config.run.seed,
            cache_dir=Path(config.dataset.cache_dir).expanduser(),
            root=config.dataset.root,
        )

    samples = config.dataset.eval_samples
    if samples is None:
        split_size = (
            dataset_length(eval_split(None))
            if config.dataset.source.value == "real"
            else spec.num_eval_images
        )
        samples = default_eval_samples(train_samples, split_size)
    return eval_split(samples)


def build_optimizer(
    params: Iterable[nn.Parameter], config: OptimizerConfig
) -> torch.optim.Optimizer:
    """SGD with momentum and weight decay (the thesis' benchmarks), or AdamW (language
    models; decoupled weight decay, betas = (momentum, beta2))."""
    if config.name is OptimizerName.adamw:
        return torch.optim.AdamW(
            params,
            lr=config.lr,
            betas=(config.momentum, config.beta2),
            weight_decay=config.weight_decay,
        )
    return torch.optim.SGD(
        params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
