"""Every distribution model distbench has: the packages of `harness.distributions` that define
a `SPEC` (`harness.distributions.spec`), and those other packages register under the entry
points `distbench.distributions` (`harness.distributions.plugins`), found when first asked
for, so that a new model is one new package and one config file. Only the packages are
imported: the shared training modules beside them (and with them torch) load in a worker
only."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

import harness.distributions as package
from harness.config.schema import ConfigError, DistbenchConfig, DistributionConfig, validate
from harness.distributions import plugins
from harness.distributions.spec import DistributionSpec
from harness.profiles.collectives import Collective
from workloads.plugins import registered_spec


@functools.cache
def specs() -> dict[str, DistributionSpec]:
    """name -> spec of every model, sorted by name."""
    found = {}
    for module in pkgutil.iter_modules(package.__path__):
        if not module.ispkg:  # what the models share, not a model
            continue
        spec = getattr(importlib.import_module(f"{package.__name__}.{module.name}"), "SPEC", None)
        if isinstance(spec, DistributionSpec):
            found[spec.name] = spec
    for entry in plugins.registered():
        spec = registered_spec(entry, DistributionSpec, "the distribution model", ConfigError)
        if spec.name in found:
            raise ConfigError(
                f"the distribution model {entry.name} = {entry.value} (entry point "
                f"{plugins.ENTRY_POINT_GROUP}) is invalid: its name "
                f"{spec.name!r} is taken; allowed: a name no other model has"
            )
        found[spec.name] = spec
    return dict(sorted(found.items()))


def baseline() -> DistributionSpec:
    """The model speedups are measured against and step times are probed with (the spec that
    says `baseline=True`)."""
    (spec,) = [spec for spec in specs().values() if spec.baseline]
    return spec


def probed_collectives() -> frozenset[Collective]:
    """What the hardware probe measures: the union of the collectives every registered model
    declares (`DistributionSpec.probed_collectives`)."""
    return frozenset(
        collective for spec in specs().values() for collective in spec.probed_collectives
    )


def spec_named(name: str) -> DistributionSpec:
    """The spec of model `name`; ConfigError names the models there are."""
    try:
        return specs()[name]
    except KeyError:
        raise ConfigError(
            f"distribution.name={name!r} is invalid: allowed: {', '.join(specs())}"
        ) from None


def spec_of(config: DistbenchConfig) -> DistributionSpec:
    """The spec of the cell's model."""
    return spec_named(config.distribution.name)


def settings(name: str, **values: Any) -> DistributionConfig:
    """Model `name`'s settings with `values` (the rest at their defaults)."""
    return spec_named(name).settings(name=name, **values)


def one_worker_cell(config: DistbenchConfig, batch: int) -> DistbenchConfig:
    """`config`'s workload as one worker of the baseline model at `batch`, as a sequential
    step time is measured (probed, or asked for where it is missing): a cell's global batch,
    which sets its workers' batch, is not that step's."""
    one_worker = settings(baseline().name, batch_size=batch, backend=config.distribution.backend)
    return dataclasses.replace(
        config, distribution=one_worker, run=dataclasses.replace(config.run, global_batch=None)
    )


def register_configs() -> None:
    """Register the cell's schema (conf/config.yaml extends it: `defaults: [distbench_schema]`)
    and every model's settings as the schema of its config file: `<name>_schema` at the top of
    the config tree, which conf/distribution/<name>.yaml extends (`defaults: [/<name>_schema]`,
    merged at the file's package, `distribution`). Not in the `distribution` group: Hydra's
    --help and shell completion offer a group's every option, and `distribution=ddp_schema`
    would run the bare schema as a model."""
    store = ConfigStore.instance()
    store.store(name="distbench_schema", node=DistbenchConfig)
    for spec in specs().values():
        store.store(name=f"{spec.name}_schema", node=spec.settings)


def config_from_record(data: Mapping[str, Any]) -> DistbenchConfig:
    """A recorded cell's config (a result.json's or MLflow's plain `config`), checked and
    typed with its model's settings. Not against this machine's memory: the cell ran, where it
    ran (`validate`'s `weights_must_fit`)."""
    name = str(data.get("distribution", {}).get("name", ""))
    schema = OmegaConf.structured(DistbenchConfig)
    schema.distribution = OmegaConf.structured(spec_named(name).settings)
    merged = OmegaConf.merge(schema, OmegaConf.create(dict(data)))
    assert isinstance(merged, DictConfig)
    return validate(merged, weights_must_fit=False)


def setting_names() -> list[str]:
    """Every model's own settings (their union, in the models' order, each once): the columns
    a sweep's table has besides the common axes."""
    names: dict[str, None] = {}
    base = {f.name for f in dataclasses.fields(DistributionConfig)}
    for spec in specs().values():
        names.update(
            (f.name, None) for f in dataclasses.fields(spec.settings) if f.name not in base
        )
    return list(names)
