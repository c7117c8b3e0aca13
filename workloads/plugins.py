"""What other packages add to distbench, registered as Python packages register plugins: an
entry point of a group distbench reads, and no file of distbench edited.

Two groups are read: `distbench.network_sources` (where networks come from:
`workloads.networks.registry`) and `distbench.distributions` (distribution models:
`harness.distributions.plugins`). A package declares its own in its `pyproject.toml`::

    [project.entry-points."distbench.network_sources"]
    mlp = "my_extensions.mlp"        # a module that defines SPEC (or "module:SPEC")

and may ship config files in a `conf/` folder beside the module (`conf/network/mlp.yaml`),
which Hydra's search path gets (`hydra_plugins/distbench_models`). This module reads the
entry points and finds the modules' folders without importing any of them: Hydra runs its
search-path plugins on every start-up, and a command's --help must stay quick.
"""

from __future__ import annotations

import functools
import importlib.util
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TypeVar

Spec = TypeVar("Spec")

# Where a package registers a network source (`workloads.networks.registry`).
NETWORK_SOURCES = "distbench.network_sources"


@functools.cache  # reading every installed package's metadata takes ~30 ms: once a process
def registered(group: str) -> tuple[EntryPoint, ...]:
    """The entry points other packages registered in `group`, by name."""
    return tuple(sorted(entry_points(group=group), key=lambda entry: entry.name))


def module_dir(entry: EntryPoint) -> Path | None:
    """The directory of the registered module (a package's folder, a module's parent), found
    without running it; None when it cannot be found."""
    try:
        found = importlib.util.find_spec(entry.module)
    except (ImportError, ValueError):
        return None
    if found is None or found.origin is None:
        return None
    return Path(found.origin).parent


def config_dirs(group: str) -> list[Path]:
    """The `conf/` folder of every module registered in `group` that has one: where Hydra
    finds its config files."""
    dirs = []
    for entry in registered(group):
        folder = module_dir(entry)
        if folder is not None and (folder / "conf").is_dir():
            dirs.append(folder / "conf")
    return dirs


def registered_spec(
    entry: EntryPoint, spec_type: type[Spec], what: str, error: type[Exception]
) -> Spec:
    """The spec a package registered: its entry point names a module defining `SPEC`, or the
    spec itself (`module:SPEC`). A registration that cannot be loaded, or holds no
    `spec_type`, is refused as `error` in one line naming it (`what`: "the network source",
    "the distribution model")."""
    where = f"{what} {entry.name} = {entry.value} (entry point {entry.group})"
    try:
        loaded = entry.load()
    except Exception as err:  # noqa: BLE001 - any failure of a user's module, named
        raise error(
            f"{where} is invalid: importing it failed: {type(err).__name__}: {err}; "
            f"allowed: a module that defines SPEC"
        ) from err
    spec = getattr(loaded, "SPEC", loaded)
    if not isinstance(spec, spec_type):
        name = spec_type.__name__
        raise error(
            f"{where} is invalid: it holds no {name}; allowed: a module that defines "
            f"SPEC = {name}(...)"
        )
    return spec
