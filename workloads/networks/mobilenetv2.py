"""MobileNetV2: torchvision's, with the small-image strides of the thesis' Appendix A
(docs/thesis.md) for MNIST/CIFAR-10."""

from __future__ import annotations

from torch import nn
from torchvision import models
from torchvision.ops.misc import Conv2dNormActivation

from workloads.datasets.spec import DatasetSpec

# (t, c, n, s) rows: expansion, output channels, repeats, stride of the first repeat. For small
# images the second row keeps stride 1 (the first conv does too), so a 32-pixel input reaches
# the final 1x1 conv at 4x4; the ImageNet strides are 1, 2, 2, 2, 1, 2, 1.
_SMALL_IMAGE_ROWS = [
    [1, 16, 1, 1],
    [6, 24, 2, 1],
    [6, 32, 3, 2],
    [6, 64, 4, 2],
    [6, 96, 3, 1],
    [6, 160, 3, 2],
    [6, 320, 1, 1],
]
_FIRST_CONV_CHANNELS = 32


def build_mobilenetv2(name: str, dataset: DatasetSpec) -> models.MobileNetV2:
    del name  # one MobileNetV2
    if not dataset.small_images:
        model = models.mobilenet_v2(weights=None, num_classes=dataset.num_classes)
        stem_stride = 2
    else:
        model = models.MobileNetV2(
            num_classes=dataset.num_classes, inverted_residual_setting=_SMALL_IMAGE_ROWS
        )
        stem_stride = 1
    if dataset.small_images or dataset.channels != 3:
        model.features[0] = Conv2dNormActivation(
            dataset.channels,
            _FIRST_CONV_CHANNELS,
            stride=stem_stride,
            norm_layer=nn.BatchNorm2d,
            activation_layer=nn.ReLU6,
        )
    return model


def mobilenetv2_layers(model: models.MobileNetV2) -> list[nn.Module]:
    """Each feature block, global average pooling, flatten, then the classifier's layers.

    torchvision's forward pools with a functional call; the module form computes the same.
    """
    return [*model.features, nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(1), *model.classifier]
