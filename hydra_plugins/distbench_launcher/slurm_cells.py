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

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher


@dataclass
class SlurmCellsConf(SlurmQueueConf):
    """SLURM settings of a sweep. Every key of Hydra's submitit SLURM launcher is accepted
    (partition, account, qos, mem_gb, cpus_per_task, constraint, gres, setup, ...);
    `additional_parameters` takes any other sbatch flag, e.g. {reservation: r1}."""

    _target_: str = "hydra_plugins.distbench_launcher.slurm_cells.SlurmCellsLauncher"
    # null: sized per cell (hardware.nodes x hardware.workers_per_node, one task for the
    # sequential baseline). A value given here must match every cell: it is a check.
    nodes: Optional[int] = None
    tasks_per_node: Optional[int] = None
    # null: one GPU per task on CUDA hardware, none on CPU hardware.
    gpus_per_node: Optional[int] = None
    # Wall-clock limit of one cell's job in minutes (sbatch --time); a job SLURM ends for it is
    # recorded as `timeout`.
    timeout_min: int = 120
    # Job name. With one_cell_at_a_time all cells share it, which is what SLURM's singleton
    # dependency keys on.
    name: str = "distbench-${tracking.experiment}"
    # Whole nodes per cell (sbatch --exclusive): nothing else runs beside a measured cell.
    exclusive: bool = True
    # Cells start one after another (sbatch --dependency=singleton). Turn off on a cluster
    # whose nodes are distinct machines, to run cells on different nodes at the same time.
    one_cell_at_a_time: bool = True
    # A job still running this long after its rank 0 recorded the cell is cancelled.
    grace_after_result_s: float = 20.0
    # Extra arguments of the srun line that starts the workers.
    srun_args: Optional[List[str]] = None
    # Run every cell, also those that already have a result with status ok under run.output_dir
    # (by default a re-run sweep skips them: see harness.resume), and cancel the cells' earlier
    # jobs still queued or running (by default a re-run follows them: launchers.slurm_resume).
    force: bool = False


ConfigStore.instance().store(group="hydra/launcher", name="slurm_cells", node=SlurmCellsConf,
                             provider="distbench")


class SlurmCellsLauncher(SlurmLauncher):
    """Submit every cell as its own SLURM job, then follow them until all have ended."""

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra.core.singleton import Singleton
        from tqdm import tqdm

        from harness.resume import cell_key
        from harness.run import now
        from harness.tracking import sweep_parent_run
        from launchers import cells, slurm, slurm_resume

        assert self.config is not None and self.hydra_context is not None
        prepared = cells.prepare_sweep(
            self.hydra_context.config_loader, self.config, job_overrides, initial_job_idx,
            size_cell=lambda cell: slurm.cell_job_size(cell, self.params))
        force = bool(self.params["force"])
        done = cells.finished_earlier(prepared, force=force)
        earlier = slurm_resume.take_over_earlier_jobs(prepared, done, force=force)
        done.update(earlier.finished)
        # Cells whose earlier job still runs are followed, not submitted again.
        followed = sorted(earlier.following)
        submitted = [earlier.following[index] for index in followed]
        positions = list(followed)  # each followed or submitted cell's position in `prepared`
        # The sweep's MLflow parent run, only once every cell is valid and some cell runs
        # (cells followed from an earlier sweep included); its id reaches the jobs it submits.
        with sweep_parent_run(self.config, cells_to_run=len(prepared) - len(done)):
            started = now()
            for index, cell in enumerate(prepared):
                if index in done or index in earlier.following:
                    continue
                job = slurm.submit_cell(
                    self, cell.overrides, "hydra.sweep.dir", cell.job_num,
                    f"job_id_for_{cell.job_num}", Singleton.get_state(),
                    folder=Path(self.params["submitit_folder"]),
                    parameters=slurm.executor_parameters(cell.size, self.params, cell.cell))
                # Noted before it is announced: a re-run after this process dies must find it.
                slurm.write_job_note(cell.cell.run.output_dir, cell_key(cell.config), slurm.JobNote(
                    job_id=job.job_id, folder=str(Path(self.params["submitit_folder"]).absolute()),
                    output_dir=str(cell.output_dir.absolute()), tasks=cell.size.tasks,
                    submitted_at=now()))
                print(f"[distbench] cell {cell.job_num} ({cell.cell.run_name}): SLURM job "
                      f"{job.job_id}, {cell.size.nodes} node(s) x {cell.size.tasks_per_node} "
                      f"task(s), in {cell.output_dir}", flush=True)
                submitted.append(slurm.SubmittedCell(job, cell.output_dir, cell.size.tasks))
                positions.append(index)

            results: dict[int, dict] = dict(done)
            job_ids = {index: "skipped" for index in done}
            with tqdm(total=len(submitted), desc="sweep", unit="cell") as bar:
                def record(ended: slurm.SubmittedCell) -> None:
                    index = positions[submitted.index(ended)]
                    job_ids[index] = ended.job.job_id
                    logs = f"SLURM job {ended.job.job_id} ended {ended.state}\n" + \
                        cells.worker_logs_tail(ended.job, ended.tasks)
                    results[index] = cells.cell_outcome(
                        prepared[index].config, ended.output_dir,
                        ended_as=slurm.status_of_state(ended.state), logs=logs, started=started)
                    bar.update()

                slurm.wait_for_cells(submitted, grace_s=float(self.params["grace_after_result_s"]),
                                     on_end=record)
        return cells.sweep_returns(prepared, [results[i] for i in range(len(prepared))],
                                   [job_ids[i] for i in range(len(prepared))])
