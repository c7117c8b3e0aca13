"""The benchmark datasets: specs, synthetic and real data, and the per-rank epoch loader.

    dataset = build_dataset(dataset_spec("cifar10"), source="synthetic", seed=0, cache_dir=cache)
    loader = EpochLoader(dataset, 64, seed=0, rank=rank, world_size=world_size)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:   # float32 (N, C, H, W), int64 (N,)
            ...
"""

from workloads.datasets.build import SOURCES, build_dataset
from workloads.datasets.loader import EpochLoader
from workloads.datasets.spec import DATASET_SPECS, DatasetSpec, dataset_spec
from workloads.datasets.synthetic import DEFAULT_UNIQUE_SAMPLES, SyntheticDataset

__all__ = [
    "DATASET_SPECS",
    "DEFAULT_UNIQUE_SAMPLES",
    "SOURCES",
    "DatasetSpec",
    "EpochLoader",
    "SyntheticDataset",
    "build_dataset",
    "dataset_spec",
]
