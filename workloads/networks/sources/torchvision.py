"""`network.source=torchvision` (`network=torchvision network.arch=efficientnet_b0`): a
classification model of `torchvision.models` by name, random weights, sized for the dataset
(`workloads.networks.zoo`)."""

from __future__ import annotations

from workloads.networks.source import NetworkSourceSpec, function_in

SPEC = NetworkSourceSpec(
    name="torchvision",
    build=function_in("workloads.networks.zoo", "build_torchvision"),
    requires="arch",
    settings=("arch", "kwargs", "blocks"),
    libraries=("torch", "torchvision"),
    order=2,
)
