"""The six benchmark networks, as whole models and as ordered layer lists.

Which variant is built follows the dataset: torchvision's architectures for ImageNet and
Highres, small-image variants for MNIST and CIFAR-10 (SPEC "The grid"). The layer list of a
model shares its modules (no copies), and `nn.Sequential(*layers)` computes what the model
computes; the pipeline models partition that list across workers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from workloads.datasets.spec import DatasetSpec
from workloads.networks.mobilenetv2 import build_mobilenetv2, mobilenetv2_layers
from workloads.networks.resnet import build_resnet, resnet_layers
from workloads.networks.vgg import build_vgg, vgg_layers


class _Family(NamedTuple):
    build: Callable[[str, DatasetSpec], nn.Module]
    layers: Callable[..., list[nn.Module]]


_RESNET = _Family(build_resnet, resnet_layers)
_VGG = _Family(build_vgg, vgg_layers)
_MOBILENET = _Family(build_mobilenetv2, mobilenetv2_layers)

_FAMILIES: dict[str, _Family] = {
    "resnet18": _RESNET, "resnet50": _RESNET, "resnet152": _RESNET,
    "vgg11": _VGG, "vgg16": _VGG,
    "mobilenetv2": _MOBILENET,
}
NETWORK_NAMES: tuple[str, ...] = tuple(_FAMILIES)


def _family(name: str) -> _Family:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown network {name!r}; allowed: {', '.join(NETWORK_NAMES)}") from None


def build_network(name: str, dataset: DatasetSpec) -> nn.Module:
    """Network `name` in the variant that fits `dataset` (channels, resolution, classes)."""
    return _family(name).build(name, dataset)


def to_layer_list(name: str, model: nn.Module) -> list[nn.Module]:
    """The ordered layers of `model` (built by `build_network(name, ...)`), sharing its modules."""
    return _family(name).layers(model)


def build_layer_list(name: str, dataset: DatasetSpec) -> list[nn.Module]:
    return to_layer_list(name, build_network(name, dataset))


@functools.cache
def layer_count(name: str, dataset: DatasetSpec) -> int:
    """Length of the layer list of network `name` for `dataset` (what pipelines partition);
    built on the meta device, so it costs no memory and a few milliseconds."""
    with torch.device("meta"):
        return len(build_layer_list(name, dataset))


__all__ = ["NETWORK_NAMES", "build_layer_list", "build_network", "layer_count", "to_layer_list"]
