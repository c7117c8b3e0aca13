"""Hydra's private API, used in one place: `launchers/hydra_private.py` is the only module
that imports `hydra._internal`, and each private name it hands out still has what distbench
calls (so that a new Hydra that moved one fails here, naming it, not somewhere in a sweep)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode

from harness.commands.compose import CONFIG_MODULE
from harness.distributions.registry import register_configs
from launchers.hydra_private import (
    BasicSweeper,
    CachingConfigRepository,
    ConfigLoaderImpl,
    Hydra,
    composing_hydra,
    defaults_list,
    get_args_parser,
)
from tests.meta.test_import_graph import _imported, source_files

PRIVATE = "hydra._internal"
THE_ONE_MODULE = "launchers.hydra_private"


def _imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module `module` names in an import, read as the import graph's test reads them
    (also those inside functions)."""
    return {
        name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in _imported(node, module, path.name == "__init__.py", modules)[0]
    }


def test_only_one_module_imports_hydras_private_api() -> None:
    modules = source_files()
    importers = sorted(
        module
        for module, path in modules.items()
        if any(
            name == PRIVATE or name.startswith(f"{PRIVATE}.")
            for name in _imports_of(module, path, modules)
        )
    )
    assert importers == [THE_ONE_MODULE]


def test_hydras_parser_reads_the_flags_the_check_reads() -> None:
    # launchers.hydra_main.check_hydra_main reads these of Hydra's parsed command line
    args = get_args_parser().parse_args(["-m", "--cfg", "job", "dataset=mnist"])
    for flag in (
        "help",
        "hydra_help",
        "info",
        "shell_completion",
        "config_path",
        "config_name",
        "config_dir",
        "experimental_rerun",
        "cfg",
        "package",
        "multirun",
        "run",
        "resolve",
        "overrides",
    ):
        assert hasattr(args, flag), flag
    assert args.multirun and args.cfg == "job" and args.overrides == ["dataset=mnist"]


def test_the_basic_sweeper_lists_cells_in_its_order() -> None:
    parsed = OverridesParser.create().parse_overrides(["a=1,2", "b=x,y"])
    cells = [cell for batch in BasicSweeper.split_arguments(parsed, None) for cell in batch]
    assert cells == [["a=1", "b=x"], ["a=1", "b=y"], ["a=2", "b=x"], ["a=2", "b=y"]]


def test_the_config_loader_has_what_config_files_replaces() -> None:
    # launchers.config_files: the method it replaces, the one it wraps, and what they use
    replaced = inspect.signature(ConfigLoaderImpl._parse_overrides_and_create_caching_repo)
    assert list(replaced.parameters) == ["self", "config_name", "overrides"]
    assert list(inspect.signature(ConfigLoaderImpl.load_sweep_config).parameters) == [
        "self",
        "master_config",
        "sweep_overrides",
    ]
    assert list(inspect.signature(ConfigLoaderImpl._process_config_searchpath).parameters)[:2] == [
        "self",
        "config_name",
    ]
    with composing_hydra(CONFIG_MODULE) as hydra:
        loader = hydra.config_loader
        assert isinstance(loader, ConfigLoaderImpl)
        assert loader.get_sources()  # config_files keys what it keeps by them
        repository = CachingConfigRepository(loader.repository)
        # the attributes config_files' repository sets instead of calling Hydra's __init__
        assert {"delegate", "cache"} <= set(vars(repository))
        assert repository.load_config("config") is not None


def test_hydras_defaults_list_reads_its_interpolation_map_for_interpolations_only() -> None:
    # launchers.config_files builds the map only where an entry interpolates: what it wraps,
    # and that Hydra reads the map nowhere but where it resolves those entries
    assert list(inspect.signature(defaults_list._create_interpolation_map).parameters) == [
        "overrides",
        "defaults_list",
        "self_added",
    ]
    source = inspect.getsource(defaults_list._create_defaults_tree_impl)
    assert source.count("known_choices") == 2
    assert "known_choices = _create_interpolation_map(" in source
    assert "dd.is_interpolation():\n            dd.resolve_interpolation(known_choices)" in source


def test_hydras_object_composes_as_the_check_calls_it() -> None:
    # launchers.hydra_main.check_hydra_main: get_mode, then compose_config in a run's mode
    for method in (Hydra.get_mode, Hydra.compose_config):
        assert {"config_name", "overrides"} <= set(inspect.signature(method).parameters)
    assert "run_mode" in inspect.signature(Hydra.compose_config).parameters
    register_configs()  # as the check does first
    with composing_hydra(CONFIG_MODULE) as hydra:
        assert isinstance(hydra, Hydra)
        assert hydra.get_mode(config_name="config", overrides=[]) is None  # no sweep file
        config = hydra.compose_config(
            config_name="config", overrides=["dataset=mnist"], run_mode=RunMode.RUN
        )
        assert config.dataset.name == "mnist" and "hydra" in config  # with its hydra node
    assert not GlobalHydra.instance().is_initialized()  # cleared on leaving
