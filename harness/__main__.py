"""`python -m harness [overrides]`: measure one grid cell; `+sweep=NAME` measures a grid."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness.cli.cell_results import noted
from harness.cli.errors import one_door
from harness.commands.compose import CONFIG_PATH
from harness.distributions.registry import register_configs
from harness.records.cell import check_cell
from launchers.hydra_main import run_hydra_main

with one_door():  # a model another package registered that cannot be loaded: one line, exit 2
    register_configs()


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    # The worker's modules (and torch) load below, in the process that trains the cell:
    # --help, shell completion, bad input and the launcher of a multi-worker cell go without.
    from harness.system.worker_env import worker_environment

    cell = check_cell(cfg)  # bad input: one line, exit status 2 (run_hydra_main below)
    config = cell.config
    if config.world_size > 1 and not worker_environment().is_distributed:
        # A multi-worker cell typed at the prompt: start its workers locally.
        from launchers.cells import single_node_workers
        from launchers.local import GRACE_AFTER_RESULT_S, run_local_cell

        hydra_config = HydraConfig.get()
        return noted(
            run_local_cell(
                cfg,
                Path(hydra_config.runtime.output_dir),
                workers=single_node_workers(config),
                timeout_min=int(hydra_config.launcher.timeout_min),
                grace_s=float(
                    hydra_config.launcher.get("grace_after_result_s", GRACE_AFTER_RESULT_S)
                ),
            )
        )
    if worker_environment().job_id == "local":  # typed at the prompt, no launcher to say it
        # The imports and the builds below take seconds (15 on a loaded machine) before the
        # cell logs anything of its own: say at once that it started, and where.
        print(
            f"[distbench] {config.run_name}: starting in {HydraConfig.get().runtime.output_dir} "
            f"(torch, the network and its data load first)",
            flush=True,
        )
    from harness.worker.run import run_cell  # this process is the cell's only worker

    result = noted(run_cell(cell))  # a cell that did not end ok: exit status 1 (harness.cli)
    if result.get("storage_error"):
        sys.exit(1)  # its one line is printed: where the record went instead of its directory
    return result


def cli() -> None:
    """The `distbench` console command: `python -m harness` under its own name, which bash can
    complete (`eval "$(distbench -sc install=bash)"`; it cannot complete `python -m`). Any
    exception that escapes leaves as one line (harness.cli.errors.one_door)."""
    with one_door():
        run_hydra_main(main)


if __name__ == "__main__":
    cli()
