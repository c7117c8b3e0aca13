"""The benchmark datasets: specs, synthetic and real data, and the per-rank epoch loader.

    dataset = build_dataset(dataset_spec("cifar10"), source="synthetic", seed=0, cache_dir=cache)
    loader = EpochLoader(dataset, 64, seed=0, rank=rank, world_size=world_size)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:   # float32 (N, C, H, W), int64 (N,)
            ...

Token datasets (`tokens`, `text`) give int64 (N, seq_len) inputs and next-token targets instead;
build them from the spec with the cell's seq_len and vocab_size (`DatasetSpec.with_tokens`).

The names below load their module (and torch) when first used (`workloads.lazy`): the facts
of a dataset, `workloads.datasets.spec`, are read without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workloads.lazy import lazy_exports

_EXPORTS = {
    "SOURCES": "build",
    "build_dataset": "build",
    "EpochLoader": "loader",
    "DATASET_SPECS": "spec",
    "DatasetSpec": "spec",
    "dataset_spec": "spec",
    "DEFAULT_UNIQUE_SAMPLES": "synthetic",
    "SyntheticDataset": "synthetic",
    "TokenDataset": "tokens",
    "best_next_token_accuracy": "tokens",
    "markov_chain": "tokens",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "DATASET_SPECS",
    "DEFAULT_UNIQUE_SAMPLES",
    "DatasetSpec",
    "EpochLoader",
    "SOURCES",
    "SyntheticDataset",
    "TokenDataset",
    "best_next_token_accuracy",
    "build_dataset",
    "dataset_spec",
    "markov_chain",
]

if TYPE_CHECKING:  # what the names are, for type checkers and readers
    from workloads.datasets.build import SOURCES, build_dataset
    from workloads.datasets.loader import EpochLoader
    from workloads.datasets.spec import DATASET_SPECS, DatasetSpec, dataset_spec
    from workloads.datasets.synthetic import DEFAULT_UNIQUE_SAMPLES, SyntheticDataset
    from workloads.datasets.tokens import TokenDataset, best_next_token_accuracy, markov_chain
