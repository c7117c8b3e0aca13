"""Building a network by its reference, and its ordered layer list (see the package's docstring),
through the network's source (`workloads.networks.registry`); the built-in CNNs' builders."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from workloads.datasets.spec import DatasetSpec
from workloads.networks.mobilenetv2 import build_mobilenetv2, mobilenetv2_layers
from workloads.networks.ref import NetworkError, NetworkRef, as_ref
from workloads.networks.registry import source_of
from workloads.networks.resnet import build_resnet, resnet_layers
from workloads.networks.vgg import build_vgg, vgg_layers


class _Family(NamedTuple):
    build: Callable[[str, DatasetSpec], nn.Module]
    layers: Callable[..., list[nn.Module]]


_RESNET = _Family(build_resnet, resnet_layers)
_VGG = _Family(build_vgg, vgg_layers)
_MOBILENET = _Family(build_mobilenetv2, mobilenetv2_layers)

_FAMILIES: dict[str, _Family] = {
    "resnet18": _RESNET,
    "resnet50": _RESNET,
    "resnet152": _RESNET,
    "vgg11": _VGG,
    "vgg16": _VGG,
    "mobilenetv2": _MOBILENET,
}
NETWORK_NAMES: tuple[str, ...] = tuple(_FAMILIES)


def _family(name: str) -> _Family:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown network {name!r}; allowed: {', '.join(NETWORK_NAMES)}") from None


def build_builtin(ref: NetworkRef, dataset: DatasetSpec) -> nn.Module:
    """A built-in network (`network.source=builtin`) in the variant that fits `dataset`; token
    data is refused by name."""
    if dataset.tokens:
        raise NetworkError(
            f"network={ref.name} is an image network and dataset="
            f"{dataset.name} holds tokens; choose a language model "
            f"(network=llama_tiny, network=gpt2_small, network=hf ...) or "
            f"an image dataset"
        )
    return _family(ref.name).build(ref.name, dataset)


def builtin_layers(ref: NetworkRef, model: nn.Module) -> list[nn.Module]:
    """A built-in network's layer list, as its family splits it."""
    return _family(ref.name).layers(model)


def declared_layers(ref: NetworkRef, model: nn.Module) -> list[nn.Module]:
    """The layer list a network declares: its `pipeline_layers()`, else an `nn.Sequential`'s
    children (a network split by tracing is a `LayerSequence`, one). NetworkError says how to
    give one where it has none."""
    pipeline_layers = getattr(model, "pipeline_layers", None)
    if callable(pipeline_layers):
        return list(pipeline_layers())
    if isinstance(model, nn.Sequential):
        return list(model.children())
    raise NetworkError(
        f"network {ref.name} ({type(model).__name__}) has no layer list, which the pipeline "
        f"models and per-layer sharding need: return a torch.nn.{nn.Sequential.__name__}, "
        f"define pipeline_layers() returning its layers in order, or set network.blocks=<path "
        f"of its repeated block container>"
    )


def build_network(network: str | NetworkRef, dataset: DatasetSpec) -> nn.Module:
    """The network in the variant that fits `dataset` (channels, resolution, classes; for
    token data the vocabulary and sequence length), as its source builds it
    (`NetworkSourceSpec.build`)."""
    ref = as_ref(network)
    return source_of(ref).build(ref, dataset)


def to_layer_list(network: str | NetworkRef, model: nn.Module) -> list[nn.Module]:
    """The ordered layers of `model` (built by `build_network(network, ...)`), sharing its
    modules, as its source lists them (`NetworkSourceSpec.layers`). Raises NetworkError when
    the model has none."""
    ref = as_ref(network)
    return source_of(ref).layers(ref, model)


def has_layer_list(network: str | NetworkRef, dataset: DatasetSpec) -> bool:
    """Whether the network can be split into a layer list (built on the meta device)."""
    try:
        layer_count(as_ref(network), dataset)
    except NetworkError:
        return False
    return True


def build_layer_list(network: str | NetworkRef, dataset: DatasetSpec) -> list[nn.Module]:
    return to_layer_list(network, build_network(network, dataset))


@functools.cache
def _layer_count(ref: NetworkRef, dataset: DatasetSpec) -> int:
    """Counted on the model that checking the config built (`workloads.networks.meta`): its
    factory is not called again, and what its libraries say is kept aside there too."""
    from workloads.networks.meta import library_chatter_kept_aside, meta_network

    model = meta_network(ref, dataset)
    with torch.device("meta"), library_chatter_kept_aside():
        return len(to_layer_list(ref, model))


def layer_count(network: str | NetworkRef, dataset: DatasetSpec) -> int:
    """Length of the layer list of `network` for `dataset` (what pipelines partition);
    built on the meta device, so it costs no memory and a few milliseconds."""
    return _layer_count(as_ref(network), dataset)
