"""VGG-11/16: torchvision's for ImageNet-size inputs, the pytorch-cifar VGG for small images."""

from __future__ import annotations

from torch import nn
from torchvision import models

from workloads.datasets.spec import DatasetSpec

_TORCHVISION = {"vgg11": models.vgg11, "vgg16": models.vgg16}

# Conv widths per stage, "M" = 2x2 max-pool (the VGG paper's configurations A and D).
_CONFIGS: dict[str, list[int | str]] = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [
        64,
        64,
        "M",
        128,
        128,
        "M",
        256,
        256,
        256,
        "M",
        512,
        512,
        512,
        "M",
        512,
        512,
        512,
        "M",
    ],
}


class SmallImageVGG(nn.Module):
    """Conv-BN-ReLU stages with 2x2 max-pools down to 1x1, then one linear classifier.

    MNIST's 28 pixels do not halve evenly five times; ceil-mode pools (28-14-7-4-2-1) still end
    at 1x1, where floor-mode pools would reach 0 after the fourth.
    """

    def __init__(self, name: str, dataset: DatasetSpec) -> None:
        super().__init__()
        ceil_mode = dataset.resolution % 32 != 0
        layers: list[nn.Module] = []
        channels = dataset.channels
        for width in _CONFIGS[name]:
            if width == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=ceil_mode))
                continue
            assert isinstance(width, int)
            layers += [
                nn.Conv2d(channels, width, kernel_size=3, padding=1),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
            ]
            channels = width
        self.features = nn.Sequential(*layers)
        self.flatten = nn.Flatten(1)
        self.classifier = nn.Linear(channels, dataset.num_classes)

    def forward(self, x):  # noqa: ANN001, ANN201 - nn.Module signature
        return self.classifier(self.flatten(self.features(x)))


def build_vgg(name: str, dataset: DatasetSpec) -> nn.Module:
    if dataset.small_images:
        return SmallImageVGG(name, dataset)
    return _TORCHVISION[name](weights=None, num_classes=dataset.num_classes)


def vgg_layers(model: nn.Module) -> list[nn.Module]:
    """Every feature layer, then pooling, flatten and every classifier layer."""
    if isinstance(model, SmallImageVGG):
        return [*model.features, model.flatten, model.classifier]
    assert isinstance(model, models.VGG)
    return [*model.features, model.avgpool, nn.Flatten(1), *model.classifier]
