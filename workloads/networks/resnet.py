"""ResNet-18/50/152: torchvision's for ImageNet-size inputs, a small-image stem for MNIST/CIFAR."""

from __future__ import annotations

from torch import nn
from torchvision import models

from workloads.datasets.spec import DatasetSpec

_TORCHVISION = {
    "resnet18": models.resnet18,
    "resnet50": models.resnet50,
    "resnet152": models.resnet152,
}


def build_resnet(name: str, dataset: DatasetSpec) -> models.ResNet:
    """torchvision's ResNet; for small images a 3x3/64 stride-1 stem and no max-pool.

    The small-image variant is the common pytorch-cifar ResNet: the four stages then output
    32/16/8/4 (CIFAR-10) or 28/14/7/4 (MNIST) pixels, where the ImageNet stem would shrink a
    32-pixel image to 8 before the first stage.
    """
    model = _TORCHVISION[name](weights=None, num_classes=dataset.num_classes)
    if dataset.small_images or dataset.channels != 3:
        model.conv1 = nn.Conv2d(
            dataset.channels, 64, kernel_size=3, stride=1, padding=1, bias=False
        )
        model.maxpool = nn.Identity()
    return model


def resnet_layers(model: models.ResNet) -> list[nn.Module]:
    """Stem, each residual block, pooling, flatten, classifier (torchvision's forward order)."""
    blocks = [
        block
        for stage in (model.layer1, model.layer2, model.layer3, model.layer4)
        for block in stage
    ]
    return [
        model.conv1,
        model.bn1,
        model.relu,
        model.maxpool,
        *blocks,
        model.avgpool,
        nn.Flatten(1),
        model.fc,
    ]
