"""workloads.datasets: synthetic cache, real on-disk formats, and the per-rank EpochLoader."""

from __future__ import annotations

import json
import os
import pickle
import struct
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from workloads.datasets import (
    DATASET_SPECS,
    EpochLoader,
    SyntheticDataset,
    build_dataset,
    dataset_spec,
    synthetic,
)
from workloads.datasets.buffers import BufferPool
from workloads.datasets.cache import MANIFEST_NAME

CIFAR = dataset_spec("cifar10")
DATA_FILES = ("images.npy", "labels.npy")


def synthetic_cifar(
    cache: Path, *, num_samples: int = 64, unique: int | None = None, seed: int = 0
) -> SyntheticDataset:
    dataset = build_dataset(
        CIFAR, num_samples=num_samples, seed=seed, cache_dir=cache, synthetic_unique_samples=unique
    )
    assert isinstance(dataset, SyntheticDataset)
    return dataset


def file_bytes(dataset: SyntheticDataset) -> dict[str, bytes]:
    return {name: (dataset.directory / name).read_bytes() for name in DATA_FILES}


def file_stamps(directory: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of each cache file: both change when a file is rewritten via os.replace."""
    return {
        name: (os.stat(directory / name).st_ino, os.stat(directory / name).st_mtime_ns)
        for name in (*DATA_FILES, MANIFEST_NAME)
    }


def per_sample_batch(
    dataset: torch.utils.data.Dataset, indices: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    items = [dataset[int(index)] for index in indices]
    return (
        torch.stack([image for image, _ in items]),
        torch.tensor([label for _, label in items], dtype=torch.int64),
    )


# ---------------------------------------------------------------------------- synthetic data


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path: Path) -> None:
    first = synthetic_cifar(tmp_path / "a", seed=3)
    again = synthetic_cifar(tmp_path / "b", seed=3)
    other = synthetic_cifar(tmp_path / "c", seed=4)
    assert file_bytes(first) == file_bytes(again)
    assert file_bytes(first)["images.npy"] != file_bytes(other)["images.npy"]
    assert file_bytes(first)["labels.npy"] != file_bytes(other)["labels.npy"]


def test_datasets_with_the_same_seed_differ_between_dataset_names(tmp_path: Path) -> None:
    spec = dataset_spec("imagenet")
    imagenet = build_dataset(spec, num_samples=2, cache_dir=tmp_path)
    highres = build_dataset(dataset_spec("highres"), num_samples=2, cache_dir=tmp_path)
    assert not torch.equal(imagenet[0][0][:, :8, :8], highres[0][0][:, :8, :8])


# The image datasets (the token datasets' own tests: tests/unit/workloads/datasets/test_tokens.py).
IMAGE_DATASETS = sorted(name for name, spec in DATASET_SPECS.items() if not spec.tokens)


@pytest.mark.parametrize("name", IMAGE_DATASETS)
def test_synthetic_shapes_dtypes_and_ranges(tmp_path: Path, name: str) -> None:
    spec = dataset_spec(name)
    dataset = build_dataset(spec, num_samples=8, cache_dir=tmp_path, synthetic_unique_samples=4)
    assert len(dataset) == 8 and dataset.unique_samples == 4
    images, labels = dataset.__getitems__([0, 5, 7])
    assert images.shape == (3, *spec.input_shape) and images.dtype == torch.float32
    assert labels.shape == (3,) and labels.dtype == torch.int64
    assert 0.0 <= images.min() and images.max() <= 1.0 and images.std() > 0.2
    assert ((0 <= labels) & (labels < spec.num_classes)).all()
    image, label = dataset[1]
    assert image.shape == spec.input_shape and image.dtype == torch.float32
    assert isinstance(label, int)
    stored = np.load(dataset.directory / "images.npy", mmap_mode="r")
    assert stored.dtype == np.uint8 and stored.shape == (4, *spec.input_shape)


def test_default_length_and_unique_counts(tmp_path: Path) -> None:
    mnist = build_dataset(dataset_spec("mnist"), cache_dir=tmp_path, synthetic_unique_samples=10)
    assert len(mnist) == 70_000 and mnist.unique_samples == 10
    assert synthetic.unique_sample_count(dataset_spec("imagenet"), 1_280_000, None) == 10_000
    assert synthetic.unique_sample_count(dataset_spec("highres"), 60_000, None) == 2_000
    assert synthetic.unique_sample_count(dataset_spec("cifar10"), 60_000, None) == 60_000
    assert synthetic.unique_sample_count(dataset_spec("imagenet"), 100, None) == 100


def test_index_wraps_around_the_unique_images(tmp_path: Path) -> None:
    dataset = synthetic_cifar(tmp_path, num_samples=10, unique=4)
    for index in range(10):
        image, label = dataset[index]
        reference, reference_label = dataset[index % 4]
        assert torch.equal(image, reference) and label == reference_label
    images, labels = dataset.__getitems__([1, 5, 9])
    assert torch.equal(images[0], images[1]) and torch.equal(images[0], images[2])
    assert len(set(labels.tolist())) == 1
    assert not torch.equal(dataset[0][0], dataset[1][0])
    with pytest.raises(IndexError):
        dataset[10]
    with pytest.raises(IndexError):
        dataset.__getitems__([0, 10])


def test_values_are_the_stored_bytes_divided_by_255(tmp_path: Path) -> None:
    dataset = synthetic_cifar(tmp_path, num_samples=4)
    stored = np.load(dataset.directory / "images.npy")
    images, _ = dataset.__getitems__([2, 0])
    assert torch.allclose(images, torch.from_numpy(stored[[2, 0]]).float() / 255)


# ------------------------------------------------------------------ eval split, class signal

MNIST = dataset_spec("mnist")


def mnist_splits(
    cache: Path, *, seed: int = 0, count: int = 400
) -> tuple[SyntheticDataset, SyntheticDataset]:
    """The training and the eval split of synthetic MNIST, `count` samples each."""
    train = build_dataset(MNIST, num_samples=count, seed=seed, cache_dir=cache)
    held_out = build_dataset(MNIST, split="eval", num_samples=count, seed=seed, cache_dir=cache)
    assert isinstance(train, SyntheticDataset) and isinstance(held_out, SyntheticDataset)
    return train, held_out


def all_samples(dataset: SyntheticDataset) -> tuple[np.ndarray, np.ndarray]:
    """Every sample as float pixels in [0, 1], flattened (N, C*H*W), and the labels (N,)."""
    images, labels = dataset.__getitems__(list(range(len(dataset))))
    return images.flatten(1).numpy().copy(), labels.numpy().copy()


def cell_means(images: np.ndarray) -> np.ndarray:
    """Mean of each template cell of (N, H*W) MNIST images: (N, grid, grid)."""
    grid, block = synthetic.TEMPLATE_GRID, MNIST.resolution // synthetic.TEMPLATE_GRID
    return images.reshape(-1, grid, block, grid, block).mean(axis=(2, 4))


def test_eval_split_sizes_and_whole_split_default(tmp_path: Path) -> None:
    sizes = {name: DATASET_SPECS[name].num_eval_images for name in IMAGE_DATASETS}
    assert sizes == {"mnist": 10_000, "cifar10": 10_000, "imagenet": 50_000, "highres": 10_000}
    whole = build_dataset(MNIST, split="eval", cache_dir=tmp_path, synthetic_unique_samples=8)
    assert len(whole) == 10_000 and whole.unique_samples == 8
    assert isinstance(whole, SyntheticDataset)  # the same class, so the same cost to load


def test_eval_split_is_its_own_data_in_its_own_cache_entry(tmp_path: Path) -> None:
    train, held_out = mnist_splits(tmp_path)
    assert train.directory != held_out.directory
    assert "-eval-" in held_out.directory.name and "-train-" in train.directory.name
    train_images, train_labels = all_samples(train)
    eval_images, eval_labels = all_samples(held_out)
    assert not np.array_equal(train_labels, eval_labels)
    # No eval image is a training image (independent noise; not a single pair is equal).
    assert not (train_images[:, None, :50] == eval_images[None, :, :50]).all(axis=2).any()
    for labels in (train_labels, eval_labels):  # every class appears in both splits
        assert set(labels.tolist()) == set(range(MNIST.num_classes))
    again, again_eval = mnist_splits(tmp_path / "again")
    assert file_bytes(again_eval) == file_bytes(held_out) and file_bytes(again) == file_bytes(train)
    _, other_seed = mnist_splits(tmp_path / "other", seed=1)
    assert file_bytes(other_seed)["images.npy"] != file_bytes(held_out)["images.npy"]


def test_both_splits_carry_the_same_class_templates(tmp_path: Path) -> None:
    """Each class's mean over the cells of the template is what the blend predicts, in both splits:
    (1 - s) * 127.5 (the mean of the noise) + s * template, the template's cells 0 or 255."""
    templates = synthetic.class_templates(MNIST, 0)[:, 0].astype(np.float64)  # (classes, 4, 4)
    strength = synthetic.SIGNAL_STRENGTH
    expected = ((1 - strength) * 127.5 + strength * templates) / 255
    class_means = []
    for dataset in mnist_splits(tmp_path, count=2000):
        images, labels = all_samples(dataset)
        means = np.stack(
            [cell_means(images[labels == label]).mean(axis=0) for label in range(MNIST.num_classes)]
        )
        # ~200 images x 49 pixels per cell: the noise's mean is within ~0.003 of 127.5/255.
        assert np.abs(means - expected).max() < 0.02
        class_means.append(means)
    assert np.abs(class_means[0] - class_means[1]).max() < 0.03
    assert not np.array_equal(synthetic.class_templates(MNIST, 1), templates)


def test_the_classes_are_learnable_from_the_blocks_but_no_pixel_gives_them_away(
    tmp_path: Path,
) -> None:
    """A nearest-class-mean classifier fitted on 100 training images classifies held-out images
    far above chance (0.1); on one pixel per template cell it does much worse: the class is in
    the averages over blocks of pixels, which a network has to learn to take."""
    train, held_out = mnist_splits(tmp_path, count=300)
    train_images, train_labels = all_samples(train)
    eval_images, eval_labels = all_samples(held_out)
    train_images, train_labels = train_images[:100], train_labels[:100]
    block = MNIST.resolution // synthetic.TEMPLATE_GRID
    one_pixel_per_cell = (
        np.arange(synthetic.TEMPLATE_GRID)[:, None] * block * MNIST.resolution
        + np.arange(synthetic.TEMPLATE_GRID)[None, :] * block
    ).ravel()

    def nearest_class_mean(pixels: np.ndarray) -> float:
        means = np.stack(
            [
                train_images[train_labels == label][:, pixels].mean(axis=0)
                for label in range(MNIST.num_classes)
            ]
        )
        distances = ((eval_images[:, None, pixels] - means[None]) ** 2).sum(axis=2)
        return float((distances.argmin(axis=1) == eval_labels).mean())

    whole_images = nearest_class_mean(np.arange(train_images.shape[1]))
    single_pixels = nearest_class_mean(one_pixel_per_cell)
    assert whole_images > 0.8
    assert 0.15 < single_pixels < whole_images - 0.2


def test_the_generator_version_is_in_the_cache_key(tmp_path: Path) -> None:
    """Caches of the uniform-noise generator (version 1) are never reused for learnable data."""
    dataset = synthetic_cifar(tmp_path)
    assert synthetic.GENERATOR_VERSION == 2 and dataset.directory.name.endswith("-v2")
    manifest = json.loads((dataset.directory / MANIFEST_NAME).read_text())
    assert manifest["params"]["generator_version"] == 2 and manifest["params"]["split"] == "train"


def test_unknown_split(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown split 'test'; allowed: train, eval"):
        build_dataset(CIFAR, split="test", cache_dir=tmp_path)


# ---------------------------------------------------------------------------- cache


def test_second_build_reuses_the_cached_files(tmp_path: Path) -> None:
    first = synthetic_cifar(tmp_path)
    stamps = file_stamps(first.directory)
    second = synthetic_cifar(tmp_path)
    assert first.generated and not second.generated
    assert second.directory == first.directory
    assert file_stamps(second.directory) == stamps
    manifest = json.loads((first.directory / MANIFEST_NAME).read_text())
    assert manifest["params"]["seed"] == 0 and manifest["params"]["unique_samples"] == 64
    assert manifest["files"]["images.npy"]["shape"] == [64, 3, 32, 32]
    assert len(manifest["files"]["images.npy"]["sha256"]) == 64


def test_different_parameters_get_their_own_cache_entry(tmp_path: Path) -> None:
    directories = {
        synthetic_cifar(tmp_path, num_samples=8, unique=unique, seed=seed).directory
        for unique in (4, 8)
        for seed in (0, 1)
    }
    assert len(directories) == 4


def test_killed_generation_is_not_trusted(tmp_path: Path) -> None:
    """A truncated images file, no manifest and a stray temp file: the state after a kill."""
    reference = file_bytes(synthetic_cifar(tmp_path / "reference"))
    dataset = synthetic_cifar(tmp_path / "cache")
    (dataset.directory / MANIFEST_NAME).unlink()
    with open(dataset.directory / "images.npy", "r+b") as handle:
        handle.truncate(1000)
    stray = dataset.directory / ".tmp-images.npy.abc123"
    stray.write_bytes(b"partial")
    rebuilt = synthetic_cifar(tmp_path / "cache")
    assert rebuilt.generated
    assert file_bytes(rebuilt) == reference
    assert not stray.exists()


def test_size_mismatch_with_the_manifest_regenerates(tmp_path: Path) -> None:
    dataset = synthetic_cifar(tmp_path)
    reference = file_bytes(dataset)
    with open(dataset.directory / "labels.npy", "ab") as handle:
        handle.write(b"extra")
    rebuilt = synthetic_cifar(tmp_path)
    assert rebuilt.generated and file_bytes(rebuilt) == reference


@pytest.mark.parametrize("manifest", ["{not json", json.dumps({"format": 1, "params": {}})])
def test_unreadable_or_foreign_manifest_regenerates(tmp_path: Path, manifest: str) -> None:
    dataset = synthetic_cifar(tmp_path)
    (dataset.directory / MANIFEST_NAME).write_text(manifest)
    assert synthetic_cifar(tmp_path).generated


def test_a_truncated_file_under_a_valid_manifest_is_regenerated_not_read(tmp_path: Path) -> None:
    dataset = synthetic_cifar(tmp_path)
    reference = file_bytes(dataset)
    with open(dataset.directory / "images.npy", "r+b") as handle:
        handle.truncate(os.path.getsize(dataset.directory / "images.npy") // 2)
    rebuilt = synthetic_cifar(tmp_path)
    assert rebuilt.generated and file_bytes(rebuilt) == reference


def test_flipped_bits_of_the_same_size_are_found_by_the_checksum(tmp_path: Path) -> None:
    dataset = synthetic_cifar(tmp_path)
    reference = file_bytes(dataset)
    path = dataset.directory / "images.npy"
    middle = os.path.getsize(path) // 2
    with open(path, "r+b") as handle:  # flip every bit of 4 bytes mid-file, keep the size
        handle.seek(middle)
        flipped = bytes(b ^ 0xFF for b in handle.read(4))
        handle.seek(middle)
        handle.write(flipped)
    assert path.read_bytes() != reference["images.npy"]
    rebuilt = synthetic_cifar(tmp_path)  # the default load checks the sha256
    assert rebuilt.generated and file_bytes(rebuilt) == reference


def test_generation_failing_midway_leaves_nothing_to_trust(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_chunks = synthetic._image_chunks

    def failing_chunks(*args: object) -> Iterator[np.ndarray]:
        yield next(real_chunks(*args))[:1]
        raise KeyboardInterrupt  # as if the job were cancelled mid-write

    monkeypatch.setattr(synthetic, "_image_chunks", failing_chunks)
    with pytest.raises(KeyboardInterrupt):
        synthetic_cifar(tmp_path)
    (directory,) = tmp_path.iterdir()
    assert sorted(path.name for path in directory.iterdir()) == [".lock"]
    monkeypatch.undo()
    assert synthetic_cifar(tmp_path).generated


def _build_in_process(cache: str) -> bytes:
    dataset = synthetic_cifar(Path(cache), num_samples=2000)
    return (dataset.directory / "images.npy").read_bytes()


def test_concurrent_generation_by_two_processes(tmp_path: Path) -> None:
    with ProcessPoolExecutor(2, mp_context=get_context("fork")) as pool:
        results = list(pool.map(_build_in_process, [str(tmp_path)] * 2))
    assert results[0] == results[1]
    dataset = synthetic_cifar(tmp_path, num_samples=2000)
    assert not dataset.generated and file_bytes(dataset)["images.npy"] == results[0]
    assert not list(dataset.directory.glob(".tmp-*"))


def test_pickled_dataset_reopens_the_files_instead_of_copying_them(tmp_path: Path) -> None:
    """Under the spawn start method every DataLoader worker receives a pickled dataset."""
    dataset = synthetic_cifar(tmp_path, num_samples=2000)
    dataset.__getitems__([0, 1])
    payload = pickle.dumps(dataset)
    assert len(payload) < 10_000  # the images alone are 6 MB
    copy = pickle.loads(payload)
    assert torch.equal(copy.__getitems__([7, 3])[0], dataset.__getitems__([7, 3])[0])


def test_buffer_pool_reuses_only_dropped_buffers() -> None:
    pool = BufferPool(capacity=2)
    first = pool.empty((2, 3))
    first_pointer = first.data_ptr()
    second = pool.empty((2, 3))
    assert second.data_ptr() != first_pointer
    view = first[0]
    del first
    assert pool.empty((2, 3)).data_ptr() != first_pointer  # a view still uses the buffer
    del view
    assert pool.empty((2, 3)).data_ptr() == first_pointer


def test_buffer_pool_hands_out_torchs_default_dtype() -> None:
    """float32 unless the process set another (the trajectory tests train in float64); a buffer
    of another dtype is never handed out for it."""
    pool = BufferPool(capacity=2)
    assert pool.empty((2, 3)).dtype == torch.float32  # dropped at once: free again
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert pool.empty((2, 3)).dtype == torch.float64
    finally:
        torch.set_default_dtype(before)


# ---------------------------------------------------------------------------- EpochLoader


def test_epoch_loader_counts_full_batches_only(tmp_path: Path) -> None:
    dataset = synthetic_cifar(tmp_path, num_samples=100)
    loader = EpochLoader(dataset, 8, seed=0)
    batches = list(loader)
    assert len(loader) == len(batches) == 12 and loader.samples_per_epoch == 96
    assert all(
        images.shape == (8, 3, 32, 32) and labels.shape == (8,) for images, labels in batches
    )
    assert len(EpochLoader(dataset, 8, seed=0, rank=1, world_size=2)) == 6


def test_batches_equal_the_per_sample_items(tmp_path: Path) -> None:
    dataset = synthetic_cifar(tmp_path, num_samples=40, unique=16)
    loader = EpochLoader(dataset, 8, seed=5)
    batches = list(loader)  # kept alive together: recycled buffers must not be shared
    for (images, labels), indices in zip(batches, loader.batch_indices(), strict=True):
        expected_images, expected_labels = per_sample_batch(dataset, indices)
        assert images.dtype == torch.float32 and labels.dtype == torch.int64
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)


def test_set_epoch_reshuffles_deterministically(tmp_path: Path) -> None:
    dataset = synthetic_cifar(tmp_path, num_samples=64)
    loader = EpochLoader(dataset, 8, seed=1)
    epoch0 = loader.batch_indices()
    loader.set_epoch(1)
    epoch1 = loader.batch_indices()
    assert not np.array_equal(epoch0, epoch1)
    assert sorted(epoch0.ravel()) == sorted(epoch1.ravel()) == list(range(64))
    again = EpochLoader(dataset, 8, seed=1)
    again.set_epoch(1)
    assert np.array_equal(again.batch_indices(), epoch1)
    assert torch.equal(next(iter(again))[0], next(iter(loader))[0])
    assert not np.array_equal(EpochLoader(dataset, 8, seed=2).batch_indices(), epoch0)
    unshuffled = EpochLoader(dataset, 8, seed=1, shuffle=False).batch_indices()
    assert np.array_equal(unshuffled.ravel(), np.arange(64))


def test_rank_shards_are_disjoint_and_equally_long(tmp_path: Path) -> None:
    dataset = synthetic_cifar(tmp_path, num_samples=70)
    shards = [EpochLoader(dataset, 8, seed=0, rank=rank, world_size=2) for rank in range(2)]
    for epoch in (0, 3):
        indices = []
        for shard in shards:
            shard.set_epoch(epoch)
            indices.append(set(shard.batch_indices().ravel().tolist()))
        assert len(shards[0]) == len(shards[1]) == 4
        assert len(indices[0]) == len(indices[1]) == 32
        assert not indices[0] & indices[1]
    assert [len(list(shard)) for shard in shards] == [4, 4]


def test_worker_processes_give_the_same_batches(tmp_path: Path) -> None:
    dataset = synthetic_cifar(tmp_path, num_samples=48, unique=16)
    in_process = EpochLoader(dataset, 8, seed=2)
    workers = EpochLoader(dataset, 8, seed=2, num_workers=1)
    for epoch in (0, 1):  # the workers persist across epochs and follow set_epoch
        in_process.set_epoch(epoch)
        workers.set_epoch(epoch)
        for (images, labels), (expected, expected_labels) in zip(workers, in_process, strict=True):
            assert torch.equal(images, expected) and torch.equal(labels, expected_labels)


@pytest.mark.parametrize(
    "arguments",
    [
        {"batch_size": 0},
        {"rank": 2, "world_size": 2},
        {"rank": -1},
        {"world_size": 0},
        {"num_workers": -1},
        {"seed": -1},
    ],
)
def test_epoch_loader_rejects_bad_arguments(tmp_path: Path, arguments: dict[str, int]) -> None:
    dataset = synthetic_cifar(tmp_path, num_samples=8)
    options = {"batch_size": 4, "seed": 0, **arguments}
    with pytest.raises(ValueError):
        EpochLoader(dataset, **options)


# ---------------------------------------------------------------------------- real formats


def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    """An idx file as published by LeCun: big-endian magic and dimensions, then uint8 data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, count: int, prefix: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """The idx files of one split: prefix "train" (training) or "t10k" (test)."""
    rng = np.random.default_rng(0 if prefix == "train" else 10)
    images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    write_idx(root / "MNIST" / "raw" / f"{prefix}-images-idx3-ubyte", images, 0x00000803)
    write_idx(root / "MNIST" / "raw" / f"{prefix}-labels-idx1-ubyte", labels, 0x00000801)
    return images, labels


def write_cifar10(root: Path, per_batch: int) -> tuple[np.ndarray, list[int]]:
    """Five pickled training batches: {"data": (N, 3072) uint8 rows of R, G, B planes, "labels"}.

    The official files are Python 2 pickles whose str keys unpickle as str under the
    encoding="latin1" that torchvision uses; Python 3 str keys load the same way.
    """
    rng = np.random.default_rng(1)
    all_data, all_labels = [], []
    for number in range(1, 6):
        data, labels = write_cifar10_batch(root, f"data_batch_{number}", per_batch, rng)
        all_data.append(data)
        all_labels.extend(labels)
    return np.concatenate(all_data), all_labels


def write_cifar10_batch(
    root: Path, name: str, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, list[int]]:
    """One pickled batch file (a training batch, or "test_batch")."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    data = rng.integers(0, 256, size=(count, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count).tolist()
    batch = {
        "batch_label": name,
        "labels": labels,
        "data": data,
        "filenames": [f"{name}_{index}.png" for index in range(count)],
    }
    (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    return data, labels


def write_image_folder(
    root: Path, classes: int, per_class: int, split: str = "train", first_class: int = 0
) -> None:
    """Class folders n0144<index> of JPEGs under root/<split> ("train" or "val")."""
    rng = np.random.default_rng(2)
    for class_index in range(first_class, first_class + classes):
        folder = root / split / f"n0144{class_index:04d}"
        folder.mkdir(parents=True)
        for index in range(per_class):
            pixels = rng.integers(0, 256, size=(30 + index, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"n0144_{index}.JPEG", quality=90)


def test_real_mnist_from_idx_files(tmp_path: Path) -> None:
    images, labels = write_mnist(tmp_path / "data", 20)
    dataset = build_dataset(
        dataset_spec("mnist"), source="real", root=tmp_path / "data", cache_dir=tmp_path / "cache"
    )
    assert len(dataset) == 20
    image, label = dataset[3]
    assert image.shape == (1, 28, 28) and label == labels[3]
    assert torch.allclose(image[0], torch.from_numpy(images[3]).float() / 255)
    loader = EpochLoader(dataset, 4, seed=0)
    batches = list(loader)
    assert len(batches) == 5
    for (batch_images, batch_labels), indices in zip(batches, loader.batch_indices(), strict=True):
        assert batch_images.shape == (4, 1, 28, 28) and batch_images.dtype == torch.float32
        assert batch_labels.dtype == torch.int64
        assert batch_labels.tolist() == labels[indices].tolist()
    subset = build_dataset(
        dataset_spec("mnist"),
        source="real",
        root=tmp_path / "data",
        num_samples=8,
        cache_dir=tmp_path / "cache",
    )
    assert len(subset) == 8 and torch.equal(subset[3][0], image)


def test_real_cifar10_from_pickled_batches(tmp_path: Path) -> None:
    data, labels = write_cifar10(tmp_path, per_batch=4)
    dataset = build_dataset(CIFAR, source="real", root=tmp_path, cache_dir=tmp_path / "cache")
    assert len(dataset) == 20
    image, label = dataset[13]
    assert image.shape == (3, 32, 32) and label == labels[13]
    assert torch.allclose(image, torch.from_numpy(data[13].reshape(3, 32, 32)).float() / 255)
    images, batch_labels = next(iter(EpochLoader(dataset, 5, seed=0)))
    assert images.shape == (5, 3, 32, 32) and images.dtype == torch.float32
    assert batch_labels.dtype == torch.int64


def test_real_imagenet_from_an_image_folder_with_workers(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=2, per_class=3)
    dataset = build_dataset(
        dataset_spec("imagenet"), source="real", root=tmp_path, cache_dir=tmp_path / "cache"
    )
    assert len(dataset) == 6
    loader = EpochLoader(dataset, 2, seed=0, num_workers=2)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == 3
        for images, labels in batches:
            assert images.shape == (2, 3, 224, 224) and images.dtype == torch.float32
            assert labels.dtype == torch.int64 and set(labels.tolist()) <= {0, 1}
            assert images.min() < 0  # normalised with the ImageNet mean and std


def test_real_mnist_test_split_from_t10k_files(tmp_path: Path) -> None:
    write_mnist(tmp_path, 20)
    images, labels = write_mnist(tmp_path, 12, prefix="t10k")
    dataset = build_dataset(MNIST, split="eval", source="real", root=tmp_path, cache_dir=tmp_path)
    assert len(dataset) == 12
    image, label = dataset[5]
    assert label == labels[5] and torch.allclose(image[0], torch.from_numpy(images[5]) / 255)
    # A part of the split is evenly spaced over it, not its first samples.
    subset = build_dataset(
        MNIST, split="eval", source="real", root=tmp_path, num_samples=4, cache_dir=tmp_path
    )
    assert [subset[index][1] for index in range(4)] == labels[[0, 3, 6, 9]].tolist()


def test_real_cifar10_test_split_from_test_batch(tmp_path: Path) -> None:
    data, labels = write_cifar10_batch(tmp_path, "test_batch", 6, np.random.default_rng(5))
    # Only the test batch is on disk: evaluation needs no training files (and vice versa).
    dataset = build_dataset(CIFAR, split="eval", source="real", root=tmp_path, cache_dir=tmp_path)
    assert len(dataset) == 6
    image, label = dataset[4]
    assert label == labels[4]
    assert torch.allclose(image, torch.from_numpy(data[4].reshape(3, 32, 32)).float() / 255)


def test_real_imagenet_val_uses_the_training_class_indices(tmp_path: Path) -> None:
    """val holds classes 2 and 3 of four: their labels are 2 and 3, as in training, not 0 and 1;
    images are resized to 256 and centre-cropped to 224, the same on every read."""
    write_image_folder(tmp_path, classes=4, per_class=1)
    write_image_folder(tmp_path, classes=2, per_class=2, split="val", first_class=2)
    dataset = build_dataset(
        dataset_spec("imagenet"), split="eval", source="real", root=tmp_path, cache_dir=tmp_path
    )
    assert len(dataset) == 4
    assert sorted(dataset[index][1] for index in range(4)) == [2, 2, 3, 3]
    image = dataset[0][0]
    assert image.shape == (3, 224, 224) and torch.equal(image, dataset[0][0])


def test_real_imagenet_val_class_unknown_to_training(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=1, per_class=1)
    write_image_folder(tmp_path, classes=1, per_class=1, split="val", first_class=1)
    with pytest.raises(ValueError, match="val classes n01440001 have no folder in .*train"):
        build_dataset(
            dataset_spec("imagenet"), split="eval", source="real", root=tmp_path, cache_dir=tmp_path
        )


# ---------------------------------------------------------------------------- errors


def test_highres_has_no_real_version(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="highres.*only as synthetic.*allowed source.*synthetic"):
        build_dataset(dataset_spec("highres"), source="real", root=tmp_path, cache_dir=tmp_path)


def test_real_without_root(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs root"):
        build_dataset(CIFAR, source="real", cache_dir=tmp_path)


@pytest.mark.parametrize(
    "name, missing",
    [
        ("mnist", "train-images-idx3-ubyte"),
        ("cifar10", "data_batch_1"),
        ("imagenet", "train"),
    ],
)
def test_real_root_without_the_files(tmp_path: Path, name: str, missing: str) -> None:
    with pytest.raises(ValueError, match=f"not found under root.*missing: .*{missing}"):
        build_dataset(dataset_spec(name), source="real", root=tmp_path, cache_dir=tmp_path)


@pytest.mark.parametrize(
    "name, missing",
    [
        ("mnist", "t10k-images-idx3-ubyte"),
        ("cifar10", "test_batch"),
        ("imagenet", "val"),
    ],
)
def test_real_root_without_the_test_split(tmp_path: Path, name: str, missing: str) -> None:
    with pytest.raises(ValueError, match=f"eval split.*not found under root.*missing: .*{missing}"):
        build_dataset(
            dataset_spec(name), split="eval", source="real", root=tmp_path, cache_dir=tmp_path
        )


def test_real_image_folder_without_images(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    with pytest.raises(ValueError, match="imagenet"):
        build_dataset(dataset_spec("imagenet"), source="real", root=tmp_path, cache_dir=tmp_path)


def test_num_samples_larger_than_the_real_dataset(tmp_path: Path) -> None:
    write_mnist(tmp_path, 20)
    with pytest.raises(ValueError, match="num_samples=21 exceeds the 20 samples"):
        build_dataset(
            dataset_spec("mnist"), source="real", root=tmp_path, num_samples=21, cache_dir=tmp_path
        )


def test_unknown_source(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown dataset source 'disk'; allowed: synthetic, real"):
        build_dataset(CIFAR, source="disk", cache_dir=tmp_path)


@pytest.mark.parametrize(
    "arguments", [{"num_samples": 0}, {"synthetic_unique_samples": 0}, {"seed": -1}]
)
def test_bad_synthetic_arguments(tmp_path: Path, arguments: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        build_dataset(CIFAR, cache_dir=tmp_path, **arguments)
