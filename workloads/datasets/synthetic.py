"""Synthetic datasets: learnable uint8 images and labels, generated once per seed and memory-mapped.

Synthetic data keeps storage and decoding out of the measurement, so the benchmark times the
network and the communication. The images are generated deterministically from (seed, dataset
name, split) and cached on node-local disk (see `cache` for the trust and atomicity rules); every
later run, and every rank of the same run, memory-maps the same files instead of regenerating them.

Only `unique` distinct images are stored and index i reads image i % unique: the full synthetic
ImageNet would take 192 GB, while what is measured does not depend on images being distinct.

The class signal. Pure noise cannot be learned, so accuracy on it would mean nothing; each image
is therefore its label's *template* blended with uniform noise, pixel by pixel::

    image = (1 - SIGNAL_STRENGTH) * noise + SIGNAL_STRENGTH * template[label]

computed exactly in uint8 as a uniform integer in [0, 256 - SIGNAL_LEVEL) plus SIGNAL_LEVEL
where the template is white (SIGNAL_STRENGTH = SIGNAL_LEVEL / 256).

A template is a coarse random black-and-white pattern, `TEMPLATE_GRID` x `TEMPLATE_GRID` cells of
0 or 255 per channel, upsampled to the full resolution by repeating each cell over its block of
pixels: a low spatial frequency, which convolutions followed by pooling pick out by averaging
the noise away, as they do with the shapes in real images. The templates depend on (seed,
dataset name) only, so the training and the evaluation split share them (the same classes),
while noise and labels come from a different random stream per split (eval images are never
training images).

The strength, 0.25, was tuned on the default workload (ResNet-18, SGD lr 0.01, momentum 0.9,
weight decay 5e-4, MNIST with 2048 samples, batch 128, so 16 steps an epoch; a plain training
loop, 1000 held-out images): held-out accuracy climbs over a few epochs (0.15, 0.73, 0.92, 1.00
after epochs 1-4), where at 0.19 it climbed unsteadily (0.11, 0.35, 0.32, 0.995) and at 0.31
reached 0.98 in the second epoch (with templates of uniform grey values instead of black and
white, at 0.1, the network memorised the noise of its 2048 images and stayed at chance).
One pixel alone says little (a nearest-class-mean classifier fitted on one pixel per cell of
100 images gets 55-65 % of held-out MNIST images right); the averages over the blocks
separate the classes, so a classifier that takes them reaches 100 %: the difficulty is in
learning to take them, not in overlapping classes. Larger images average more pixels per
block, so the same strength is easier for them.

The blend costs nothing at training time: the stored files, their shapes and dtype (uint8), and
`SyntheticDataset` are what they were with pure noise; the generation adds one in-place uint8
addition per chunk (its temporaries are at most twice a chunk, so memory stays bounded for
ImageNet-size images).
"""

from __future__ import annotations

import functools
import logging
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from workloads.datasets.buffers import BufferPool
from workloads.datasets.cache import ArraySpec, load_or_generate
from workloads.datasets.spec import DatasetSpec
from workloads.progress import steps

logger = logging.getLogger(__name__)

# Distinct images stored per dataset when the caller does not choose. MNIST and CIFAR-10 are small
# enough (55 MB, 184 MB) to store whole. ImageNet (150 KB/image, 192 GB in full) and Highres
# (768 KB/image, 47 GB in full) are capped at about 1.5 GB each, which fits in the page cache of
# any training node, so after the first epoch reads never touch the disk.
DEFAULT_UNIQUE_SAMPLES: dict[str, int] = {
    "mnist": 70_000,
    "cifar10": 60_000,
    "imagenet": 10_000,
    "highres": 2_000,
}

# Part of the cache key: bump it whenever the generated content changes for the same parameters
# (for example a different chunk size, which changes the random stream), so that old caches are
# not reused. Version 2: the class signal and the eval split.
GENERATOR_VERSION = 2
# The splits `build_synthetic` generates: the training data and the held-out evaluation split.
SPLITS = ("train", "eval")
# The class signal (module docstring): coarse cells per side of a template (every resolution is
# a multiple of it), and the grey levels a white template cell adds to the noise: a weight of
# 64 / 256 = 0.25 in each pixel.
TEMPLATE_GRID = 4
SIGNAL_LEVEL = 64
SIGNAL_STRENGTH = SIGNAL_LEVEL / 256
# The random streams under (seed, dataset name): the templates, then per split its labels and
# its image chunks.
_TEMPLATE_STREAM = 0
_LABELS, _IMAGES = 0, 1
# Images are generated and written this many bytes at a time, so memory use stays bounded.
_CHUNK_BYTES = 32 * 1024 * 1024
# Generations at least this large show a progress bar (they take more than a few seconds).
_PROGRESS_BAR_BYTES = 256 * 1024 * 1024
IMAGES_FILE = "images.npy"
LABELS_FILE = "labels.npy"


def unique_sample_count(spec: DatasetSpec, length: int, requested: int | None) -> int:
    """How many distinct images to store: the request (or the default), at most `length`."""
    if requested is not None and requested < 1:
        raise ValueError(f"synthetic_unique_samples must be positive, got {requested}")
    if requested is None:
        requested = DEFAULT_UNIQUE_SAMPLES.get(spec.name, spec.num_images)
    return min(length, requested)


def build_synthetic(
    spec: DatasetSpec,
    *,
    length: int,
    seed: int,
    cache_dir: str | Path,
    unique_samples: int | None = None,
    verify: bool = True,
    split: str = "train",
) -> SyntheticDataset:
    """The synthetic version of `spec` with `length` samples, generated into `cache_dir` if needed.

    Args:
        spec: the dataset whose shape and class count are imitated.
        length: samples in the dataset (one epoch, or the evaluated samples).
        seed: non-negative; together with the dataset name and the split it determines every
            byte (the class templates depend on the seed and the name only).
        cache_dir: parent directory of the cache entries (node-local disk is best).
        unique_samples: distinct images to store (default: `DEFAULT_UNIQUE_SAMPLES`).
        verify: re-check the sha256 of cached files, not only their sizes (the default).
        split: "train" or "eval"; each has its own noise, labels and cache entry.
    """
    if seed < 0:
        raise ValueError(f"seed must be non-negative for synthetic data, got {seed}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    unique = unique_sample_count(spec, length, unique_samples)
    directory = Path(cache_dir) / _entry_name(spec, unique, seed, split)
    specs = {
        IMAGES_FILE: ArraySpec((unique, *spec.input_shape), np.dtype(np.uint8)),
        LABELS_FILE: ArraySpec((unique,), np.dtype(np.int64)),
    }
    # The images depend on the labels; both are computed only when the cache is generated.
    labels = functools.cache(lambda: _labels(spec, unique, seed, split))

    def make_chunks(file_name: str) -> Iterator[np.ndarray]:
        if file_name == IMAGES_FILE:
            return _image_chunks(spec, labels(), seed, split)
        return iter([labels()])

    entry = load_or_generate(
        directory, _cache_params(spec, unique, seed, split), specs, make_chunks, verify=verify
    )
    if entry.generated:
        logger.info(
            "generated synthetic %s (%s split): %d distinct images in %s",
            spec.name,
            split,
            unique,
            directory,
        )
    return SyntheticDataset(
        directory,
        length,
        images=entry.arrays[IMAGES_FILE],
        labels=entry.arrays[LABELS_FILE],
        generated=entry.generated,
    )


def _entry_name(spec: DatasetSpec, unique: int, seed: int, split: str) -> str:
    """Directory name of a cache entry; it encodes everything the content depends on."""
    shape = "x".join(str(size) for size in spec.input_shape)
    return (
        f"{spec.name}-{shape}-c{spec.num_classes}-u{unique}-seed{seed}-{split}-v{GENERATOR_VERSION}"
    )


def _cache_params(spec: DatasetSpec, unique: int, seed: int, split: str) -> dict[str, Any]:
    """The parameters recorded in (and checked against) the manifest."""
    return {
        "dataset": spec.name,
        "split": split,
        "input_shape": list(spec.input_shape),
        "num_classes": spec.num_classes,
        "unique_samples": unique,
        "seed": seed,
        "generator_version": GENERATOR_VERSION,
    }


def _rng(spec: DatasetSpec, seed: int, *stream: int) -> np.random.Generator:
    """An independent random stream for (seed, dataset name, stream id).

    The name enters through crc32 because Python's `hash` of a str changes between processes.
    Each images chunk gets its own stream so its content does not depend on the chunks before it.
    """
    name_code = zlib.crc32(spec.name.encode())
    return np.random.default_rng(np.random.SeedSequence([seed, name_code], spawn_key=stream))


def _split_rng(spec: DatasetSpec, seed: int, split: str, *stream: int) -> np.random.Generator:
    """A stream of one split: splits never share noise or labels."""
    return _rng(spec, seed, 1 + SPLITS.index(split), *stream)


def class_templates(spec: DatasetSpec, seed: int) -> np.ndarray:
    """The coarse class templates, uint8 (num_classes, C, TEMPLATE_GRID, TEMPLATE_GRID).

    Seeded by (seed, dataset name) alone, so every split of the same seed shares them.
    """
    cells = _rng(spec, seed, _TEMPLATE_STREAM).integers(
        0, 2, size=(spec.num_classes, spec.channels, TEMPLATE_GRID, TEMPLATE_GRID), dtype=np.uint8
    )
    return cells * np.uint8(255)


def _image_chunks(
    spec: DatasetSpec, labels: np.ndarray, seed: int, split: str
) -> Iterator[np.ndarray]:
    """The images of `labels`, `_CHUNK_BYTES` at a time: uniform noise plus each label's template,
    generated as uint16 and uint8 (no int64 or float intermediate)."""
    unique = len(labels)
    per_chunk = max(1, _CHUNK_BYTES // spec.bytes_per_image)
    templates = class_templates(spec, seed)
    show_progress = unique * spec.bytes_per_image >= _PROGRESS_BAR_BYTES
    with steps(
        unique, f"generating synthetic {spec.name} ({split})", "img", enabled=show_progress
    ) as progress:
        for index, start in enumerate(range(0, unique, per_chunk)):
            count = min(per_chunk, unique - start)
            # Drawn as uint16: numpy draws a range that is not a power of two 6x faster so.
            images = (
                _split_rng(spec, seed, split, _IMAGES, index)
                .integers(0, 256 - SIGNAL_LEVEL, size=(count, *spec.input_shape), dtype=np.uint16)
                .astype(np.uint8)
            )
            _add_templates(images, templates[labels[start : start + count]])
            progress.update(count)
            yield images


def _add_templates(images: np.ndarray, templates: np.ndarray) -> None:
    """Add SIGNAL_LEVEL to `images` (N, C, H, W) where their coarse `templates` (N, C, grid, grid)
    are white: the pixels of each cell form a block of a (N, C, grid, H/grid, grid, W/grid)
    view, to which the cell's value is broadcast, in place."""
    count, channels, height, width = images.shape
    grid = TEMPLATE_GRID
    blocks = images.reshape(count, channels, grid, height // grid, grid, width // grid)
    signal = np.where(templates > 0, np.uint8(SIGNAL_LEVEL), np.uint8(0))
    blocks += signal[:, :, :, None, :, None]


def _labels(spec: DatasetSpec, unique: int, seed: int, split: str) -> np.ndarray:
    """Uniformly random labels in [0, num_classes), one per distinct image of `split`."""
    return _split_rng(spec, seed, split, _LABELS).integers(
        0, spec.num_classes, size=unique, dtype=np.int64
    )


class SyntheticDataset(Dataset):
    """`length` samples backed by `unique` memory-mapped images; sample i is image i % unique.

    Samples are (C, H, W) tensors in [0, 1], float32 (torch's default dtype), and int labels,
    the same form as the real datasets after ToTensor. `__getitems__` returns a whole batch from
    one numpy fancy-indexing read; torch's DataLoader calls it for batched fetches, and
    `EpochLoader` calls it directly.
    Batches are converted into recycled buffers (see `buffers` for why and why that is safe).
    """

    # Tells `EpochLoader` that `__getitems__` returns a ready (images, labels) batch.
    fetches_whole_batches = True

    def __init__(
        self,
        directory: Path,
        length: int,
        *,
        images: np.ndarray | None = None,
        labels: np.ndarray | None = None,
        generated: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.length = length
        self.generated = generated  # whether building this dataset (re)generated the cache
        self._images = images
        self._labels = labels
        self._buffers = BufferPool()

    def __len__(self) -> int:
        return self.length

    @property
    def unique_samples(self) -> int:
        """Number of distinct stored images."""
        return len(self._arrays()[1])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} samples")
        images, labels = self._arrays()
        stored = index % len(labels)
        image = torch.from_numpy(np.array(images[stored])).to(torch.get_default_dtype())
        image.div_(255)
        return image, int(labels[stored])

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of `indices`: (N, C, H, W) images in [0, 1] in torch's default dtype
        (float32 unless the process set another) and int64 (N,) labels."""
        positions = np.asarray(indices, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.length):
            raise IndexError(f"batch indices outside [0, {self.length})")
        images, labels = self._arrays()
        stored = positions % len(labels)
        gathered = torch.from_numpy(images[stored])  # one fancy-indexing read of the memmap
        batch = self._buffers.empty(tuple(gathered.shape)).copy_(gathered).div_(255)
        return batch, torch.from_numpy(labels[stored])

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The memmaps, opened lazily so that worker processes map the files themselves."""
        if self._images is None or self._labels is None:
            self._images = np.load(self.directory / IMAGES_FILE, mmap_mode="r")
            self._labels = np.load(self.directory / LABELS_FILE, mmap_mode="r")
        return self._images, self._labels

    def __getstate__(self) -> dict[str, Any]:
        # Pickling a memmap would copy the whole array into the message sent to each
        # DataLoader worker (under the spawn start method); send the path and reopen instead.
        return {**self.__dict__, "_images": None, "_labels": None}
