"""`network.source=module` (`network=module network.target=mypkg.models:build`): a user's own
factory or `nn.Module` class, with `network.kwargs` (`workloads.networks.zoo`)."""

from __future__ import annotations

from workloads.networks.source import NetworkSourceSpec, function_in

SPEC = NetworkSourceSpec(
    name="module",
    build=function_in("workloads.networks.zoo", "build_module"),
    requires="target",
    settings=("target", "kwargs", "blocks"),
    # the module's own `tensor_parallel_plan(degree, sequence_parallel)` method, if it has one
    tensor_parallel_plan=function_in("workloads.networks.tensor_parallel", "module_plan"),
    order=1,  # its code may change between two commands: no library version covers it
)
