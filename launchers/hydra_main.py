"""What `python -m harness` (a `@hydra.main` program) does around Hydra: its command line checked
before Hydra runs, every cell of a sweep as its launcher will prepare it, and the cells'
outcome as the exit status.

Hydra creates the run or sweep directory, and the sweep's MLflow parent run, before the task
function or the launcher sees the config; bad input must be refused before that, with one line
and exit status 2 (`harness.cli`). Checking a sweep is preparing its cells as the launchers do
(`launchers.cells.prepare_sweep`), so this lives with them, above the core: composing one config
is `harness.commands.compose.compose_config`.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness.cli.arguments import ArgumentParser, refuse_dashes_as_value
from harness.cli.bad_input import exit_on_bad_input
from harness.cli.cell_results import exit_on_failed_cells, forget_cell_results
from harness.cli.preflight import check_hydra_dir, check_launcher, check_runs_here
from harness.cli.signals import end_like_ctrl_c_on_sigterm
from harness.commands import dryrun
from harness.commands.compose import CONFIG_MODULE
from harness.commands.dryrun import DRY_RUN_FLAG
from harness.config.accepts import Accepts, allowed, shown
from harness.config.schema import ConfigError, validate
from harness.distributions.registry import register_configs
from launchers.config_files import cells_not_kept, config_files_read_once
from launchers.hydra_private import BasicSweeper, Hydra, composing_hydra, get_args_parser
from launchers.sweep_lock import claim_output_root

# Hydra re-raises instead of printing its own report while this is set (its documented switch).
_HYDRA_FULL_ERROR = "HYDRA_FULL_ERROR"


def run_hydra_main(main: Callable[[], object]) -> None:
    """Call a `@hydra.main` function so that Hydra's composition errors, too, come out as one
    line and exit status 2, and its cells' outcome becomes the exit status (1 when any cell
    did not end `ok`). A user who set HYDRA_FULL_ERROR asked for Hydra's full report and
    gets it unchanged.

    The config (every cell's, for a sweep) is composed and checked before Hydra runs:
    Hydra creates the run or sweep directory, and its callbacks open the MLflow store, before
    the task function or the launcher sees the config (`check_hydra_main`)."""
    forget_cell_results()
    end_like_ctrl_c_on_sigterm()
    # The check, Hydra's --help (86 compositions), Hydra's run and the launcher's preparing
    # of the cells all compose from the same files: each is read once (launchers.config_files).
    with config_files_read_once():
        _check_then_run(main)
    exit_on_failed_cells()


def _check_then_run(main: Callable[[], object]) -> None:
    before = os.environ.get(_HYDRA_FULL_ERROR)
    if before == "1":
        if DRY_RUN_FLAG in sys.argv[1:]:  # a flag of ours, not Hydra's: list the cells, exit
            check_hydra_main(sys.argv[1:])
        main()
        return
    with exit_on_bad_input():
        check_hydra_main(sys.argv[1:])
    os.environ[_HYDRA_FULL_ERROR] = "1"
    try:
        with exit_on_bad_input():
            main()
    finally:
        if before is None:
            os.environ.pop(_HYDRA_FULL_ERROR, None)
        else:
            os.environ[_HYDRA_FULL_ERROR] = before


def check_hydra_main(argv: Sequence[str]) -> None:
    """Compose and check what `python -m harness argv` is about to run, before Hydra writes
    anything (it creates the run or sweep directory, and the sweep's MLflow parent run, before
    the task function or the launcher sees the config); raise ConfigError or Hydra's error on
    bad input. A single run: its config, and what it needs of this machine. A sweep: every
    cell, as its launcher will compose, validate and size it (`launchers.cells.prepare_sweep`,
    which exits with status 2 on the first bad one). Commands that run nothing (--help, --cfg,
    --info, ...) and another config directory or name are left to Hydra; `--cfg` of a sweep
    first says on stderr that it shows the base config. With `--dry-run` the same cells are
    listed instead, and the process exits with status 0 (`harness.commands.dryrun`)."""
    parser = get_args_parser()
    parser.error = ArgumentParser.error.__get__(parser)  # type: ignore[method-assign]
    parser._get_values = functools.partial(refuse_dashes_as_value, parser)  # type: ignore[method-assign]
    # `distbench` (the console command) or else `python -m harness` (also when run in-process
    # by another program: its argv[0] is that program's, e.g. `-c` for `python -c`)
    command = Path(sys.argv[0]).name
    parser.prog = command if command.startswith("distbench") else "python -m harness"
    # Wherever it is typed: argparse takes no flag after the overrides have begun.
    dry_run = DRY_RUN_FLAG in argv
    args = parser.parse_args([argument for argument in argv if argument != DRY_RUN_FLAG])
    args.dry_run = dry_run
    _check_hydra_flags(args)
    _check_config_source(args)
    # `is not None`, as Hydra tells them: an empty --config-dir= is the working directory
    if (
        args.help
        or args.hydra_help
        or args.info is not None
        or args.shell_completion
        or args.config_path is not None
        or args.config_name is not None
        or args.config_dir is not None
        or args.experimental_rerun is not None
    ):
        _refuse_dry_run_with(args, "--help, --info, --config-*, --experimental-rerun")
        if args.experimental_rerun is not None:
            _check_rerun_file(args.experimental_rerun)
        elif args.shell_completion and not (args.help or args.hydra_help):
            _check_shell_completion(args.overrides)
        return
    register_configs()
    overrides = list(args.overrides)
    with composing_hydra(CONFIG_MODULE) as hydra:
        mode = hydra.get_mode(config_name="config", overrides=overrides)
        sweep = args.multirun or mode == RunMode.MULTIRUN
        if args.cfg:
            _refuse_dry_run_with(args, "--cfg")
            if args.package is not None:
                _check_package(hydra, overrides, args.cfg, args.package)
            if sweep and args.cfg != "hydra":  # Hydra prints the config before the sweep
                print(
                    f"distbench: --cfg {args.cfg} shows the sweep's base config, without "
                    f"any cell's overrides; {DRY_RUN_FLAG} lists the cells",
                    file=sys.stderr,
                    flush=True,
                )
            return
        command = f"{parser.prog}{' -m' if args.multirun else ''} {' '.join(overrides)}"
        # composed as Hydra's run will compose them, so that the launcher finds the cells
        # composed here (launchers.config_files)
        overrides += _hydras_mode_override(mode, multirun=args.multirun)
        if args.dry_run:
            _dry_run(hydra, overrides, sweep=sweep, command=command.rstrip())
        if sweep:
            _check_sweep(hydra, overrides)
        else:
            cfg = hydra.compose_config(
                config_name="config", overrides=overrides, run_mode=RunMode.RUN
            )
            config = validate(cfg)
            check_launcher(cfg.hydra, sweep=False)
            check_runs_here(config)
            check_hydra_dir(cfg.hydra, sweep=False)
            if config.world_size > 1:  # its workers start here, on this one machine
                from launchers import cells

                cells.single_node_workers(config)


def _hydras_mode_override(mode: RunMode | None, *, multirun: bool) -> list[str]:
    """The override of `hydra.mode` that Hydra's run adds to the command line's overrides
    (`hydra._internal.utils._run_app`): the run's config and every cell of a sweep carry it."""
    if mode is None:
        return ["hydra.mode=MULTIRUN" if multirun else "hydra.mode=RUN"]
    if multirun and mode == RunMode.RUN:
        return ["hydra.mode=MULTIRUN"]
    return []


def _check_hydra_flags(args) -> None:  # noqa: ANN001 - argparse's Namespace
    """The combinations of Hydra's flags that Hydra refuses only once it runs, with a
    ValueError (an error of the command, exit 3): refused here as bad input, in Hydra's order
    (--help wins; --resolve needs --cfg or --help; one of --run, --multirun, --cfg, --info,
    --shell-completion)."""
    if args.help:
        return
    if args.resolve and args.cfg is None:
        raise ConfigError(
            "--resolve is invalid without --cfg or --help: it resolves the config "
            "they show; allowed: --cfg job|hydra|all --resolve, --help --resolve"
        )
    if args.hydra_help:
        return
    given = [
        flag
        for flag, on in (
            ("--run", args.run),
            ("--multirun", args.multirun),
            ("--cfg", args.cfg is not None),
            ("--shell-completion", args.shell_completion),
            ("--info", args.info is not None),
        )
        if on
    ]
    if len(given) > 1:
        raise ConfigError(
            f"{' with '.join(given)} is invalid: allowed: one of --run, --multirun, "
            f"--cfg, --info and --shell-completion"
        )


def _check_config_source(args) -> None:  # noqa: ANN001 - argparse's Namespace
    """--config-dir, --config-path and --config-name name files Hydra looks up; a name longer
    than the file system holds makes that lookup raise OSError (an error of the command), so
    it is refused here, as Hydra will resolve it (an empty one is Hydra's to judge)."""
    declaration = Accepts("path", path="read")
    named = (
        ("--config-dir", args.config_dir, os.path.abspath(args.config_dir or ".")),
        # relative to the directory of the module that declares `@hydra.main`: harness/, the
        # package above harness/commands/dryrun.py
        (
            "--config-path",
            args.config_path,
            os.path.join(Path(dryrun.__file__).parents[1], args.config_path or ""),
        ),
        ("--config-name", args.config_name, f"{args.config_name}.yaml"),
    )
    for flag, value, looked_up in named:
        if value and allowed(declaration, looked_up) is not None:
            raise ConfigError(
                f"{flag}={shown(value)} is invalid: {allowed(declaration, looked_up)}"
            )


def _check_package(hydra: Hydra, overrides: list[str], shows: str, package: str) -> None:
    """--cfg TYPE --package KEY shows KEY of the config TYPE shows: Hydra exits with status 1
    for a KEY that is not there (or is null), an exit of a failed cell; bad input here."""
    if package == "_global_":  # Hydra's name for the whole config
        return
    first = package.split(".")[0]
    cfg = hydra.compose_config(config_name="config", overrides=overrides, run_mode=RunMode.RUN)
    hidden = (
        (first == "hydra") if shows == "job" else (first != "hydra") if shows == "hydra" else False
    )
    hidden = hidden or (
        shows == "hydra" and package.split(".")[:2] in (["hydra", "help"], ["hydra", "hydra_help"])
    )
    if hidden or OmegaConf.select(cfg, package, throw_on_resolution_failure=False) is None:
        raise ConfigError(
            f"--package={shown(package)} is invalid: no such key (or it is null) in "
            f"the config --cfg {shows} shows; allowed: a key of it, e.g. run, "
            f"dataset.name"
        )


def _check_rerun_file(path: str) -> None:
    """--experimental-rerun FILE (Hydra's) runs the config pickled in FILE, a run's
    `.hydra/config.pickle`; anything else is bad input (Hydra raises ValueError, OSError or an
    unpickling error, an error of the command). Hydra unpickles the file again to run it."""
    import pickle

    wanted = "allowed: a run's .hydra/config.pickle"
    try:
        with open(path, "rb") as stream:
            config = pickle.load(stream)  # the user's own file, as Hydra reads it
    except OSError as err:
        raise ConfigError(
            f"--experimental-rerun={shown(path)} is invalid: {err.strerror or err}; {wanted}"
        ) from None
    except Exception as err:  # noqa: BLE001 - whatever a file that is no pickle raises
        raise ConfigError(
            f"--experimental-rerun={shown(path)} is invalid: not a pickled "
            f"config ({type(err).__name__}); {wanted}"
        ) from None
    if not isinstance(config, DictConfig) or "hydra" not in config:
        raise ConfigError(
            f"--experimental-rerun={shown(path)} is invalid: not a run's config; {wanted}"
        )


def _check_shell_completion(overrides: Sequence[str]) -> None:
    """--shell-completion (Hydra's) needs one of install=SHELL, uninstall=SHELL or
    query=SHELL, for a SHELL Hydra has a plugin for; Hydra raises ValueError otherwise, and
    KeyError for a query outside the shell's completion (no COMP_LINE)."""
    from hydra.core.plugins import Plugins
    from hydra.plugins.completion_plugin import CompletionPlugin

    shells = sorted(
        {
            plugin.provides()
            for plugin in Plugins.instance().discover(CompletionPlugin)
            if issubclass(plugin, CompletionPlugin)
        }
    )
    arguments = OmegaConf.from_dotlist(list(overrides))
    given = [key for key in ("install", "uninstall", "query") if key in arguments]
    if len(given) != 1 or str(arguments[given[0]]) not in shells:
        raise ConfigError(
            f"--shell-completion {' '.join(overrides)} is invalid: allowed: one "
            f"of install=SHELL, uninstall=SHELL, query=SHELL with SHELL one of "
            f"{', '.join(shells)}"
        )
    if given == ["query"] and "COMP_LINE" not in os.environ:  # Hydra's KeyError otherwise
        raise ConfigError(
            f"--shell-completion {' '.join(overrides)} is invalid without the "
            f"COMP_LINE the shell sets when it completes (the command line so "
            f"far); allowed: install=SHELL, which makes TAB call query=SHELL"
        )


def _check_sweep(hydra: Hydra, overrides: list[str]) -> None:
    """Every cell of the sweep, as Hydra's basic sweeper lists them and the launcher prepares
    them (its sizing included)."""
    from launchers import cells

    master, job_overrides = _sweep_cells(hydra, overrides)
    check_launcher(master.hydra, sweep=True)
    if job_overrides is None:
        return  # another sweeper lists its cells its own way; the launcher checks them
    cells.prepare_sweep(
        hydra.config_loader, master, job_overrides, 0, size_cell=cells.cell_sizer(master)
    )
    check_hydra_dir(master.hydra, sweep=True)  # after the cells: their run.output_dir first
    claim_output_root(master.run.output_dir)  # last: held until this sweep's process ends


def _sweep_cells(hydra: Hydra, overrides: list[str]) -> tuple[DictConfig, list[list[str]] | None]:
    """The sweep's master config, and every cell's overrides in the order Hydra's basic
    sweeper runs them (None for another sweeper)."""
    master = hydra.compose_config(
        config_name="config", overrides=overrides, run_mode=RunMode.MULTIRUN
    )
    if not str(master.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return master, None
    # BasicSweeper.sweep: its `params` (a sweep file's grid), then the command line's.
    params = master.hydra.sweeper.get("params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()]
    task = OmegaConf.to_container(master.hydra.overrides.task, resolve=False)
    assert isinstance(task, list)  # Hydra's task overrides: a list of "key=value" strings
    arguments += [str(argument) for argument in task]
    parsed = OverridesParser.create(config_loader=hydra.config_loader).parse_overrides(arguments)
    return master, [cell for batch in BasicSweeper.split_arguments(parsed, None) for cell in batch]


def _dry_run(hydra: Hydra, overrides: list[str], *, sweep: bool, command: str) -> NoReturn:
    """List the cells `command` would run (`harness.commands.dryrun`), composed and
    validated as above, and exit with status 0. What would stop a valid cell where it would
    run is listed with it, not raised: that is what a dry run of a cluster's grid is for."""
    # Imported where cells are composed: a TAB of the shell completion needs none of it.
    from launchers import cell_pool, cells
    from launchers.swapped_groups import SwappedGroups

    if sweep:
        master, job_overrides = _sweep_cells(hydra, overrides)
        if job_overrides is None:
            raise ConfigError(
                f"{DRY_RUN_FLAG} is invalid with hydra/sweeper="
                f"{master.hydra.runtime.choices.get('hydra/sweeper')}: it lists "
                f"the cells of Hydra's basic sweeper only"
            )
        size_cell = cells.cell_sizer(master)
    else:
        master = hydra.compose_config(
            config_name="config", overrides=overrides, run_mode=RunMode.RUN
        )
        job_overrides, size_cell = [overrides], cells.single_node_workers
    try:
        check_launcher(master.hydra, sweep=sweep)
        launcher_error = None
    except ConfigError as err:  # e.g. SLURM's sbatch missing here: the cells are listed still
        launcher_error = " ".join(str(err).split())

    # A sweep's cells from a few of Hydra's compositions (launchers.swapped_groups), each
    # equal to the cell Hydra composes for its launcher but for Hydra's own node
    composer = SwappedGroups.of_sweep(hydra.config_loader, master) if sweep else None

    def plan_one(number: int, cell_overrides: list[str]) -> dryrun.PlannedCell:
        config = master if composer is None else composer.compose(cell_overrides)
        return dryrun.plan_cell(number, config, master.hydra, size_cell, launcher_error)

    def plan_here(number: int, cell_overrides: list[str]) -> dryrun.PlannedCell:
        with exit_on_bad_input(f"in sweep cell {' '.join(cell_overrides)}" if sweep else ""):
            return plan_one(number, cell_overrides)
        raise AssertionError("unreachable")  # for type checkers: the block returns or exits

    with cells_not_kept():  # composed once each: nothing composes them again
        # on every core (launchers.cell_pool), the cells composed from the same base together
        planned = cell_pool.plan_cells(
            job_overrides,
            plan_one,
            plan_here,
            desc="composing cells",
            shares=None if composer is None else composer.common_part,
        )
    print(
        dryrun.report(
            command,
            str(master.hydra.runtime.choices.get("hydra/launcher")),
            planned,
            dryrun.predict(planned),
        ),
        flush=True,
    )
    raise SystemExit(0)


def _refuse_dry_run_with(args, flags: str) -> None:  # noqa: ANN001 - argparse's Namespace
    if args.dry_run:
        raise ConfigError(
            f"{DRY_RUN_FLAG} is invalid with {flags}: it lists the cells of a "
            f"run or sweep; allowed: {DRY_RUN_FLAG} with overrides only"
        )
