"""distbench's launchers under the names of Hydra's submitit launchers.

`hydra/launcher=submitit_local` and `hydra/launcher=submitit_slurm` are the names users of
Hydra's submitit plugin know; under them distbench runs its own launchers, which keep timings
honest: `serial_local` (one cell at a time; the plugin's starts a whole sweep at once) and
`slurm_cells` (one job per cell, sized from its hardware, on exclusive nodes).

Hydra's plugin scan stores the plugin's configs in the ConfigStore when it first runs, so
storing ours under the same names only sticks after that scan: it is forced here first. (A
YAML file of the same name in conf/ does not work: Hydra merges it with the plugin's schema.)
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins


def register_launcher_names() -> None:
    Plugins.instance()  # the plugin scan, now, so that the entries below replace the plugin's
    from hydra_plugins.distbench_launcher.serial_local import SerialLocalConf
    from hydra_plugins.distbench_launcher.slurm_cells import SlurmCellsConf

    store = ConfigStore.instance()
    store.store(group="hydra/launcher", name="submitit_local", node=SerialLocalConf,
                provider="distbench")
    store.store(group="hydra/launcher", name="submitit_slurm", node=SlurmCellsConf,
                provider="distbench")
