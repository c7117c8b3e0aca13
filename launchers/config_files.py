"""Each config file read once per process, however many configs Hydra composes from it.

Hydra composes a config from its files through a `CachingConfigRepository`, a cache of the
files it has loaded (parsed YAML or a structured config, and its defaults list), but makes a
fresh, empty one for every composition, from a deep copy of every config source
(`ConfigLoaderImpl._parse_overrides_and_create_caching_repo`, 13 ms a copy).
A sweep composes every cell (the check before Hydra runs, the dry run, the launcher), its --help
asks 86 questions, and each re-reads and re-parses the same files (14 loads for a cell of the thesis
grid). With them read once, a cell of the thesis grid composes in 0.07 s instead of 0.10 s
(measured: docs/benchmarks/2026-11-28-commands-and-suite.md, "Each file read once, each cell
composed once (2026-11-28)"); the rest is Hydra building the defaults tree and merging, which no
cache of files removes.

`config_files_read_once()` keeps what each file loaded to (per config loader and search path)
for every later composition. Each composition still gets its own repository, as in Hydra, and
from it a deep copy of each loaded config: composing merges the loaded configs into the new
one and may hand it their nodes (a model's settings node, merged into `distribution`, is then
changed by the next merge), so a loaded config is never shared between two compositions. The
files must not change while it is open: it is opened around the compositions of one command.

While it is open, each cell of a sweep is also composed once: `python -m harness -m` composes
every cell to check it before Hydra runs (`launchers.hydra_main`), Hydra's sweeper composes
them again to check them (`Sweeper.validate_batch_is_legal`), then the launcher prepares them.
`load_sweep_config` keeps what it composed, by what the composition depends on (the config
sources, the config name, Hydra's own overrides of the sweep and the cell's), and hands out a
deep copy with the asking sweep's resolved values (its `${now:}`): 5 ms instead of 70-100 ms
for a cell of the thesis grid.

While it is open, Hydra also builds the interpolation map of a defaults list (an OmegaConf config of
every group choice so far, built for each config that has a defaults list: 19 per cell of the thesis
grid) only where an entry of that list interpolates, the one thing that reads it: the same
compositions, 15 % less time (docs/benchmarks/2026-11-29-dry-run.md, "The dry run on every core, a
probe that stops once steady (2026-11-29)").
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Iterator, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.plugins.config_source import ConfigResult
from omegaconf import DictConfig, OmegaConf

from launchers.hydra_private import (
    CachingConfigRepository,
    ConfigLoaderImpl,
    IConfigRepository,
    defaults_list,
)

_SEARCH_PATH_KEY = "hydra.searchpath"
# The cells composed while open (see the module's docstring), pristine; and whether a cell
# composed now is kept (a dry run composes each cell once: keeping would only cost a copy).
_composed: dict[tuple[tuple[str, ...], str, tuple[str, ...], tuple[str, ...]], DictConfig] = {}
_keeping = [True]
# The loaded files, pristine, of a config loader under one search path override (or none).
_Loaded = dict[str, ConfigResult | None]


class _RepositoryOfReadFiles(CachingConfigRepository):
    """Hydra's repository of one composition, whose files come from those read earlier."""

    def __init__(self, delegate: IConfigRepository, read: _Loaded) -> None:
        # Not Hydra's __init__: it deep-copies the delegate (every config source, 13 ms) so
        # that a search path override cannot change the loader's; `delegate` is already such a
        # copy, made once for the search path it serves.
        self.delegate = delegate
        self.cache: dict[str, ConfigResult | None] = {}
        self._read = read

    def load_config(self, config_path: str) -> ConfigResult | None:
        if config_path in self.cache:  # loaded for this composition: Hydra's own cache
            return self.cache[config_path]
        if config_path not in self._read:
            loaded = self.delegate.load_config(config_path)
            self._read[config_path] = copy.deepcopy(loaded)
        else:
            loaded = copy.deepcopy(self._read[config_path])
        self.cache[config_path] = loaded
        return loaded


@contextlib.contextmanager
def config_files_read_once() -> Iterator[None]:
    """While open, every composition by a config loader takes the files that its earlier
    compositions (with the same search path) read, each as a fresh copy."""
    original = ConfigLoaderImpl._parse_overrides_and_create_caching_repo
    if getattr(original, "_reads_once", False):  # already open further up the stack
        yield
        return
    # per config loader and search path override: Hydra's repository (a copy) and its files
    read: weakref.WeakKeyDictionary[
        ConfigLoaderImpl, dict[str | None, tuple[IConfigRepository, _Loaded]]
    ]
    read = weakref.WeakKeyDictionary()

    def repository_of_read_files(
        self: ConfigLoaderImpl, config_name: str | None, overrides: list[str]
    ) -> tuple[list[Override], CachingConfigRepository]:
        parsed = OverridesParser.create().parse_overrides(overrides=overrides)
        search_path = next(
            (str(o.value()) for o in parsed if o.get_key_element() == _SEARCH_PATH_KEY), None
        )
        of_loader = read.setdefault(self, {})
        if search_path not in of_loader:
            of_loader[search_path] = (copy.deepcopy(self.repository), {})
        repository = _RepositoryOfReadFiles(*of_loader[search_path])
        self._process_config_searchpath(config_name, parsed, repository)
        return parsed, repository

    repository_of_read_files._reads_once = True  # type: ignore[attr-defined]
    original_sweep_config = ConfigLoaderImpl.load_sweep_config
    original_map = defaults_list._create_interpolation_map
    ConfigLoaderImpl._parse_overrides_and_create_caching_repo = repository_of_read_files  # type: ignore[method-assign]
    ConfigLoaderImpl.load_sweep_config = _composed_once(original_sweep_config)  # type: ignore[method-assign]
    defaults_list._create_interpolation_map = _map_where_read(original_map)
    try:
        yield
    finally:
        ConfigLoaderImpl._parse_overrides_and_create_caching_repo = original  # type: ignore[method-assign]
        ConfigLoaderImpl.load_sweep_config = original_sweep_config  # type: ignore[method-assign]
        defaults_list._create_interpolation_map = original_map
        _composed.clear()


def _map_where_read(create_map):  # noqa: ANN001, ANN202 - Hydra's function, wrapped
    """Hydra's `_create_interpolation_map`, called only where the defaults list has an entry
    that interpolates: Hydra resolves those entries against the map and reads it for nothing
    else (`defaults_list._create_defaults_tree_impl`); elsewhere None, never read."""

    def map_where_read(overrides, defaults, self_added):  # noqa: ANN001, ANN202
        if any(default.is_interpolation() for default in defaults if not default.is_self()):
            return create_map(overrides, defaults, self_added)
        return None

    return map_where_read


def _composed_once(load_sweep_config):  # noqa: ANN001, ANN202 - Hydra's method, wrapped
    def composed_once(
        self: ConfigLoaderImpl, master_config: DictConfig, sweep_overrides: Sequence[str]
    ) -> DictConfig:
        hydra_overrides = OmegaConf.to_container(master_config.hydra.overrides.hydra)
        assert isinstance(hydra_overrides, list)
        key = (
            tuple(f"{source.provider}={source.path}" for source in self.get_sources()),
            str(master_config.hydra.job.config_name),
            tuple(map(str, hydra_overrides)),
            tuple(sweep_overrides),
        )
        if key not in _composed:
            config = load_sweep_config(self, master_config, list(sweep_overrides))
            if _keeping[0]:
                _composed[key] = copy.deepcopy(config)
            return config
        config = copy.deepcopy(_composed[key])
        # as load_sweep_config does: the sweep's resolved values (its ${now:}) are the cell's
        OmegaConf.copy_cache(from_config=master_config, to_config=config)
        return config

    return composed_once


@contextlib.contextmanager
def cells_not_kept() -> Iterator[None]:
    """Cells composed inside are not kept for a later composition (a dry run composes each
    once, then exits)."""
    _keeping[0] = False
    try:
        yield
    finally:
        _keeping[0] = True
