"""Compose and validate the config outside `@hydra.main`, for the helper commands
(`harness.describe`, `harness.probe`, later `harness.recommend`) and for tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from harness.cli import exit_on_bad_input
from harness.config import DistbenchConfig, register_configs, validate

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose_config(overrides: Sequence[str] = (), *, with_hydra: bool = False) -> DictConfig:
    """The composed (not yet validated) config for `overrides`, as `python -m harness` sees it;
    `with_hydra` keeps Hydra's own node (the launcher's settings, for commands that start
    workers)."""
    from launchers.hydra_names import register_launcher_names

    register_configs()
    register_launcher_names()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides),
                       return_hydra_config=with_hydra)


def compose_or_exit(overrides: Sequence[str]) -> DistbenchConfig:
    """Composed and validated config; on bad input one line on stderr and exit status 2
    (`harness.cli`)."""
    with exit_on_bad_input():
        return validate(compose_config(overrides))
    raise AssertionError("unreachable")  # for type checkers: the block returns or exits
