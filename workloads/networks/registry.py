"""Every network source distbench has: the modules of `workloads.networks.sources` that define
a `SPEC` (`workloads.networks.source`), and those other packages register under the entry
point group `distbench.network_sources` (`workloads.plugins`), found when first asked for, so
that a new source is one new module (and a config file for `network=<name>`). Importing the
specs loads no torch: the config's checks read them on every command."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from importlib.metadata import EntryPoint

import workloads.networks.sources as package
from workloads import plugins
from workloads.networks.ref import NetworkError, NetworkRef, as_ref
from workloads.networks.source import NetworkSourceSpec

ENTRY_POINT_GROUP = plugins.NETWORK_SOURCES


@functools.cache
def sources() -> dict[str, NetworkSourceSpec]:
    """name -> spec of every source, in their order (`NetworkSourceSpec.order`, then name).
    NetworkError (one line naming the entry point) for a registration that cannot be loaded
    or whose name another source has."""
    found = {}
    for module in pkgutil.iter_modules(package.__path__):
        spec = getattr(importlib.import_module(f"{package.__name__}.{module.name}"), "SPEC", None)
        if isinstance(spec, NetworkSourceSpec):
            found[spec.name] = spec
    for entry in plugins.registered(ENTRY_POINT_GROUP):
        spec = plugins.registered_spec(entry, NetworkSourceSpec, "the network source", NetworkError)
        if spec.name in found:
            raise NetworkError(
                f"{_where(entry)} is invalid: its name {spec.name!r} is taken; allowed: a "
                f"name no other network source has"
            )
        found[spec.name] = spec
    return dict(sorted(found.items(), key=lambda item: (item[1].order, item[0])))


def _where(entry: EntryPoint) -> str:
    return f"the network source {entry.name} = {entry.value} (entry point {ENTRY_POINT_GROUP})"


def source_named(name: str) -> NetworkSourceSpec:
    """The spec of source `name`; NetworkError names the sources there are."""
    try:
        return sources()[name]
    except KeyError:
        raise NetworkError(
            f"network.source={name!r} is invalid: allowed: {', '.join(sources())}"
        ) from None


def source_of(network: str | NetworkRef) -> NetworkSourceSpec:
    """The spec of the source a network comes from (a bare name is a built-in network)."""
    return source_named(as_ref(network).source)
