"""distbench's launchers under the names of Hydra's submitit launchers.

`hydra/launcher=submitit_local` and `hydra/launcher=submitit_slurm` are the names users of
Hydra's submitit plugin know; under them distbench runs its own launchers, which keep timings
honest: `serial_local` (one cell at a time; the plugin's starts a whole sweep at once) and
`slurm_cells` (one job per cell, sized from its hardware, on exclusive nodes).

Hydra's plugin scan stores the plugin's configs in the ConfigStore when it runs (it executes
every module of `hydra_plugins`, in an order that depends on where each is installed), so
storing ours under the same names only sticks after that scan. `LauncherNames` does it at the
first moment after the scan that every composition passes through: Hydra instantiates each
search-path plugin whenever it sets up a config search path (`@hydra.main`,
`initialize_config_module`), before it loads any config. So no module of distbench has to
remember to register the names before it composes, and the core needs no import of the
launchers or of this package. (A YAML file of the same name in conf/ does not work: Hydra
merges it with the plugin's schema.)

Keep imports light, and no `from __future__ import annotations`: Hydra executes this module
on every start-up while scanning for plugins (`serial_local` says why).
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin

# The submitit plugin's names, and distbench's launchers that run under them.
ALIASES = {"submitit_local": "serial_local", "submitit_slurm": "slurm_cells"}


def register_launcher_names() -> None:
    """Store distbench's launchers under the submitit plugin's names (after its scan). Each is
    the config its own module stored under its own name when the scan executed it, so this
    module needs neither launcher module (`slurm_cells` calls it)."""
    Plugins.instance()  # the plugin scan, now, so that the entries below replace the plugin's
    store = ConfigStore.instance()
    for alias, ours in ALIASES.items():
        store.store(
            group="hydra/launcher",
            name=alias,
            node=store.load(f"hydra/launcher/{ours}.yaml").node,
            provider="distbench",
        )


class LauncherNames(SearchPathPlugin):
    """Adds no search path: Hydra's hook after its plugin scan and before any config is loaded,
    where distbench's launcher names are stored (module docstring)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        register_launcher_names()
