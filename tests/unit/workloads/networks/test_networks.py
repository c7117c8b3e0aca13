"""The six networks: reference parameter counts, output shapes, faithful layer lists."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workloads.datasets import dataset_spec
from workloads.networks import NETWORK_NAMES, build_network, to_layer_list

# Published counts, not computed by this code: torchvision's 1000-class models, and the
# pytorch-cifar (kuangliu) CIFAR-10 models. MobileNetV2-CIFAR uses torchvision's blocks; moving
# the first conv to stride 1 changes no weights, so it has torchvision's 10-class count.
REFERENCE_PARAMETERS = {
    "imagenet": {
        "resnet18": 11_689_512,
        "resnet50": 25_557_032,
        "resnet152": 60_192_808,
        "vgg11": 132_863_336,
        "vgg16": 138_357_544,
        "mobilenetv2": 3_504_872,
    },
    "cifar10": {
        "resnet18": 11_173_962,
        "resnet50": 23_520_842,
        "resnet152": 58_156_618,
        "vgg11": 9_231_114,
        "vgg16": 14_728_266,
        "mobilenetv2": 2_236_682,
    },
}
# MNIST's first conv sees 1 channel instead of 3: 3x3 kernels x 2 channels x its width fewer.
FIRST_CONV_WIDTH = {
    "resnet18": 64,
    "resnet50": 64,
    "resnet152": 64,
    "vgg11": 64,
    "vgg16": 64,
    "mobilenetv2": 32,
}


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _meta_network(name: str, dataset: str) -> nn.Module:
    with torch.device("meta"):
        return build_network(name, dataset_spec(dataset))


@pytest.mark.parametrize("dataset", ["imagenet", "cifar10"])
@pytest.mark.parametrize("name", NETWORK_NAMES)
def test_parameter_counts_match_the_reference(name: str, dataset: str) -> None:
    assert _count(_meta_network(name, dataset)) == REFERENCE_PARAMETERS[dataset][name]


@pytest.mark.parametrize("name", NETWORK_NAMES)
def test_mnist_variant_differs_only_in_the_input_channels(name: str) -> None:
    expected = REFERENCE_PARAMETERS["cifar10"][name] - 3 * 3 * 2 * FIRST_CONV_WIDTH[name]
    assert _count(_meta_network(name, "mnist")) == expected


@pytest.mark.parametrize("dataset", ["imagenet", "highres"])
@pytest.mark.parametrize("name", NETWORK_NAMES)
def test_large_image_output_shapes(name: str, dataset: str) -> None:
    spec = dataset_spec(dataset)
    model = _meta_network(name, dataset)
    out = model(torch.empty((2, *spec.input_shape), device="meta"))
    assert tuple(out.shape) == (2, 1000)


@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
@pytest.mark.parametrize("name", NETWORK_NAMES)
def test_layer_list_computes_what_the_model_computes(name: str, dataset: str) -> None:
    spec = dataset_spec(dataset)
    torch.manual_seed(0)
    model = build_network(name, spec).eval()
    layers = to_layer_list(name, model)
    x = torch.randn(2, *spec.input_shape)
    with torch.no_grad():
        expected = model(x)
        assert expected.shape == (2, spec.num_classes)
        assert torch.equal(nn.Sequential(*layers)(x), expected)


@pytest.mark.parametrize("dataset", ["imagenet", "cifar10"])
@pytest.mark.parametrize("name", NETWORK_NAMES)
def test_layer_list_owns_every_parameter_once(name: str, dataset: str) -> None:
    model = _meta_network(name, dataset)
    layer_params = [id(p) for layer in to_layer_list(name, model) for p in layer.parameters()]
    assert len(layer_params) == len(set(layer_params))
    assert set(layer_params) == {id(p) for p in model.parameters()}


@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2"])
def test_imagenet_layer_list_numerically(name: str) -> None:
    torch.manual_seed(0)
    model = build_network(name, dataset_spec("imagenet")).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.equal(nn.Sequential(*to_layer_list(name, model))(x), model(x))


def test_unknown_network_names_the_allowed_ones() -> None:
    with pytest.raises(KeyError, match="resnet18, resnet50"):
        build_network("resnet19", dataset_spec("cifar10"))
