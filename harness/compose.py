"""Compose and validate the config outside `@hydra.main`, for the helper commands
(`harness.describe`, `harness.probe`, later `harness.recommend`) and for tests."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig

from harness.config import ConfigError, DistbenchConfig, one_line, register_configs, validate

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


@contextlib.contextmanager
def exit_on_bad_input() -> Iterator[None]:
    """Turn an invalid config inside the block into one line on stderr and exit status 2."""
    try:
        yield
    except (ConfigError, HydraException) as err:
        print(f"distbench: invalid config: {one_line(err)}", file=sys.stderr)
        sys.exit(2)


def compose_or_exit(overrides: Sequence[str]) -> DistbenchConfig:
    """Composed and validated config; on bad input one line on stderr and exit status 2."""
    with exit_on_bad_input():
        return validate(compose_config(overrides))
    raise AssertionError("unreachable")  # for type checkers: the block returns or exits
