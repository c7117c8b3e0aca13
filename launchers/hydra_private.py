"""Every name of Hydra's private API (`hydra._internal`) that distbench uses, in one place.

Hydra's public API composes a config (`hydra.compose`) and runs an app (`@hydra.main`), but
`python -m harness` must check its command line before Hydra runs (Hydra creates the run or
sweep directory first: `launchers.hydra_main`), and a sweep composes every cell several times
(`launchers.config_files`). For that it needs what only Hydra's internals offer:

- `get_args_parser`: Hydra's own command-line parser, so that distbench reads `--cfg`,
  `--multirun`, `--config-dir`, ... exactly as Hydra will;
- `BasicSweeper.split_arguments`: the cells of a sweep, in the order Hydra's basic sweeper
  runs them;
- `ConfigLoaderImpl` (`_parse_overrides_and_create_caching_repo`, `load_sweep_config`,
  `_process_config_searchpath`), `CachingConfigRepository` and `IConfigRepository`: where
  Hydra reads its config files for one composition, which `launchers.config_files` replaces
  with files read once per process.

- `defaults_list` (its `_create_interpolation_map`): the map Hydra builds, an OmegaConf config
  of every choice so far, for each config with a defaults list, though only a defaults entry
  that interpolates (`db: ${db_type}`) reads it; `launchers.config_files` builds it only then.

- `Hydra` (`composing_hydra`): Hydra's internal object that `GlobalHydra.instance().hydra`
  (public itself) hands out, whose `get_mode`, `compose_config` and `config_loader` the check
  calls: the only way to compose a sweep's config as a multirun does.

No other module imports `hydra._internal` (`tests/meta/test_hydra_private.py` checks it, and that
each name here still has what distbench calls, so that an upgrade of Hydra past the pinned
1.3 line fails in one test that names what moved).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hydra import initialize_config_module
from hydra._internal import defaults_list
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.config_repository import CachingConfigRepository, IConfigRepository
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.hydra import Hydra
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra

__all__ = [
    "BasicSweeper",
    "CachingConfigRepository",
    "ConfigLoaderImpl",
    "Hydra",
    "IConfigRepository",
    "composing_hydra",
    "defaults_list",
    "get_args_parser",
]


@contextmanager
def composing_hydra(config_module: str) -> Iterator[Hydra]:
    """Hydra initialised on `config_module` (Hydra 1.3's defaults) and its internal object,
    which composes as `@hydra.main` will; Hydra's global state is cleared on leaving."""
    with initialize_config_module(config_module=config_module, version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None  # initialised just above
        yield hydra
