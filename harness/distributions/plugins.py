"""Distribution models of other packages: a user's model is registered as Python packages
register plugins, with an entry point, and edits no file of distbench.

A package that ships a model declares it in its `pyproject.toml`::

    [project.entry-points."distbench.distributions"]
    local_sgd = "my_models.local_sgd"     # a module (package) that defines SPEC

and lays the model out as distbench's own models are (docs/distribution-models.md): the
module's `SPEC = DistributionSpec(...)`, its trainer beside it (`trainer_in`), and its config
file in a `conf/` folder of the module's directory, `conf/distribution/local_sgd.yaml` (and,
if it wants a place in the calibration sweep, `conf/sweep/calibrate_local/local_sgd.yaml`).
The registry (`harness.distributions.registry`) adds each registered SPEC to distbench's own;
Hydra's search path gets each module's `conf/` (`hydra_plugins/distbench_models`), so
`distribution=local_sgd` composes, is checked, predicted, recommended and trained like a
built-in model. This module reads the entry points only (no import of a model:
`workloads.plugins`, which reads the network sources' too): Hydra runs its search-path
plugins on every start-up.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

from workloads import plugins

ENTRY_POINT_GROUP = "distbench.distributions"


def registered() -> tuple[EntryPoint, ...]:
    """The models other packages registered, by name (read once a process:
    `workloads.plugins.registered`)."""
    return plugins.registered(ENTRY_POINT_GROUP)


def module_dir(entry: EntryPoint) -> Path | None:
    """The directory of the registered module, found without running it; None when it cannot
    be found."""
    return plugins.module_dir(entry)


def config_dirs() -> list[Path]:
    """The `conf/` folder of every registered model that has one: where Hydra finds its config
    file (conf/distribution/<name>.yaml)."""
    return plugins.config_dirs(ENTRY_POINT_GROUP)
