"""A network's static facts: parameter and gradient sizes (data-parallel communication), the
layer list and each layer's output size (pipeline partitioning, activation transfers). Shapes
are traced on PyTorch's "meta" device, so describing even ResNet-152 on 512x512 images costs no
compute and no memory (`python -m harness.describe` prints them)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from harness.config.units import BYTES_PER_MB

if TYPE_CHECKING:
    from torch import nn

    from workloads.datasets import DatasetSpec
    from workloads.networks import NetworkRef

FLOAT32_BYTES = 4


def describe(network: str | NetworkRef, spec: DatasetSpec) -> dict[str, Any]:
    """Parameter counts, gradient size and per-layer output sizes (per sample, float32)."""
    # Here, not at the top: the command's --help and bad input need no torch.
    import torch

    from workloads.networks import build_network, to_layer_list

    with torch.device("meta"):
        model = build_network(network, spec)
        layers = to_layer_list(network, model)
        activation = torch.zeros((1, *spec.input_shape), dtype=spec.input_dtype)
    names = {id(module): name for name, module in model.named_modules()}
    parameters = sum(p.numel() for p in model.parameters())
    layer_facts = []
    for index, layer in enumerate(layers):
        activation = layer(activation)
        layer_facts.append(_layer_fact(index, layer, names, tuple(activation.shape[1:])))
    return {
        "dataset": spec.name,
        "network": str(network),
        "variant": "tokens" if spec.tokens else "small-image" if spec.small_images else "imagenet",
        "input_shape": list(spec.input_shape),
        "num_classes": spec.output_classes,
        "parameters": parameters,
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "weights_mb": parameters * FLOAT32_BYTES / BYTES_PER_MB,
        "gradient_mb": sum(p.numel() for p in model.parameters() if p.requires_grad)
        * FLOAT32_BYTES
        / BYTES_PER_MB,
        # Gradient tensors: Horovod allreduces them as they become ready, so their count
        # bounds how many allreduces (each with its latency) a step needs.
        "gradient_tensors": sum(1 for p in model.parameters() if p.requires_grad),
        "num_layers": len(layers),
        "activation_mb_per_sample": sum(layer["activation_mb"] for layer in layer_facts),
        "layers": layer_facts,
    }


def _layer_fact(
    index: int, layer: nn.Module, names: dict[int, str], output_shape: tuple[int, ...]
) -> dict[str, Any]:
    return {
        "index": index,
        "name": names.get(id(layer), type(layer).__name__.lower()),
        "type": type(layer).__name__,
        "parameters": sum(p.numel() for p in layer.parameters()),
        "output_shape": list(output_shape),
        "activation_mb": math.prod(output_shape) * FLOAT32_BYTES / BYTES_PER_MB,
    }
