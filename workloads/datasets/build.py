"""`build_dataset`: the one entry point that turns a spec, a source and a split into a Dataset."""

from __future__ import annotations

import logging
from pathlib import Path

from torch.utils.data import Dataset, Subset

from workloads.datasets.loader import dataset_length
from workloads.datasets.real import build_real
from workloads.datasets.spec import DatasetSpec
from workloads.datasets.synthetic import SPLITS, build_synthetic
from workloads.datasets.tokens import TokenDataset, build_synthetic_tokens, build_text

logger = logging.getLogger(__name__)

SOURCES = ("synthetic", "real")


def build_dataset(
    spec: DatasetSpec,
    *,
    split: str = "train",
    source: str = "synthetic",
    num_samples: int | None = None,
    seed: int = 0,
    cache_dir: str | Path,
    root: str | Path | None = None,
    synthetic_unique_samples: int | None = None,
) -> Dataset:
    """One split of `spec`: the training data (one epoch is its first `num_samples` samples) or
    the held-out evaluation split.

    Args:
        spec: which dataset (shape, classes, size; a token dataset's seq_len and vocab_size).
        split: "train", or "eval": the real test split (MNIST t10k, CIFAR-10 test_batch, ImageNet
            val), or for synthetic data a split generated like the training data (the same class
            templates, its own noise and labels, its own cache entry).
        source: "synthetic" (generated once into `cache_dir`, see `synthetic`; token
            sequences of a Markov chain, see `tokens`) or "real" (torchvision formats under
            `root`, see `real`; for `text`, the .txt files under `root`, see `tokens`).
        num_samples: samples of the split; None = all of it (`spec.num_images` or
            `spec.num_eval_images` for synthetic data, everything on disk for real data).
            Training takes the first ones; evaluation takes evenly spaced ones, so that a
            real split stored class by class (ImageNet val) keeps all its classes.
        seed: determines the synthetic content (real data ignores it).
        cache_dir: parent directory of the synthetic cache.
        root: directory holding the real dataset.
        synthetic_unique_samples: distinct synthetic images stored (None = per-dataset default).

    Raises:
        ValueError: unknown split or source, highres or tokens with source="real", text with
            source="synthetic", "real" without `root` or with files missing under it (or too
            little text), or `num_samples` larger than the real split.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    if num_samples is not None and num_samples < 1:
        raise ValueError(
            f"num_samples must be positive or None (the full dataset), got {num_samples}"
        )
    if source == "synthetic":
        whole = spec.num_images if split == "train" else spec.num_eval_images
        if spec.tokens:
            return build_synthetic_tokens(
                spec,
                length=num_samples or whole,
                seed=seed,
                cache_dir=cache_dir,
                unique_samples=synthetic_unique_samples,
                split=split,
            )
        return build_synthetic(
            spec,
            length=num_samples or whole,
            seed=seed,
            cache_dir=cache_dir,
            unique_samples=synthetic_unique_samples,
            split=split,
        )
    if source == "real":
        return _real_subset(spec, root, num_samples, split, cache_dir)
    raise ValueError(f"unknown dataset source {source!r}; allowed: {', '.join(SOURCES)}")


def _real_subset(
    spec: DatasetSpec,
    root: str | Path | None,
    num_samples: int | None,
    split: str,
    cache_dir: str | Path,
) -> Dataset:
    """The real split, cut to `num_samples` samples (the first, or evenly spaced for eval).
    Text is read as byte-level tokens (`tokens.build_text`, its concatenation cached in
    `cache_dir`), images in their torchvision formats."""
    if spec.synthetic_only:
        raise ValueError(
            f"dataset {spec.name!r} exists only as synthetic data; allowed source for it: synthetic"
        )
    if root is None:
        raise ValueError(
            f"source='real' needs root, the directory holding the {spec.name} data "
            f"(or use source='synthetic'); allowed sources: {', '.join(SOURCES)}"
        )
    dataset = (
        build_text(spec, root, split, cache_dir=cache_dir)
        if spec.tokens
        else build_real(spec, root, split)
    )
    if num_samples is None:
        return dataset
    size = dataset_length(dataset)
    if num_samples > size:
        raise ValueError(
            f"num_samples={num_samples} exceeds the {size} samples of the "
            f"real {spec.name} {split} split under {root}; use at most "
            f"{size} or None"
        )
    indices = (
        range(num_samples)
        if split == "train"
        else [index * size // num_samples for index in range(num_samples)]
    )
    if isinstance(dataset, TokenDataset):
        return dataset.select(indices)  # keeps its whole-batch reads, which a Subset hides
    return Subset(dataset, indices)
