"""What a launcher does around the cells of a sweep.

Before the first cell starts, every cell's config is composed and validated, so a typo in the
grid fails the sweep at once instead of hours later. After a cell, its record is what rank 0
wrote; a cell that ended without one (killed, timed out, crashed outside Python) is recorded
here, from the reports its workers left, so that the sweep's record has every cell.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from harness.config import ConfigError, DistbenchConfig, validate
from harness.results import RESULT_FILE, RunStatus, read_rank_reports, read_result
from harness.run import record_failure

_CAUSES = {
    RunStatus.timeout: "the cell made no progress within run.progress_timeout_s, or exceeded "
                       "hydra.launcher.timeout_min, and was ended",
    RunStatus.failed: "the cell ended without a result: a worker was killed by a signal (the "
                      "kernel's out-of-memory killer sends SIGKILL) or crashed outside Python",
}


def cell_config(loader, master: DictConfig, overrides: Sequence[str],  # noqa: ANN001
                job_num: int) -> DictConfig:
    """The composed config of one cell, as the cell's own processes will see it."""
    config = loader.load_sweep_config(master, list(overrides))
    with open_dict(config.hydra.job):
        config.hydra.job.num = job_num
    return config


def cell_dir(config: DictConfig) -> Path:
    return Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)


def validate_cell(config: DictConfig, *, single_node: bool) -> DistbenchConfig:
    """Validate one cell; a launcher that runs on one machine also checks the node count."""
    cell = validate(config)
    if single_node and cell.world_size > cell.hardware.workers_per_node:
        raise ConfigError(
            f"hardware.nodes={cell.hardware.nodes} is invalid here: this launcher runs on one "
            f"machine; allowed: 1, or a multi-node launcher")
    return cell


def validate_sweep(loader, master: DictConfig,  # noqa: ANN001
                   job_overrides: Sequence[Sequence[str]], *, single_node: bool) -> None:
    """Validate every cell; on the first invalid one, print one line and exit with status 2."""
    for job_num, overrides in enumerate(job_overrides):
        try:
            validate_cell(cell_config(loader, master, overrides, job_num),
                          single_node=single_node)
        except ConfigError as err:
            print(f"distbench: invalid config in sweep cell {' '.join(overrides)}: {err}",
                  file=sys.stderr)
            sys.exit(2)


def cell_outcome(config: DictConfig, output_dir: Path, *, timed_out: bool, logs: str,
                 started: str) -> dict[str, Any]:
    """The cell's result: what rank 0 recorded, or else a record made from what is left."""
    if (output_dir / RESULT_FILE).exists():
        return read_result(output_dir)
    reports = read_rank_reports(output_dir)
    statuses = {RunStatus(report["status"]) for report in reports.values()}
    status = RunStatus.timeout if timed_out or RunStatus.timeout in statuses else \
        RunStatus.oom if RunStatus.oom in statuses else RunStatus.failed
    lines = [_CAUSES.get(status, "the cell ended without a result")]
    lines += [f"--- rank {rank}: {r['status']}\n{r['error']}" for rank, r in sorted(reports.items())]
    lines.append(logs)
    return record_failure(config, output_dir, status, "\n".join(lines), started=started)


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
