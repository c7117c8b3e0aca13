"""Network sources are a registry (`workloads.networks.registry`): one spec each
(`workloads.networks.source.NetworkSourceSpec`), distbench's own found in
`workloads.networks.sources`, another package's by its entry point; validation, building and
the layer list ask the spec, never the source's name."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from importlib.metadata import EntryPoint

import pytest
import torch
from torch import nn

from harness.cli.bad_input import bad_input_message
from harness.commands.compose import compose_config
from harness.config.schema import ConfigError, validate
from harness.records.compliance import benchmark_names
from tests.helpers import REPO_ROOT
from workloads.datasets.spec import DATASET_SPECS, DatasetSpec
from workloads.networks import NETWORK_NAMES, build_network, layer_count, to_layer_list
from workloads.networks import registry as network_registry
from workloads.networks.ref import NetworkError, NetworkRef
from workloads.networks.source import SOURCE_SETTINGS, NetworkSourceSpec, function_in
from workloads.networks.sources import builtin

MNIST = DATASET_SPECS["mnist"]


def test_the_sources_are_distbenchs_five_in_the_order_the_docs_give() -> None:
    sources = network_registry.sources()
    assert list(sources) == ["builtin", "module", "torchvision", "timm", "hf"]
    # a tensor-parallel plan: the transformers presets', a user's module's own method
    with_plan = {name for name, spec in sources.items() if spec.tensor_parallel_plan is not None}
    assert with_plan == {"hf", "module"}
    assert all(set(spec.settings) <= set(SOURCE_SETTINGS) for spec in sources.values())
    # the built-in source's closed list is the networks the code builds and MLPerf names
    assert sources["builtin"].names == builtin.NAMES == NETWORK_NAMES
    assert {f"{name}_mnist" for name in builtin.NAMES} <= set(benchmark_names())


def test_no_code_dispatches_on_a_sources_name() -> None:
    """No comparison of a `source` with a network source's name anywhere in the code: what
    differs between sources is their specs' (`ref.source == "hf"` was how it was done)."""
    names = set(network_registry.sources())
    found = []
    for root in ("workloads", "harness", "launchers", "hydra_plugins"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Compare):
                    continue
                sides = [node.left, *node.comparators]
                if any(
                    isinstance(side, ast.Attribute | ast.Name)
                    and getattr(side, "attr", getattr(side, "id", "")) == "source"
                    for side in sides
                ) and any(isinstance(side, ast.Constant) and side.value in names for side in sides):
                    found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert found == []


def test_a_spec_takes_only_keys_of_network_and_needs_one_of_its_own() -> None:
    build = function_in("workloads.networks.zoo", "build_module")
    with pytest.raises(TypeError, match="no keys of network"):
        NetworkSourceSpec(name="x", build=build, settings=("depth",))
    with pytest.raises(TypeError, match="not among its settings"):
        NetworkSourceSpec(name="x", build=build, requires="arch", settings=("target",))
    assert NetworkSourceSpec(name="x", build=build).title == "x"


def test_an_unknown_source_is_refused_naming_the_sources() -> None:
    with pytest.raises(NetworkError, match=r"network.source='nope' is invalid: allowed: builtin, "):
        network_registry.source_named("nope")
    with pytest.raises(ConfigError, match=r"allowed: builtin, module, torchvision, timm, hf$"):
        validate(compose_config(["network.source=nope"]))


class _Blocks(nn.Module):
    """A network whose layers only its source knows: no nn.Sequential, no pipeline_layers()."""

    def __init__(self, dataset: DatasetSpec) -> None:
        super().__init__()
        inputs = dataset.channels * dataset.resolution**2
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Flatten(), nn.Linear(inputs, 8)), nn.Linear(8, dataset.num_classes)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _build_blocks(ref: NetworkRef, dataset: DatasetSpec) -> nn.Module:
    return _Blocks(dataset)


def _block_layers(ref: NetworkRef, model: nn.Module) -> list[nn.Module]:
    assert isinstance(model, _Blocks)
    return list(model.blocks)


@pytest.fixture
def another_source(monkeypatch: pytest.MonkeyPatch) -> Iterator[NetworkSourceSpec]:
    """A source added beside distbench's own, as a registered package's would be."""
    spec = NetworkSourceSpec(
        name="blocks_zoo",
        build=_build_blocks,
        requires="arch",
        settings=("arch", "kwargs"),
        layers=_block_layers,
    )
    sources = {**network_registry.sources(), spec.name: spec}
    monkeypatch.setattr(network_registry, "sources", lambda: sources)
    yield spec


def test_building_validation_and_the_layer_list_ask_the_source(
    another_source: NetworkSourceSpec,
) -> None:
    ref = NetworkRef(name="tiny", source=another_source.name, arch="any")
    model = build_network(ref, MNIST)
    assert [type(layer) for layer in to_layer_list(ref, model)] == [nn.Sequential, nn.Linear]
    assert layer_count(ref, MNIST) == 2
    config = validate(
        compose_config(["network.source=blocks_zoo", "network.name=tiny", "network.arch=any"])
    )
    assert config.network.source_spec is another_source
    with pytest.raises(ConfigError) as refused:
        validate(compose_config(["network.source=blocks_zoo", "network.name=tiny"]))
    assert bad_input_message(refused.value) == (
        "network.arch=None is invalid: network.source=blocks_zoo needs network.arch"
    )
    with pytest.raises(ConfigError) as refused:
        validate(compose_config(["network=hf", "+network.kwargs.depth=2"]))
    assert bad_input_message(refused.value) == (
        "network.kwargs={'depth': 2} is invalid: is a setting of network.source=module, "
        "torchvision, timm, blocks_zoo, not of hf"
    )
    with pytest.raises(ConfigError, match="any other network: network=module, torchvision, "):
        validate(compose_config(["network.name=resnet19"]))


def _registered(monkeypatch: pytest.MonkeyPatch, *entries: EntryPoint) -> None:
    monkeypatch.setattr(network_registry.plugins, "registered", lambda group: entries)
    network_registry.sources.cache_clear()


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    network_registry.sources.cache_clear()
    yield
    network_registry.sources.cache_clear()


@pytest.mark.usefixtures("fresh_registry")
def test_a_registered_source_joins_and_a_bad_registration_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = network_registry.ENTRY_POINT_GROUP
    _registered(monkeypatch, EntryPoint("mod", "workloads.networks.sources.module", group))
    with pytest.raises(NetworkError, match=r"its name 'module' is taken"):
        network_registry.sources()
    _registered(monkeypatch, EntryPoint("nope", "no_such_module", group))
    with pytest.raises(ConfigError) as refused:
        validate(compose_config([]))
    assert bad_input_message(refused.value).startswith(
        "the network source nope = no_such_module (entry point distbench.network_sources) is "
        "invalid: importing it failed: ModuleNotFoundError: No module named 'no_such_module'"
    )
    _registered(monkeypatch, EntryPoint("odd", "workloads.networks.ref:BUILTIN", group))
    with pytest.raises(NetworkError, match="holds no NetworkSourceSpec"):
        network_registry.sources()
    spec = "tests.unit.workloads.networks.test_registry:REGISTERED"
    _registered(monkeypatch, EntryPoint("extra", spec, group))
    assert network_registry.sources()["extra"] is REGISTERED
    assert list(network_registry.sources())[-1] == "extra"  # after distbench's own


REGISTERED = NetworkSourceSpec(name="extra", build=_build_blocks, layers=_block_layers)
