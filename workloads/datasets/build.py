"""`build_dataset`: the one entry point that turns a spec and a source into a torch Dataset."""

from __future__ import annotations

import logging
from pathlib import Path

from torch.utils.data import Dataset, Subset

from workloads.datasets.real import build_real
from workloads.datasets.spec import DatasetSpec
from workloads.datasets.synthetic import build_synthetic

logger = logging.getLogger(__name__)

SOURCES = ("synthetic", "real")


def build_dataset(spec: DatasetSpec, *, source: str = "synthetic", num_samples: int | None = None,
                  seed: int = 0, cache_dir: str | Path, root: str | Path | None = None,
                  synthetic_unique_samples: int | None = None) -> Dataset:
    """The training data of `spec`: one epoch is the first `num_samples` samples.

    Args:
        spec: which dataset (shape, classes, size).
        source: "synthetic" (generated once into `cache_dir`, see `synthetic`) or "real"
            (torchvision formats under `root`, see `real`).
        num_samples: samples per epoch; None = the full dataset (`spec.num_images` for synthetic
            data, everything on disk for real data).
        seed: determines the synthetic content (real data ignores it).
        cache_dir: parent directory of the synthetic cache.
        root: directory holding the real dataset.
        synthetic_unique_samples: distinct synthetic images stored (None = per-dataset default).

    Raises:
        ValueError: unknown source, highres with source="real", "real" without `root` or with
            files missing under it, or `num_samples` larger than the real dataset.
    """
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"num_samples must be positive or None (the full dataset), "
                         f"got {num_samples}")
    if source == "synthetic":
        return build_synthetic(spec, length=num_samples or spec.num_images, seed=seed,
                               cache_dir=cache_dir, unique_samples=synthetic_unique_samples)
    if source == "real":
        return _real_subset(spec, root, num_samples)
    raise ValueError(f"unknown dataset source {source!r}; allowed: {', '.join(SOURCES)}")


def _real_subset(spec: DatasetSpec, root: str | Path | None, num_samples: int | None) -> Dataset:
    """The real dataset, cut to its first `num_samples` samples."""
    if spec.synthetic_only:
        raise ValueError(f"dataset {spec.name!r} exists only as synthetic data; "
                         f"allowed source for it: synthetic")
    if root is None:
        raise ValueError(f"source='real' needs root, the directory holding the {spec.name} data "
                         f"(or use source='synthetic'); allowed sources: {', '.join(SOURCES)}")
    dataset = build_real(spec, root)
    if num_samples is None:
        return dataset
    if num_samples > len(dataset):
        raise ValueError(f"num_samples={num_samples} exceeds the {len(dataset)} samples of the "
                         f"real {spec.name} dataset under {root}; use at most {len(dataset)} "
                         f"or None")
    return Subset(dataset, range(num_samples))
