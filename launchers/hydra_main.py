"""What `python -m harness` (a `@hydra.main` program) does around Hydra: its command line checked
before Hydra runs, every cell of a sweep as its launcher will prepare it, and the cells'
outcome as the exit status.

Hydra creates the run or sweep directory, and the sweep's MLflow parent run, before the task
function or the launcher sees the config; bad input must be refused before that, with one line
and exit status 2 (`harness.cli`). Checking a sweep is preparing its cells as the launchers do
(`launchers.cells.prepare_sweep`), so this lives with them, above the core: composing one config
is `harness.compose.compose_config`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from hydra import initialize_config_module
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness import dryrun
from harness.cli import (
    ArgumentParser,
    end_like_ctrl_c_on_sigterm,
    exit_on_bad_input,
    exit_on_failed_cells,
    forget_cell_results,
)
from harness.compose import CONFIG_MODULE
from harness.config import ConfigError, validate
from harness.distributions.registry import register_configs
from harness.dryrun import DRY_RUN_FLAG
from harness.preflight import check_hydra_dir, check_launcher, check_runs_here
from launchers import cells
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
    before = os.environ.get(_HYDRA_FULL_ERROR)
    if before == "1":
        if DRY_RUN_FLAG in sys.argv[1:]:  # a flag of ours, not Hydra's: list the cells, exit
            check_hydra_main(sys.argv[1:])
        main()
    else:
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
    exit_on_failed_cells()


def check_hydra_main(argv: Sequence[str]) -> None:
    """Compose and check what `python -m harness argv` is about to run, before Hydra writes
    anything (it creates the run or sweep directory, and the sweep's MLflow parent run, before
    the task function or the launcher sees the config); raise ConfigError or Hydra's error on
    bad input. A single run: its config, and what it needs of this machine. A sweep: every
    cell, as its launcher will compose, validate and size it (`launchers.cells.prepare_sweep`,
    which exits with status 2 on the first bad one). Commands that run nothing (--help, --cfg,
    --info, ...) and another config directory or name are left to Hydra; `--cfg` of a sweep
    first says on stderr that it shows the base config. With `--dry-run` the same cells are
    listed instead, and the process exits with status 0 (`harness.dryrun`)."""
    parser = get_args_parser()
    parser.error = ArgumentParser.error.__get__(parser)  # type: ignore[method-assign]
    # `distbench` (the console command) or `python -m harness`, named as Hydra names it
    parser.prog = "python -m harness" if sys.argv[0].endswith(".py") else Path(sys.argv[0]).name
    # Wherever it is typed: argparse takes no flag after the overrides have begun.
    dry_run = DRY_RUN_FLAG in argv
    args = parser.parse_args([argument for argument in argv if argument != DRY_RUN_FLAG])
    args.dry_run = dry_run
    if (args.help or args.hydra_help or args.info or args.shell_completion
            or args.config_path or args.config_name or args.config_dir
            or args.experimental_rerun):
        _refuse_dry_run_with(args, "--help, --info, --config-*, --experimental-rerun")
        return
    register_configs()
    overrides = list(args.overrides)
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        mode = hydra.get_mode(config_name="config", overrides=overrides)
        sweep = args.multirun or mode == RunMode.MULTIRUN
        if args.cfg:
            _refuse_dry_run_with(args, "--cfg")
            if sweep and args.cfg != "hydra":  # Hydra prints the config before the sweep
                print(f"distbench: --cfg {args.cfg} shows the sweep's base config, without "
                      f"any cell's overrides; {DRY_RUN_FLAG} lists the cells", file=sys.stderr,
                      flush=True)
            return
        if args.dry_run:
            _dry_run(hydra, overrides, sweep=sweep,
                     command=parser.prog + (" -m" if args.multirun else ""))
        if sweep:
            _check_sweep(hydra, overrides)
        else:
            cfg = hydra.compose_config(config_name="config", overrides=overrides,
                                       run_mode=RunMode.RUN)
            config = validate(cfg)
            check_launcher(cfg.hydra, sweep=False)
            check_runs_here(config)
            check_hydra_dir(cfg.hydra, sweep=False)
            if config.world_size > 1:  # its workers start here, on this one machine
                cells.single_node_workers(config)


def _check_sweep(hydra, overrides: list[str]) -> None:  # noqa: ANN001 - Hydra's internal class
    """Every cell of the sweep, as Hydra's basic sweeper lists them and the launcher prepares
    them (its sizing included)."""
    master, job_overrides = _sweep_cells(hydra, overrides)
    check_launcher(master.hydra, sweep=True)
    if job_overrides is None:
        return  # another sweeper lists its cells its own way; the launcher checks them
    cells.prepare_sweep(hydra.config_loader, master, job_overrides, 0,
                        size_cell=cells.cell_sizer(master))
    check_hydra_dir(master.hydra, sweep=True)  # after the cells: their run.output_dir first
    claim_output_root(master.run.output_dir)  # last: held until this sweep's process ends


def _sweep_cells(hydra, overrides: list[str]  # noqa: ANN001 - Hydra's internal class
                 ) -> tuple[DictConfig, list[list[str]] | None]:
    """The sweep's master config, and every cell's overrides in the order Hydra's basic
    sweeper runs them (None for another sweeper)."""
    master = hydra.compose_config(config_name="config", overrides=overrides,
                                  run_mode=RunMode.MULTIRUN)
    if not str(master.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return master, None
    # BasicSweeper.sweep: its `params` (a sweep file's grid), then the command line's.
    params = master.hydra.sweeper.get("params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()]
    task = OmegaConf.to_container(master.hydra.overrides.task, resolve=False)
    assert isinstance(task, list)  # Hydra's task overrides: a list of "key=value" strings
    arguments += [str(argument) for argument in task]
    parsed = OverridesParser.create(config_loader=hydra.config_loader).parse_overrides(arguments)
    return master, [cell for batch in BasicSweeper.split_arguments(parsed, None)
                    for cell in batch]


def _dry_run(hydra, overrides: list[str], *, sweep: bool,  # noqa: ANN001 - Hydra's class
             command: str) -> NoReturn:
    """List the cells `command overrides` would run (`harness.dryrun`), composed and
    validated as above, and exit with status 0. What would stop a valid cell where it would
    run is listed with it, not raised: that is what a dry run of a cluster's grid is for."""
    if sweep:
        master, job_overrides = _sweep_cells(hydra, overrides)
        if job_overrides is None:
            raise ConfigError(f"{DRY_RUN_FLAG} is invalid with hydra/sweeper="
                              f"{master.hydra.runtime.choices.get('hydra/sweeper')}: it lists "
                              f"the cells of Hydra's basic sweeper only")
        size_cell = cells.cell_sizer(master)
    else:
        master = hydra.compose_config(config_name="config", overrides=overrides,
                                      run_mode=RunMode.RUN)
        job_overrides, size_cell = [overrides], cells.single_node_workers
    try:
        check_launcher(master.hydra, sweep=sweep)
        launcher_error = None
    except ConfigError as err:  # e.g. SLURM's sbatch missing here: the cells are listed still
        launcher_error = " ".join(str(err).split())
    planned = []
    for number, cell_overrides in enumerate(dryrun.composing(job_overrides)):
        with exit_on_bad_input(f"in sweep cell {' '.join(cell_overrides)}" if sweep else ""):
            config = (cells.cell_config(hydra.config_loader, master, cell_overrides, number)
                      if sweep else master)
            planned.append(dryrun.plan_cell(number, config, master.hydra, size_cell,
                                            launcher_error))
    print(dryrun.report(f"{command} {' '.join(overrides)}".rstrip(),
                        str(master.hydra.runtime.choices.get("hydra/launcher")), planned,
                        dryrun.predict(planned)), flush=True)
    raise SystemExit(0)


def _refuse_dry_run_with(args, flags: str) -> None:  # noqa: ANN001 - argparse's Namespace
    if args.dry_run:
        raise ConfigError(f"{DRY_RUN_FLAG} is invalid with {flags}: it lists the cells of a "
                          f"run or sweep; allowed: {DRY_RUN_FLAG} with overrides only")
