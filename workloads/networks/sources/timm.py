"""`network.source=timm` (`network=timm network.arch=resnet10t`): a `timm` model by name,
`pretrained=False`, sized for the dataset (`workloads.networks.zoo`)."""

from __future__ import annotations

from workloads.networks.source import NetworkSourceSpec, function_in

SPEC = NetworkSourceSpec(
    name="timm",
    build=function_in("workloads.networks.zoo", "build_timm"),
    requires="arch",
    settings=("arch", "kwargs", "blocks"),
    libraries=("torch", "timm"),
    order=3,
)
