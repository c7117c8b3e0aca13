"""`network.source=builtin` (`network=resnet18` .. `mobilenetv2`): the six CNNs of the thesis,
by name, in the variant the dataset takes (small images, or ImageNet's)."""

from __future__ import annotations

from workloads.datasets.spec import DatasetSpec
from workloads.networks.ref import BUILTIN, NetworkError, NetworkRef
from workloads.networks.source import NetworkSourceSpec, function_in

# The networks, by `network.name` (conf/network/<name>.yaml each).
NAMES = ("resnet18", "resnet50", "resnet152", "vgg11", "vgg16", "mobilenetv2")


def image_data_only(ref: NetworkRef, dataset: DatasetSpec) -> None:
    """A built-in network takes images, whatever their shape (its variant follows them); token
    data is refused by name without building it, so the check loads no torch."""
    if dataset.tokens:
        raise NetworkError(
            f"network={ref.name!r} is invalid: an image network; dataset={dataset.name} holds "
            f"tokens: choose a language model (network=llama_tiny, gpt2_small, ..., or "
            f"network=hf) or an image dataset"
        )


SPEC = NetworkSourceSpec(
    name=BUILTIN,
    title="built-in",
    build=function_in("workloads.networks.layers", "build_builtin"),
    names=NAMES,
    layers=function_in("workloads.networks.layers", "builtin_layers"),
    input_check=image_data_only,
    libraries=("torch", "torchvision"),
    order=0,
)
