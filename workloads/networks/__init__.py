"""The benchmark networks, as whole models and as ordered layer lists.

A network is named by a `NetworkRef` (or, for the six built-in CNNs of the thesis, by its name): a
built-in (`resnet18/50/152`, `vgg11/16`, `mobilenetv2`, whose variant follows the dataset:
docs/thesis.md, Table 3.2 and Appendix A), a user's own module, a torchvision or timm model by name,
or a Hugging Face `transformers` model built from its config class (`workloads.networks.zoo`,
`workloads.networks.lm`). Where a network comes from is its source, one spec each
(`workloads.networks.source`, found by `workloads.networks.registry`: distbench's own in
`workloads.networks.sources`, others registered by their packages), which builds it and lists
its layers. The layer list of a model shares its modules (no copies), and
`nn.Sequential(*layers)` computes what the model computes; the pipeline models partition that
list across workers and FSDP shards each entry. A network that has no layer list (it is not an
`nn.Sequential`, defines no `pipeline_layers()`, and could not be split by tracing) raises
`NetworkError` where a layer list is asked for.

The names below load their module (and torch) when first used (`workloads.lazy`): a network's
reference, `workloads.networks.ref`, is read without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workloads.lazy import lazy_exports

_EXPORTS = {
    "NetworkError": "ref",
    "NetworkRef": "ref",
    "as_ref": "ref",
    "NetworkSourceSpec": "source",
    "function_in": "source",
    "source_named": "registry",
    "NETWORK_NAMES": "layers",
    "build_layer_list": "layers",
    "build_network": "layers",
    "has_layer_list": "layers",
    "layer_count": "layers",
    "to_layer_list": "layers",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "NETWORK_NAMES",
    "NetworkError",
    "NetworkRef",
    "NetworkSourceSpec",
    "as_ref",
    "build_layer_list",
    "build_network",
    "function_in",
    "has_layer_list",
    "layer_count",
    "source_named",
    "to_layer_list",
]

if TYPE_CHECKING:  # what the names are, for type checkers and readers
    from workloads.networks.layers import (
        NETWORK_NAMES,
        build_layer_list,
        build_network,
        has_layer_list,
        layer_count,
        to_layer_list,
    )
    from workloads.networks.ref import NetworkError, NetworkRef, as_ref
    from workloads.networks.registry import source_named
    from workloads.networks.source import NetworkSourceSpec, function_in
