"""`hydra/launcher=submitit_slurm`: a sweep's cells as SLURM jobs, each sized from its config.

Hydra's own submitit SLURM launcher submits a sweep as one job array in which every cell gets
the same allocation (`hydra.launcher.nodes`, `tasks_per_node`), runs cells side by side on
shared nodes, and learns of a job that died without a result only through `sacct`. This one
reuses its per-task entry point (`__call__`: compose the cell's config, run the task function)
and submits each cell as its own job, sized from the cell's hardware, on exclusive nodes, one
cell after another by default; what it does around the jobs lives in `launchers.slurm`.

As in `serial_local`, no `from __future__ import annotations` here: Hydra imports this module
while scanning for plugins, before it is in sys.modules, and dataclasses then cannot resolve
string annotations.
"""

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn

from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher


@dataclass
class SlurmCellsConf(SlurmQueueConf):
    """SLURM settings of a sweep. Every key of Hydra's submitit SLURM launcher is accepted,
    so a launcher config written for it works here (partition, account, qos, mem_gb,
    constraint, gres, setup, max_num_timeout, array_parallelism, wait_for_completion, ...);
    `additional_parameters` takes any other sbatch flag, e.g. {reservation: r1}. The sizing
    keys are checks against each cell's hardware config (launchers.slurm.check_sizing_keys)."""

    _target_: str = "hydra_plugins.distbench_launcher.slurm_cells.SlurmCellsLauncher"
    # null: sized per cell (hardware.nodes x hardware.workers_per_node, one task for the
    # sequential baseline). A value given here is a check: the cell's size, or its hardware
    # config's whole allocation.
    nodes: int | None = None
    tasks_per_node: int | None = None
    # null: one GPU per task on CUDA hardware, none on CPU hardware (a value: a check).
    gpus_per_node: int | None = None
    # null, or 1 on CUDA hardware: then the GPUs are asked per task (for cpus_per_gpu).
    gpus_per_task: int | None = None
    # Wall-clock limit of one try of a cell's job in minutes (sbatch --time); a job SLURM ends
    # for it on its last try is recorded as `timeout`.
    timeout_min: int = 120
    # Tries after the first for a job that reaches timeout_min: submitit re-queues it (SLURM
    # signals it signal_delay_s before its limit) and the cell runs again from the start.
    max_num_timeout: int = 0
    # Job name. Cells that may not run at the same time share it (SLURM's singleton
    # dependency keys on it); with array_parallelism > 1 it ends in -0, -1, ...
    name: str = "distbench-${tracking.experiment}"
    # Whole nodes per cell (sbatch --exclusive): nothing else runs beside a measured cell.
    exclusive: bool = True
    # Cells of the sweep that run at the same time, each on its own (exclusive) nodes.
    # 1: one after another, as a measurement on nodes that share hardware needs.
    array_parallelism: int = 1
    # false: no limit on cells at once (they start as nodes come free); true: the same as
    # array_parallelism=1; null: array_parallelism decides.
    one_cell_at_a_time: bool | None = None
    # Accepted for configs of Hydra's plugin; distbench always waits for the cells' jobs (it
    # records a cell whose job ended without a result, and ends workers that linger).
    wait_for_completion: bool = True
    # A job still running this long after its rank 0 recorded the cell is cancelled.
    grace_after_result_s: float = 20.0
    # A job that waits this long for nodes that cannot run it (down, drained: squeue's
    # ReqNodeNotAvail, NodeDown, ...) is cancelled and its cell recorded failed with the
    # reason; the sweep goes on and a re-run measures the cell again.
    unavailable_nodes_timeout_s: float = 600.0
    # Extra arguments of the srun line that starts the workers.
    srun_args: list[str] | None = None
    # Run every cell, also those that already have a result with status ok under run.output_dir
    # (by default a re-run sweep skips them: see harness.records.resume), and cancel the cells'
    # earlier jobs still queued or running (by default a re-run follows them:
    # launchers.slurm_resume).
    force: bool = False
    # Run again the cells that finished ok but were measured while the machine was unsteady
    # (harness.measure.steadiness; the summary table marks them '~'); the others are still skipped.
    remeasure_unsteady: bool = False
    # Run again this many of the cells that finished ok, chosen at random (seeded by
    # remeasure_seed): their two runs measure the noise between runs on cells nobody chose for
    # being noisy (harness.analysis.noise; launchers.cells.remeasured_at_random).
    remeasure_sample: int = 0
    remeasure_seed: int = 0
    # Measure every cell in this many runs, one pass over the sweep after another (each pass
    # submitted once the one before has ended): as the serial local launcher's.
    passes: int = 1


ConfigStore.instance().store(
    group="hydra/launcher", name="slurm_cells", node=SlurmCellsConf, provider="distbench"
)


class SlurmCellsLauncher(SlurmLauncher):
    """Submit every cell as its own SLURM job, then follow them until all have ended."""

    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
    ) -> JobReturn:
        """A task of a cell's job (runs on the cluster): the cell, as Hydra's plugin runs it.
        Its `checkpoint` (inherited) lets submitit re-queue a timed-out job; only the last
        try runs into the time limit itself."""
        from hydra_plugins.distbench_launcher.names import register_launcher_names
        from launchers import slurm

        # The plugin's __call__ restores Hydra's state (set_state), whose plugin scan stores
        # the plugin's own `submitit_slurm` config again; the cell's config is then composed
        # anew wherever the submitting process did not cache it (a launcher config found
        # through hydra.searchpath). Scan first and put distbench's names back: set_state
        # reuses this state's scanned Plugins, so the scan does not run again.
        Singleton.set_state(singleton_state)
        register_launcher_names()
        slurm.keep_last_try_to_its_limit(int(self.params["max_num_timeout"]))
        if slurm.tries_before() > 0:
            from launchers.cells import cell_config, cell_dir

            assert self.hydra_context is not None and self.config is not None
            slurm.forget_earlier_try(
                cell_dir(
                    cell_config(
                        self.hydra_context.config_loader, self.config, sweep_overrides, job_num
                    )
                )
            )
        return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from harness.records.sweep_summary import mark_reused
        from launchers import cells, slurm, slurm_resume

        assert self.config is not None and self.hydra_context is not None
        prepared = cells.prepare_sweep(
            self.hydra_context.config_loader,
            self.config,
            job_overrides,
            initial_job_idx,
            size_cell=lambda cell: slurm.cell_job_size(cell, self.params),
        )
        if not self.params["wait_for_completion"]:
            print(
                "[distbench] hydra.launcher.wait_for_completion=false is ignored: distbench "
                "waits for every cell's job (it records a cell that ends without a result "
                "and ends workers that linger)",
                file=sys.stderr,
                flush=True,
            )
        reuse = cells.reuse_asked(self.params)
        done, sampled = cells.finished_earlier(prepared, **reuse)
        # the cells chosen at random are measured again, not taken over from their earlier job
        earlier = slurm_resume.take_over_earlier_jobs(
            prepared,
            done.keys() | sampled,
            force=reuse["force"],
            remeasure_unsteady=reuse["remeasure_unsteady"],
        )
        done.update({index: mark_reused(result) for index, result in earlier.finished.items()})
        # A cell whose earlier job still runs is followed, not submitted again: that job is its
        # first run of the first pass.
        runs = cells.runs_to_make(prepared, done, passes=reuse["passes"], force=reuse["force"])
        results: dict[int, dict] = dict(done)  # by position in `prepared`, filled as cells end
        job_ids = {index: "skipped" for index in done}
        # Cells followed from an earlier sweep count among the runs; the sweep's parent run id
        # reaches the jobs it submits.
        with cells.running_sweep(self.config, runs, results.values()) as bar:
            for number, indices in cells.each_pass(runs, reuse["passes"]):
                self._run_pass(
                    prepared,
                    [(index, cells.in_pass(prepared[index], number)) for index in indices],
                    earlier.following if number == 1 else {},
                    results,
                    job_ids,
                    bar,
                )
        return cells.sweep_returns(
            prepared,
            [results[i] for i in range(len(prepared))],
            [job_ids[i] for i in range(len(prepared))],
        )

    def _run_pass(
        self,
        prepared: Sequence[Any],
        in_pass: list[tuple[int, Any]],
        followed: dict[int, Any],
        results: dict[int, dict],
        job_ids: dict[int, str],
        bar: Any,
    ) -> None:
        """One pass of the sweep (`launchers.cells.runs_to_make`): submit its cells (`in_pass`:
        position in `prepared`, the cell as `launchers.cells.in_pass` made it), follow instead
        those whose earlier job still runs (`followed`, by position), and wait until every one
        has ended, its outcome in `results` and its job in `job_ids` by position."""
        from harness.records.outcome import now
        from harness.records.resume import cell_key
        from launchers import cells, slurm

        positions = sorted(followed)  # each followed or submitted cell's position in `prepared`
        submitted = [followed[index] for index in positions]
        started = now()
        for index, cell in in_pass:
            if index in followed:
                continue
            job = slurm.submit_cell(
                self,
                cell.overrides,
                "hydra.sweep.dir",
                cell.job_num,
                f"job_id_for_{cell.job_num}",
                Singleton.get_state(),
                folder=Path(self.params["submitit_folder"]),
                parameters=slurm.executor_parameters(
                    cell.size, self.params, cell.cell, cell.job_num
                ),
                max_num_timeout=int(self.params["max_num_timeout"]),
            )
            # Noted before it is announced: a re-run after this process dies must find it.
            slurm.write_job_note(
                cell.cell.run.output_dir,
                cell_key(cell.config),
                slurm.JobNote(
                    job_id=job.job_id,
                    folder=str(Path(self.params["submitit_folder"]).absolute()),
                    output_dir=str(cell.output_dir.absolute()),
                    tasks=cell.size.tasks,
                    submitted_at=now(),
                ),
            )
            print(
                f"[distbench] cell {cell.job_num} ({cell.cell.run_name}): SLURM job "
                f"{job.job_id}, {cell.size.nodes} node(s) x {cell.size.tasks_per_node} "
                f"task(s), in {cell.output_dir}",
                flush=True,
            )
            submitted.append(slurm.SubmittedCell(job, cell.output_dir, cell.size.tasks))
            positions.append(index)

        def record(ended: slurm.SubmittedCell) -> None:
            index = positions[submitted.index(ended)]
            job_ids[index] = ended.job.job_id
            logs = f"SLURM job {ended.job.job_id} ended {ended.state}\n" + cells.worker_logs_tail(
                ended.job, ended.tasks
            )
            results[index] = cells.cell_outcome(
                prepared[index].config,
                ended.output_dir,
                ended_as=slurm.status_of_state(ended.state),
                logs=logs,
                started=started,
                cause=ended.never_started or slurm.cause_of_state(ended.state),
            )
            bar.update()

        slurm.wait_for_cells(
            submitted,
            grace_s=float(self.params["grace_after_result_s"]),
            unavailable_limit_s=float(self.params["unavailable_nodes_timeout_s"]),
            on_end=record,
        )
