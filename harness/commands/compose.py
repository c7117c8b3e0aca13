"""Compose and validate the config outside `@hydra.main`, for the helper commands
(`harness.describe`, `harness.probe`, `harness.recommend`, ...) and for tests. What
`python -m harness` checks of its command line before Hydra runs (every cell of a sweep, as
its launcher prepares it) is the launchers' concern: `launchers.hydra_main`."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path

from hydra import compose, initialize_config_module
from omegaconf import DictConfig

from harness.cli.bad_input import exit_on_bad_input
from harness.config.schema import DistbenchConfig, validate
from harness.distributions.registry import register_configs

# The configs, the repository's conf/, are the package `harness.conf` (setup.py installs conf/
# under that name): Hydra finds them the same way in a checkout's editable install and in an
# installed wheel, wherever the command runs. `@hydra.main` is given CONFIG_PATH.
CONFIG_MODULE = "harness.conf"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"
CONF_DIR = Path(str(files(CONFIG_MODULE)))  # its directory, for code that reads a file directly


def compose_config(overrides: Sequence[str] = (), *, with_hydra: bool = False) -> DictConfig:
    """The composed (not yet validated) config for `overrides`, as `python -m harness` sees it;
    `with_hydra` keeps Hydra's own node (the launcher's settings, for commands that start
    workers). distbench's launcher names (`hydra/launcher=submitit_local`, `submitit_slurm`)
    are stored by its Hydra plugin as Hydra sets up the search path
    (`hydra_plugins.distbench_launcher.names`)."""
    register_configs()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return compose(
            config_name="config", overrides=list(overrides), return_hydra_config=with_hydra
        )


def compose_or_exit(overrides: Sequence[str]) -> DistbenchConfig:
    """Composed and validated config; on bad input one line on stderr and exit status 2
    (`harness.cli`)."""
    with exit_on_bad_input():
        return validate(compose_config(overrides))
    raise AssertionError("unreachable")  # for type checkers: the block returns or exits
