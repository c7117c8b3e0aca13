"""What a launcher does around the cells of a sweep.

Before the first cell starts, every cell's config is composed and validated, so a typo in the
grid fails the sweep at once instead of hours later. A cell whose process died without
recording itself (killed, timed out, crashed in native code) is recorded here, by the
launching process, so that the sweep's record has every cell.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, open_dict

from harness.config import ConfigError, register_configs, validate
from harness.results import RunStatus
from harness.run import now, record_failure


def cell_config(loader, master: DictConfig, overrides: Sequence[str],  # noqa: ANN001
                job_num: int) -> DictConfig:
    """The composed config of one cell, as the cell's own process will see it."""
    config = loader.load_sweep_config(master, list(overrides))
    with open_dict(config.hydra.job):
        config.hydra.job.num = job_num
    return config


def validate_sweep(loader, master: DictConfig,  # noqa: ANN001
                   job_overrides: Sequence[Sequence[str]]) -> None:
    """Validate every cell; on the first invalid one, print one line and exit with status 2."""
    register_configs()
    for job_num, overrides in enumerate(job_overrides):
        try:
            validate(cell_config(loader, master, overrides, job_num))
        except ConfigError as err:
            print(f"distbench: invalid config in sweep cell {' '.join(overrides)}: {err}",
                  file=sys.stderr)
            sys.exit(2)


def record_lost_cell(loader, master: DictConfig, overrides: Sequence[str],  # noqa: ANN001
                     job_num: int, error: BaseException, *, timed_out: bool,
                     started: str) -> JobReturn:
    """Record a cell that ended without a result; return it as a completed Hydra job."""
    config = cell_config(loader, master, overrides, job_num)
    output_dir = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
    status = RunStatus.timeout if timed_out else RunStatus.failed
    cause = ("the cell exceeded hydra.launcher.timeout_min and was stopped" if timed_out else
             "the cell's process ended without a result: killed by a signal (the kernel's "
             "out-of-memory killer sends SIGKILL) or crashed outside Python")
    text = f"{cause}\n{type(error).__name__}: {error}"
    result = record_failure(config, output_dir, status, text, started=started)
    return JobReturn(overrides=list(overrides), cfg=config, working_dir=str(output_dir),
                     task_name=str(config.hydra.job.name), status=JobStatus.COMPLETED,
                     _return_value=result)


__all__ = ["cell_config", "now", "record_lost_cell", "validate_sweep"]


def summary_table(results: Sequence[dict]) -> str:
    """A plain-text table of a sweep's cells, printed when the sweep ends."""
    header = f"{'#':>3}  {'cell':<44} {'status':<8} {'s/epoch':>9} {'std':>7} " \
             f"{'images/s':>9} {'peak MB':>8}"
    rows = [header]
    for number, result in enumerate(results):
        metrics = result.get("metrics", {})
        figures = (f"{metrics['seconds_per_epoch']:>9.3f} {metrics['seconds_per_epoch_std']:>7.3f} "
                   f"{metrics['images_per_second']:>9.1f} {metrics['peak_memory_mb']:>8.0f}"
                   if metrics else f"{'-':>9} {'-':>7} {'-':>9} {'-':>8}")
        rows.append(f"{number:>3}  {result['run_name']:<44} {result['status']:<8} {figures}")
    return "\n".join(rows)
