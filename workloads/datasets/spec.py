"""The four benchmark datasets (SPEC Table 3.2) as immutable facts.

Everything that needs to know a dataset's shape (the networks, the synthetic generator, the
batch-size table, `harness.describe`) reads it from here, so the table exists once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetSpec:
    """Shape and size of one dataset.

    Attributes:
        name: config name (`dataset=<name>`).
        num_classes: number of label classes.
        num_images: images in the full dataset (Table 3.2); one epoch uses this many by default.
        num_eval_images: images in the held-out evaluation split: the real test splits (MNIST
            and CIFAR-10 test, 10,000 each; ImageNet val, 50,000); for Highres, which exists
            only as synthetic data, 10,000 (the size of the other small test splits, and 1/6 of
            its images as for CIFAR-10).
        channels: 1 for grayscale, 3 for RGB.
        resolution: height == width in pixels.
        synthetic_only: True when no real on-disk version exists (Highres).
    """

    name: str
    num_classes: int
    num_images: int
    num_eval_images: int
    channels: int
    resolution: int
    synthetic_only: bool = False

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Shape of one image, (C, H, W)."""
        return (self.channels, self.resolution, self.resolution)

    @property
    def small_images(self) -> bool:
        """True for MNIST/CIFAR-size inputs, which use the small-image network variants."""
        return self.resolution <= 32

    @property
    def bytes_per_image(self) -> int:
        """Bytes of one image stored as uint8."""
        return self.channels * self.resolution * self.resolution


DATASET_SPECS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec("mnist", num_classes=10, num_images=70_000, num_eval_images=10_000,
                    channels=1, resolution=28),
        DatasetSpec("cifar10", num_classes=10, num_images=60_000, num_eval_images=10_000,
                    channels=3, resolution=32),
        DatasetSpec("imagenet", num_classes=1000, num_images=1_280_000, num_eval_images=50_000,
                    channels=3, resolution=224),
        DatasetSpec("highres", num_classes=1000, num_images=60_000, num_eval_images=10_000,
                    channels=3, resolution=512, synthetic_only=True),
    )
}


def dataset_spec(name: str) -> DatasetSpec:
    """Return the spec of dataset `name`, or raise KeyError naming the allowed names."""
    try:
        return DATASET_SPECS[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; allowed: {', '.join(DATASET_SPECS)}") from None
