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
