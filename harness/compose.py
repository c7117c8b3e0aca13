"""Compose and validate the config outside `@hydra.main`, for the helper commands
(`harness.describe`, later `harness.recommend`, `harness.probe`) and for tests."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig

from harness.config import ConfigError, DistbenchConfig, one_line, register_configs, validate

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The composed (not yet validated) config for `overrides`, as `python -m harness` sees it."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=False)


def compose_or_exit(overrides: Sequence[str]) -> DistbenchConfig:
    """Composed and validated config; on bad input one line on stderr and exit status 2."""
    try:
        return validate(compose_config(overrides))
    except (ConfigError, HydraException) as err:
        print(f"distbench: invalid config: {one_line(err)}", file=sys.stderr)
        sys.exit(2)

