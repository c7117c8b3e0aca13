"""`hydra/launcher=serial_local`: a sweep's cells one at a time, each in a fresh process.

Hydra's submitit local launcher starts every cell of a sweep at once; on shared hardware their
timings then measure each other. This launcher reuses it but submits one cell at a time and
waits for it, so each cell has the machine to itself, gets a fresh process (its own peak memory,
no state left by the previous cell) and cannot take the sweep down when it dies.

Hydra only instantiates launchers defined in the `hydra_plugins` namespace, so the class lives
here; what it does around a cell is in `launchers.cells`. Keep imports light: Hydra imports this
module on every start-up while scanning for plugins, and executes it before registering it in
sys.modules, which is why it must not use `from __future__ import annotations` (dataclasses
then fail to resolve their string annotations).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn

from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher


@dataclass
class SerialLocalConf(LocalQueueConf):
    _target_: str = "hydra_plugins.distbench_launcher.serial_local.SerialLocalLauncher"
    # Wall-clock limit of one cell in minutes; a cell that exceeds it is recorded as `timeout`.
    timeout_min: int = 120
    # Run every cell, also those that already have a result with status ok under run.output_dir
    # (by default a re-run sweep skips them: see harness.records.resume).
    force: bool = False
    # Run again the cells that finished ok but were measured while the machine was unsteady
    # (harness.measure.steadiness; the summary table marks them '~'); the others are still skipped.
    remeasure_unsteady: bool = False
    # Run again this many of the cells that finished ok, chosen at random (seeded by
    # remeasure_seed): their two runs measure the noise between runs on cells nobody chose for
    # being noisy (harness.analysis.noise; launchers.cells.remeasured_at_random).
    remeasure_sample: int = 0
    remeasure_seed: int = 0
    # Measure every cell in this many runs, one pass over the sweep after another (its runs a
    # pass's minutes apart, not back to back), each pass in the sweep's order: the analysis
    # takes a cell's median run and measures the noise between runs on every cell. A re-run
    # counts each cell's runs that finished ok and makes only the ones it lacks
    # (launchers.cells.runs_to_make).
    passes: int = 1
    # After a cell's rank 0 has recorded it (or exited), how many seconds its other workers
    # may take to exit by themselves before they are ended (a frozen peer must not hold the
    # sweep): the same key as the SLURM launcher's.
    grace_after_result_s: float = 20.0


ConfigStore.instance().store(
    group="hydra/launcher", name="serial_local", node=SerialLocalConf, provider="distbench"
)


class SerialLocalLauncher(LocalLauncher):
    """Submitit's local launcher, one cell at a time, every cell recorded whatever happens.

    A cell gets as many worker processes as its config asks for (`DistbenchConfig.world_size`);
    each runs this launcher's `__call__` (inherited: it composes the cell's config and runs the
    task function) and learns its rank from submitit's environment. What the cell's rank 0
    prints shows on the sweep's terminal while it runs (`launchers.local.Rank0Terminal`).
    """

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204 - Hydra's signature
        """A worker of a cell (in the cell's own process): it ends when the sweep is gone."""
        from launchers.local import follow_launcher

        follow_launcher()
        return super().__call__(*args, **kwargs)

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from hydra.core.singleton import Singleton

        from launchers import cells
        from launchers.local import run_cell_job

        assert self.config is not None and self.hydra_context is not None
        prepared = cells.prepare_sweep(
            self.hydra_context.config_loader,
            self.config,
            job_overrides,
            initial_job_idx,
            size_cell=cells.single_node_workers,
        )
        reuse = cells.reuse_asked(self.params)
        done, _ = cells.finished_earlier(prepared, **reuse)
        runs = cells.runs_to_make(prepared, done, passes=reuse["passes"], force=reuse["force"])
        timeout_min = int(self.params["timeout_min"])
        # Each cell's latest outcome (reused, or the last run made), by position in `prepared`.
        results: dict[int, dict] = dict(done)
        job_ids = {index: "skipped" for index in done}
        with cells.running_sweep(self.config, runs, results.values()) as bar:
            for number, indices in cells.each_pass(runs, reuse["passes"]):
                for index in indices:
                    cell = cells.in_pass(prepared[index], number)

                    def keep_interrupted(outcome: dict, index: int = index) -> None:
                        results[index] = outcome  # counted by the sweep's parent run

                    outcome, job = run_cell_job(
                        self,
                        cell.overrides,
                        "hydra.sweep.dir",
                        cell.job_num,
                        f"job_id_for_{cell.job_num}",
                        Singleton.get_state(),
                        config=cell.config,
                        output_dir=cell.output_dir,
                        folder=Path(self.params["submitit_folder"]),
                        workers=cell.size,
                        timeout_min=timeout_min,
                        grace_s=float(self.params["grace_after_result_s"]),
                        name=str(cell.config.hydra.job.name),
                        label=f"cell {cell.job_num} ({cell.cell.run_name})",
                        keep_interrupted=keep_interrupted,
                    )
                    results[index] = outcome
                    job_ids[index] = job.job_id
                    bar.update()
        return cells.sweep_returns(
            prepared,
            [results[i] for i in range(len(prepared))],
            [job_ids[i] for i in range(len(prepared))],
        )
