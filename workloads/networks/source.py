"""What a network source is, in one place (in the spirit of torchtitan's `TrainSpec`).

A network source is where a cell's network comes from: the six built-in CNNs by name, a
user's own module, a model zoo by name, a `transformers` config class. Each is one module of
`workloads.networks.sources` (or of a package of the user's that registers it:
`workloads.plugins`, group `distbench.network_sources`) that ends with `SPEC =
NetworkSourceSpec(...)`; the registry (`workloads.networks.registry`) finds every such module,
so adding a source touches no other file. The config's checks, building a network and its
layer list ask the spec, never the source's name.

A spec names its builder and its layer list without importing them (`function_in`): checking
a config reads the spec and never loads torch; a network is built where it is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workloads.datasets.spec import DatasetSpec
from workloads.networks.ref import NetworkRef

if TYPE_CHECKING:  # what the hooks take and return; a spec's module never imports torch
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle

# The keys of `network.*` that belong to one source or another (the rest, `name` and
# `source`, every network has). A source takes some of them (`NetworkSourceSpec.settings`);
# another source's key set in a cell is refused by name.
SOURCE_SETTINGS = ("target", "arch", "config", "kwargs", "blocks")

# (the network as the config names it, the dataset's shape) -> the network, sized for the
# dataset; NetworkError (one line naming the `network.<key>` at fault) where it cannot be built
NetworkBuilder = Callable[[NetworkRef, DatasetSpec], "nn.Module"]
# (the network's reference, the network as built) -> its ordered layers, sharing its modules;
# NetworkError where it has none
LayerLister = Callable[[NetworkRef, "nn.Module"], "list[nn.Module]"]
# (the network's reference, the dataset's shape) -> None if a network of the source takes the
# dataset, NetworkError (one line) if not; answered without building the network
InputCheck = Callable[[NetworkRef, DatasetSpec], None]
# (the network's reference, the network as built, the tensor-parallel degree, whether the
# sequence is split too) -> the plan `torch.distributed.tensor.parallel.parallelize_module`
# takes: each submodule's fully qualified name -> its ParallelStyle. It may first rewrite the
# network in place into a form that computes the same and that the styles split (GPT-2's
# Conv1D as nn.Linear); NetworkError (one line) for a degree the network cannot be split by.
TensorParallelPlan = Callable[[NetworkRef, "nn.Module", int, bool], "Mapping[str, ParallelStyle]"]


def function_in(module: str, function: str) -> Callable[..., Any]:
    """The function `module.function`, imported when first called: a source's spec names its
    builder and its layer list this way, so that the spec (and every config check that reads
    it) loads neither torch nor the libraries a source builds from."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), function)(*args, **kwargs)

    call.__qualname__ = call.__name__ = function
    return call


# A network's own layer list: its `pipeline_layers()`, else an `nn.Sequential`'s children.
DECLARED_LAYERS: LayerLister = function_in("workloads.networks.layers", "declared_layers")


@dataclass(frozen=True)
class NetworkSourceSpec:
    """One network source: what it needs from the config, how it builds a network for a
    dataset, how it lists the network's layers, and how the network shards.

    Attributes:
        name: `network.source=<name>`, what the config files set (`conf/network/<name>.yaml`
            holds the source's own settings and is the option `network=<name>` where the
            source needs no preset).
        build: builds a network of the source for a dataset's shape (its classes and
            channels, or its vocabulary and sequence length); named with `function_in`, so
            that torch loads only when a network is built. It raises NetworkError, one line
            naming the `network.<key>` at fault, for a network it cannot build. It is also
            called on PyTorch's meta device (the config check, the layer count), where it
            allocates nothing.
        title: how messages name the source's networks ("built-in": "allowed built-in
            networks: ..."); its name where empty.
        requires: the key of `network.*` a cell of this source must set (`target` for a
            user's module, `arch` for a zoo or `transformers` model), or None; checked when
            the config is validated: "network.<key>=None is invalid: network.source=<name>
            needs network.<key>".
        settings: the keys of `network.*` (`SOURCE_SETTINGS`) the source reads; a key of
            another source set in a cell of this one is refused by name at validation.
        names: the closed list of networks the source has, by `network.name` (the built-in
            CNNs), or None for a source whose networks are named by `target` or `arch`; a name
            outside the list is refused at validation, naming the list and the other sources.
        layers: the network's ordered layer list, sharing its modules, which the pipeline
            models partition across workers and FSDP2 wraps one unit each; the default takes a
            network's `pipeline_layers()`, else an `nn.Sequential`'s children, else raises
            NetworkError saying how to give one (`workloads.networks.layers.declared_layers`).
        input_check: whether a network of the source takes a dataset, answered without
            building it (the built-in CNNs take images only), or None: validation then builds
            the network and runs a forward of two samples on PyTorch's meta device
            (`workloads.networks.check`), which loads torch.
        libraries: the installed distributions whose versions decide the networks the source
            builds, so that a network's layer count is kept on disk per version
            (`workloads.networks.layer_counts`; distbench's own code is covered by a digest of
            `workloads/networks/`, a registered source's is not: it names its own package's
            distribution here); None where no version covers the code (a user's own module):
            counted afresh each time.
        tensor_parallel_plan: how a network of the source shards for tensor parallelism
            (`distribution=mesh distribution.tp=2`): given the reference, the built network,
            the degree and whether the sequence is split too, the plan
            `torch.distributed.tensor.parallel.parallelize_module` applies (each submodule's
            name -> `ColwiseParallel()`, `RowwiseParallel()`, ...), raising NetworkError for a
            degree that does not divide the network's heads or widths
            (`workloads.networks.tensor_parallel`: the `transformers` presets' Megatron-style
            plan; a user's module's own `tensor_parallel_plan` method). None: the source's
            networks are refused for tensor parallelism at validation.
        order: where the source is listed among the others in messages (lowest first, then
            by name): the built-in sources 0-4 in the order docs/networks.md gives them; a
            registered source after them by default.
    """

    name: str
    build: NetworkBuilder
    title: str = ""
    requires: str | None = None
    settings: tuple[str, ...] = ()
    names: tuple[str, ...] | None = None
    layers: LayerLister = DECLARED_LAYERS
    input_check: InputCheck | None = None
    libraries: tuple[str, ...] | None = None
    tensor_parallel_plan: TensorParallelPlan | None = None
    order: int = 100

    def __post_init__(self) -> None:
        if not self.title:
            object.__setattr__(self, "title", self.name)
        unknown = [key for key in self.settings if key not in SOURCE_SETTINGS]
        if unknown:
            raise TypeError(
                f"network source {self.name!r}: settings {unknown} are no keys of network.*; "
                f"allowed: {', '.join(SOURCE_SETTINGS)}"
            )
        if self.requires is not None and self.requires not in self.settings:
            raise TypeError(
                f"network source {self.name!r} requires network.{self.requires}, which is "
                f"not among its settings {list(self.settings)}"
            )
