"""Real datasets read from disk through torchvision, in their standard on-disk formats.

              training split                                 eval split (the test split)
    mnist     <root>/MNIST/raw/train-images-idx3-ubyte,      t10k-images-idx3-ubyte,
              train-labels-idx1-ubyte (idx files)            t10k-labels-idx1-ubyte
    cifar10   <root>/cifar-10-batches-py/data_batch_1 .. 5   test_batch (pickled dicts)
    imagenet  <root>/train/<class>/<image>.JPEG              <root>/val/<class>/<image>.JPEG
              (ImageFolder)                                  (ImageFolder)

Each split needs only its own files (training never needs the test files), nothing is
downloaded (compute nodes usually have no network), and samples come out as float32 (C, H, W)
tensors and int labels, like the synthetic datasets. ImageNet's val folder is the usual
class-per-folder layout (the official flat val folder sorted into its classes, as the
torchvision reference scripts expect).
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset
from torchvision import datasets, transforms

from workloads.datasets.loader import dataset_length
from workloads.datasets.spec import DatasetSpec

logger = logging.getLogger(__name__)

_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "eval": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_CIFAR10_FILES = {
    "train": tuple(f"data_batch_{number}" for number in range(1, 6)),
    "eval": ("test_batch",),
}
_IMAGENET_FOLDERS = {"train": "train", "eval": "val"}
_CIFAR10_CLASSES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]
# Channel statistics of the ImageNet training set, the normalisation every torchvision model uses.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class SplitMNIST(datasets.MNIST):
    """torchvision's MNIST that needs only the files of the split it reads.

    torchvision insists on the files of both splits, although a cell that does not evaluate
    never reads the test files; and it derives its folder from the class name, which a subclass
    would change.
    """

    @property
    def raw_folder(self) -> str:
        return os.path.join(self.root, "MNIST", "raw")

    @property
    def processed_folder(self) -> str:
        return os.path.join(self.root, "MNIST", "processed")

    def _check_exists(self) -> bool:
        folder = self.raw_folder
        return all(
            os.path.isfile(os.path.join(folder, name)) for name in _MNIST_FILES[_split(self.train)]
        )


class UncheckedCIFAR10(datasets.CIFAR10):
    """torchvision's CIFAR-10 with existence checks instead of md5 checks.

    torchvision compares every batch file (test batch and batches.meta included) with the md5 of
    the official release, so a subset, a re-packed copy or a train-only copy fails to load. The
    pickled format is still validated by unpickling, and the batches of the split must exist.
    """

    def _check_integrity(self) -> bool:
        folder = os.path.join(self.root, self.base_folder)
        return all(
            os.path.isfile(os.path.join(folder, name))
            for name in _CIFAR10_FILES[_split(self.train)]
        )

    def _load_meta(self) -> None:
        path = os.path.join(self.root, self.base_folder, self.meta["filename"])
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                self.classes = pickle.load(handle, encoding="latin1")[self.meta["key"]]
        else:
            self.classes = list(_CIFAR10_CLASSES)
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}


def _split(train: bool) -> str:
    return "train" if train else "eval"


def imagenet_train_transform() -> transforms.Compose:
    """The standard ImageNet training augmentation (as in the torchvision reference scripts)."""
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def imagenet_eval_transform() -> transforms.Compose:
    """The standard ImageNet evaluation transform (as in the torchvision reference scripts)."""
    return transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def required_paths(spec: DatasetSpec, root: Path, split: str = "train") -> list[Path]:
    """The files or folders that must exist under `root` to load `split` of `spec` from disk."""
    if spec.name == "mnist":
        return [root / "MNIST" / "raw" / name for name in _MNIST_FILES[split]]
    if spec.name == "cifar10":
        return [root / datasets.CIFAR10.base_folder / name for name in _CIFAR10_FILES[split]]
    if spec.name == "imagenet":
        return [root / _IMAGENET_FOLDERS[split]]
    raise ValueError(
        f"dataset {spec.name!r} has no real on-disk version; allowed for "
        f"source='real': {', '.join(_LOADERS)}; use source='synthetic'"
    )


def build_real(spec: DatasetSpec, root: str | Path, split: str = "train") -> Dataset:
    """Split `split` ("train" or "eval") of `spec` read from `root`; ValueError naming what is
    missing."""
    root = Path(root)
    missing = [str(path) for path in required_paths(spec, root, split) if not path.exists()]
    if missing:
        raise ValueError(
            f"real dataset {spec.name!r} ({split} split) not found under "
            f"root={str(root)!r}; missing: {', '.join(missing)}"
        )
    dataset = _LOADERS[spec.name](root, split == "train")
    _check_class_count(spec, dataset)
    logger.info(
        "loaded real %s (%s split) from %s: %d samples",
        spec.name,
        split,
        root,
        dataset_length(dataset),
    )
    return dataset


def _check_class_count(spec: DatasetSpec, dataset: Dataset) -> None:
    """Reject more classes than the network's output layer has: the loss would fail mid-run."""
    classes = getattr(dataset, "classes", [])
    if len(classes) > spec.num_classes:
        raise ValueError(
            f"real dataset {spec.name!r} has {len(classes)} classes on disk, but the "
            f"spec allows at most {spec.num_classes}"
        )


def _mnist(root: Path, train: bool) -> Dataset:
    return SplitMNIST(root, train=train, download=False, transform=transforms.ToTensor())


def _cifar10(root: Path, train: bool) -> Dataset:
    return UncheckedCIFAR10(root, train=train, download=False, transform=transforms.ToTensor())


def _imagenet(root: Path, train: bool) -> Dataset:
    folder = root / _IMAGENET_FOLDERS[_split(train)]
    try:
        if train:
            return datasets.ImageFolder(folder, transform=imagenet_train_transform())
        return ValImageFolder(
            folder,
            train_folder=root / _IMAGENET_FOLDERS["train"],
            transform=imagenet_eval_transform(),
        )
    except FileNotFoundError as error:  # no class folders, or no images in them
        raise ValueError(f"real dataset 'imagenet' under {folder}: {error}") from None


class ValImageFolder(datasets.ImageFolder):
    """ImageNet's val folder labelled with the training folder's class indices.

    ImageFolder numbers the classes it finds in sorted order, so a val folder holding only some
    of the classes (a sample of val) would number them differently from training and every
    label would be wrong. The classes are therefore those of the training folder when it
    exists (listing its folder names costs nothing), and a val class that training lacks is an
    error; training classes absent from val are allowed, but not a val without images.
    """

    def __init__(self, root: Path, *, train_folder: Path, **kwargs: Any) -> None:
        self.train_folder = train_folder
        super().__init__(root, allow_empty=True, **kwargs)
        if not self.samples:
            raise FileNotFoundError(f"Found no image in the class folders of {root}.")

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        classes, class_to_idx = super().find_classes(directory)
        if not self.train_folder.is_dir():
            return classes, class_to_idx
        train_classes, train_to_idx = super().find_classes(self.train_folder)
        unknown = sorted(set(classes) - set(train_classes))
        if unknown:
            raise ValueError(
                f"real dataset 'imagenet': val classes {', '.join(unknown[:5])} "
                f"have no folder in {self.train_folder}"
            )
        return train_classes, train_to_idx


_LOADERS: dict[str, Callable[[Path, bool], Dataset]] = {
    "mnist": _mnist,
    "cifar10": _cifar10,
    "imagenet": _imagenet,
}
