"""Real datasets read from disk through torchvision, in their standard on-disk formats.

    mnist     <root>/MNIST/raw/train-images-idx3-ubyte, train-labels-idx1-ubyte (idx files)
    cifar10   <root>/cifar-10-batches-py/data_batch_1 .. data_batch_5 (pickled dicts)
    imagenet  <root>/train/<class>/<image>.JPEG (ImageFolder)

Only the training split is read, nothing is downloaded (compute nodes usually have no network),
and samples come out as float32 (C, H, W) tensors and int labels, like the synthetic datasets.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Callable
from pathlib import Path

from torch.utils.data import Dataset
from torchvision import datasets, transforms

from workloads.datasets.spec import DatasetSpec

logger = logging.getLogger(__name__)

_MNIST_TRAIN_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
_CIFAR10_TRAIN_FILES = tuple(f"data_batch_{number}" for number in range(1, 6))
_CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                    "ship", "truck"]
# Channel statistics of the ImageNet training set, the normalisation every torchvision model uses.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class TrainOnlyMNIST(datasets.MNIST):
    """torchvision's MNIST that needs only the training files.

    torchvision insists on the test files too, although the benchmark never reads them; and it
    derives its folder from the class name, which a subclass would change.
    """

    @property
    def raw_folder(self) -> str:
        return os.path.join(self.root, "MNIST", "raw")

    @property
    def processed_folder(self) -> str:
        return os.path.join(self.root, "MNIST", "processed")

    def _check_exists(self) -> bool:
        folder = self.raw_folder
        return all(os.path.isfile(os.path.join(folder, name)) for name in _MNIST_TRAIN_FILES)


class UncheckedCIFAR10(datasets.CIFAR10):
    """torchvision's CIFAR-10 with existence checks instead of md5 checks.

    torchvision compares every batch file (test batch and batches.meta included) with the md5 of
    the official release, so a subset, a re-packed copy or a train-only copy fails to load. The
    pickled format is still validated by unpickling, and the training batches must exist.
    """

    def _check_integrity(self) -> bool:
        folder = os.path.join(self.root, self.base_folder)
        return all(os.path.isfile(os.path.join(folder, name)) for name in _CIFAR10_TRAIN_FILES)

    def _load_meta(self) -> None:
        path = os.path.join(self.root, self.base_folder, self.meta["filename"])
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                self.classes = pickle.load(handle, encoding="latin1")[self.meta["key"]]
        else:
            self.classes = list(_CIFAR10_CLASSES)
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}


def imagenet_train_transform() -> transforms.Compose:
    """The standard ImageNet training augmentation (as in the torchvision reference scripts)."""
    return transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def required_paths(spec: DatasetSpec, root: Path) -> list[Path]:
    """The files or folders that must exist under `root` to load `spec` from disk."""
    if spec.name == "mnist":
        return [root / "MNIST" / "raw" / name for name in _MNIST_TRAIN_FILES]
    if spec.name == "cifar10":
        return [root / datasets.CIFAR10.base_folder / name for name in _CIFAR10_TRAIN_FILES]
    if spec.name == "imagenet":
        return [root / "train"]
    raise ValueError(f"dataset {spec.name!r} has no real on-disk version; allowed for "
                     f"source='real': {', '.join(_LOADERS)}; use source='synthetic'")


def build_real(spec: DatasetSpec, root: str | Path) -> Dataset:
    """The training split of `spec` read from `root`; ValueError naming what is missing."""
    root = Path(root)
    missing = [str(path) for path in required_paths(spec, root) if not path.exists()]
    if missing:
        raise ValueError(f"real dataset {spec.name!r} not found under root={str(root)!r}; "
                         f"missing: {', '.join(missing)}")
    dataset = _LOADERS[spec.name](root)
    _check_class_count(spec, dataset)
    logger.info("loaded real %s from %s: %d samples", spec.name, root, len(dataset))
    return dataset


def _check_class_count(spec: DatasetSpec, dataset: Dataset) -> None:
    """Reject more classes than the network's output layer has: the loss would fail mid-run."""
    classes = getattr(dataset, "classes", [])
    if len(classes) > spec.num_classes:
        raise ValueError(f"real dataset {spec.name!r} has {len(classes)} classes on disk, but the "
                         f"spec allows at most {spec.num_classes}")


def _mnist(root: Path) -> Dataset:
    return TrainOnlyMNIST(root, train=True, download=False, transform=transforms.ToTensor())


def _cifar10(root: Path) -> Dataset:
    return UncheckedCIFAR10(root, train=True, download=False, transform=transforms.ToTensor())


def _imagenet(root: Path) -> Dataset:
    try:
        return datasets.ImageFolder(root / "train", transform=imagenet_train_transform())
    except FileNotFoundError as error:  # no class folders, or no images in them
        raise ValueError(f"real dataset 'imagenet' under {root / 'train'}: {error}") from None


_LOADERS: dict[str, Callable[[Path], Dataset]] = {
    "mnist": _mnist,
    "cifar10": _cifar10,
    "imagenet": _imagenet,
}
