"""What a launcher does around the cells of a sweep.

Before the first cell starts, every cell's config is composed and validated, so a typo in the
grid fails the sweep at once instead of hours later. After a cell, its record is what rank 0
wrote; a cell that ended without one (killed, timed out, crashed outside Python) is recorded
here, from the reports its workers left, so that the sweep's record has every cell.
"""

from __future__ import annotations

import contextlib
import copy
import random
import re
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from omegaconf import DictConfig, OmegaConf, open_dict

from harness.cli.bad_input import exit_on_bad_input
from harness.cli.cell_results import failure_reason, note_cell_results
from harness.cli.preflight import (
    check_launcher,
    check_runs_here,
    check_writable_dir,
    is_slurm_launcher,
)
from harness.config.schema import ConfigError, DistbenchConfig, validate
from harness.measure.spread import STD_FOOTNOTE, std_column
from harness.measure.steadiness import UNSTEADY_FOOTNOTE, UNSTEADY_MARK, is_unsteady
from harness.records.cell import check_cell
from harness.records.mlflow_store import tracking_uri
from harness.records.outcome import record_failure, summarize_rank_reports
from harness.records.record import keep_logging_when_the_disk_fails
from harness.records.results import RESULT_FILE, RunStatus, read_rank_reports, read_result
from harness.records.resume import cell_key, finished_result, finished_runs
from harness.records.sweep_summary import SweepSummary, is_reused, mark_reused
from harness.records.tracking import result_recorded_for

if TYPE_CHECKING:  # the launchers that hold jobs import submitit; checking a sweep needs none
    import submitit

Size = TypeVar("Size")

_CAUSES = {
    RunStatus.timeout: "the cell made no progress within run.progress_timeout_s, or exceeded "
    "hydra.launcher.timeout_min, and was ended",
    RunStatus.oom: "the cell ended without a result: the scheduler ended it for exceeding its "
    "memory",
    RunStatus.failed: "the cell ended without a result: a worker was killed by a signal (the "
    "kernel's out-of-memory killer sends SIGKILL) or crashed outside Python",
}


def cell_config(
    loader,  # noqa: ANN001
    master: DictConfig,
    overrides: Sequence[str],
    job_num: int,
) -> DictConfig:
    """The composed config of one cell, as the cell's own processes will see it (composed once
    per process: `launchers.config_files`)."""
    config = loader.load_sweep_config(master, list(overrides))
    with open_dict(config.hydra.job):
        config.hydra.job.num = job_num
    return config


def cell_dir(config: DictConfig) -> Path:
    return Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)


def single_node_workers(cell: DistbenchConfig) -> int:
    """The worker count of a cell run on this one machine; more than one node is an error."""
    if cell.world_size > cell.hardware.workers_per_node:
        raise ConfigError(
            f"hardware.nodes={cell.hardware.nodes} is invalid here: this launcher runs on one "
            f"machine; allowed: 1, or hydra/launcher=submitit_slurm"
        )
    return cell.world_size


@dataclass(frozen=True)
class PreparedCell(Generic[Size]):
    """One cell of a sweep, composed, validated and sized for its launcher."""

    job_num: int
    overrides: list[str]
    config: DictConfig  # as the cell's own processes will see it
    cell: DistbenchConfig
    size: Size  # what the launcher needs to start it (a worker count, a SLURM allocation)

    @property
    def output_dir(self) -> Path:
        return cell_dir(self.config)


def prepare_sweep(
    loader,  # noqa: ANN001
    master: DictConfig,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    size_cell: Callable[[DistbenchConfig], Size],
) -> list[PreparedCell[Size]]:
    """Compose, validate and size every cell before any starts, and check what a cell needs
    of the machine that will run it (this one, for the local launcher); on the first invalid
    one, print one line naming it and exit with status 2. (`python -m harness` has done this
    once already, before Hydra wrote anything: `launchers.hydra_main.check_hydra_main`.)"""
    with exit_on_bad_input():
        check_launcher(master.hydra, sweep=True)
    runs_here = not is_slurm_launcher(master.hydra)
    keep_logging_when_the_disk_fails()  # the sweep's log file shares the cells' disk
    prepared = []
    for offset, overrides in enumerate(job_overrides):
        job_num = initial_job_idx + offset
        with exit_on_bad_input(f"in sweep cell {' '.join(overrides)}"):
            config = cell_config(loader, master, overrides, job_num)
            cell = validate(config)
            if runs_here:
                check_runs_here(cell)
            else:  # the cells run on the cluster's nodes; the records are written here
                check_writable_dir("run.output_dir", cell.run.output_dir)
            prepared.append(PreparedCell(job_num, list(overrides), config, cell, size_cell(cell)))
    return prepared


def cell_sizer(master: DictConfig) -> Callable[[DistbenchConfig], Any]:
    """How the sweep's launcher sizes a cell (`size_cell` of prepare_sweep), from its config."""
    if not is_slurm_launcher(master.hydra):
        return single_node_workers
    from launchers import slurm

    container = OmegaConf.to_container(master.hydra.launcher, resolve=True)
    assert isinstance(container, dict)
    params = {str(key): value for key, value in container.items() if key != "_target_"}
    return lambda cell: slurm.cell_job_size(cell, params)


def reuse_asked(launcher: Any) -> dict[str, Any]:
    """What the launcher's settings (`hydra.launcher.*`) ask of cells finished earlier: the
    keyword arguments of `finished_earlier`."""
    return {
        "force": bool(launcher["force"]),
        "remeasure_unsteady": bool(launcher.get("remeasure_unsteady", False)),
        "remeasure_sample": int(launcher.get("remeasure_sample", 0)),
        "remeasure_seed": int(launcher.get("remeasure_seed", 0)),
        "passes": int(launcher.get("passes", 1)),
    }


def finished_earlier(
    prepared: Sequence[PreparedCell[Any]],
    *,
    force: bool,
    remeasure_unsteady: bool = False,
    remeasure_sample: int = 0,
    remeasure_seed: int = 0,
    passes: int = 1,
) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """The results of the cells that already finished (status ok) in an earlier run of the same
    sweep, by position in `prepared`, marked as reused (`harness.records.sweep_summary`); those
    cells are skipped, and said so. With `force`, none: every cell runs again; with
    `remeasure_unsteady`, those measured while the machine was unsteady run again; with
    `remeasure_sample`, that many of the others chosen at random (`remeasured_at_random`),
    whose positions come second. With `passes`, a cell is finished once that many of its runs
    finished ok (`harness.records.resume.finished_runs`; `runs_to_make` schedules the rest)."""
    if force:
        return {}, set()
    done, unsteady, short = {}, 0, 0
    for index, cell in enumerate(prepared):
        result = finished_result(cell.cell.run.output_dir, cell_key(cell.config))
        if result is not None and remeasure_unsteady and is_unsteady(result.get("metrics", {})):
            unsteady += 1
            continue
        made = finished_runs(cell.cell.run.output_dir, cell_key(cell.config)) if passes > 1 else 1
        if result is not None and made >= passes:
            done[index] = mark_reused(result)
        elif 0 < made < passes:
            short += 1
    if short:  # an earlier run of the sweep stopped between its passes, or had fewer
        print(
            f"[distbench] {short} cell(s) measured earlier in fewer than {passes} runs that "
            f"finished ok: each makes the runs it lacks (hydra.launcher.passes={passes})",
            flush=True,
        )
    sampled = remeasured_at_random(prepared, done, remeasure_sample, remeasure_seed)
    upload_pending(prepared, done)
    if unsteady:
        print(
            f"[distbench] {unsteady} cell(s) measured earlier while the machine was unsteady "
            f"run again (hydra.launcher.remeasure_unsteady=true)",
            flush=True,
        )
    elif remeasure_unsteady and not done:
        # Asked on a sweep's first run, the setting has nothing to act on yet: say when it will.
        print(
            "[distbench] hydra.launcher.remeasure_unsteady=true: no cell of this sweep was "
            "measured earlier; the cells this run measures while the machine is unsteady "
            "('~' in the table) are measured again when the same command runs again",
            flush=True,
        )
    if done and len(done) == len(prepared):  # one line, not one per cell
        print(
            f"[distbench] {len(done)} cell(s) already measured, nothing to run; "
            f"hydra.launcher.force=true measures them again",
            flush=True,
        )
    elif done:
        for index, result in done.items():
            print(
                f"[distbench] cell {prepared[index].job_num} ({prepared[index].cell.run_name})"
                f": skipped, finished earlier: {result['output_dir']}",
                flush=True,
            )
        print(
            f"[distbench] {len(done)} of {len(prepared)} cells already finished; "
            f"hydra.launcher.force=true runs them again",
            flush=True,
        )
    return done, sampled


def runs_to_make(
    prepared: Sequence[PreparedCell[Any]], done: Collection[int], *, passes: int, force: bool
) -> list[tuple[int, int]]:
    """The runs a sweep of `passes` passes makes, in the order it makes them: (pass, position
    in `prepared`), pass after pass, each pass in the sweep's order, so that a cell's runs are
    a pass's minutes apart rather than back to back (a cell's back-to-back repeats share the
    machine's state of that minute: its clock, its neighbours, its memory bandwidth).

    A cell in `done` makes none; with `force`, every other makes `passes`; else as many as it
    lacks of `passes` runs that finished ok, and at least one (a cell not done whose count is
    full was chosen to be measured again: at random, or as unsteady, or its latest run
    failed). Its first is in the first pass, so that an interrupted sweep run again goes on
    where it stopped."""
    wanted = {}
    for index, cell in enumerate(prepared):
        if index in done:
            continue
        made = 0 if force else finished_runs(cell.cell.run.output_dir, cell_key(cell.config))
        wanted[index] = max(passes - made, 1)
    return [
        (number, index)
        for number in range(1, max(wanted.values(), default=0) + 1)
        for index in sorted(wanted)
        if wanted[index] >= number
    ]


def in_pass(cell: PreparedCell[Size], number: int) -> PreparedCell[Size]:
    """The cell as pass `number` of its sweep runs it (`runs_to_make`): after the first, in a
    directory of its own beside the first pass's (`<job>-pass<number>`), so that each run
    keeps its own record; the same cell otherwise, the same cell key."""
    if number == 1:
        return cell
    subdir = f"{cell.output_dir.name}-pass{number}"
    config = copy.deepcopy(cell.config)
    with open_dict(config.hydra.sweep):
        config.hydra.sweep.subdir = subdir
    return replace(cell, overrides=[*cell.overrides, f"hydra.sweep.subdir={subdir}"], config=config)


@contextlib.contextmanager
def running_sweep(
    config: DictConfig, runs: Sequence[tuple[int, int]], results: Collection[dict[str, Any]]
) -> Iterator[Any]:
    """Around a launcher's runs (`runs_to_make`): the sweep's MLflow parent run, only once
    every cell is valid and some cell runs, its summary made of `results` (each cell's latest
    outcome, filled meanwhile), as the summary table is; and the progress over the runs (not
    the skipped cells, which would make its rate thousands of cells/s; in a file, a line as
    each cell ends), which it yields."""
    from harness.records.sweep_runs import sweep_parent_run
    from workloads.progress import steps

    with (
        sweep_parent_run(config, cells_to_run=len(runs), results=results),
        steps(len(runs), "sweep", "cell(s)", enabled=bool(runs), first_line_s=0, every_s=0) as bar,
    ):
        yield bar


def each_pass(runs: Sequence[tuple[int, int]], passes: int) -> Iterator[tuple[int, list[int]]]:
    """`runs_to_make`'s runs, pass by pass: (pass, the positions it runs, in order), saying
    as each pass after the first begins why it runs cells again."""
    for number in sorted({made_in for made_in, _ in runs}):
        indices = [index for made_in, index in runs if made_in == number]
        if number > 1:
            announce_pass(number, len(indices), passes)
        yield number, indices


def announce_pass(number: int, count: int, passes: int) -> None:
    """Say that the sweep's pass `number` begins, running `count` cells again, and why."""
    print(
        f"[distbench] pass {number}: {count} cell(s) measured again, minutes after their "
        f"run in the pass before (hydra.launcher.passes={passes}: the analysis takes each "
        f"cell's median run and the noise between its runs)",
        flush=True,
    )


def upload_pending(prepared: Sequence[PreparedCell[Any]], done: dict[int, dict[str, Any]]) -> None:
    """Record in MLflow the reused results it never got (`pending_sync`: its store was
    unreachable when the cell ended), in the store this sweep records into, as
    `python -m harness.sync` would: a re-run that skips such a cell finishes its record. After
    the first that still cannot be recorded (the store is down yet: each try waits out
    MLflow's retries), the others are left pending for `harness.sync`, and said so."""
    from harness.records.pending import record_pending

    pending = [
        index
        for index, result in done.items()
        if result.get("pending_sync") and prepared[index].cell.tracking.enabled
    ]
    for number, index in enumerate(pending):
        cell = prepared[index].cell
        recorded = record_pending(
            Path(done[index]["output_dir"]), tracking_uri(cell.tracking.uri, cell.run.output_dir)
        )
        done[index] = mark_reused(recorded)
        if recorded.get("pending_sync"):
            left = len(pending) - number
            print(
                f"[distbench] {left} reused cell result(s) still not in MLflow "
                f"({recorded.get('tracking_error')}): python -m harness.sync records them",
                flush=True,
            )
            return
        print(
            f"[distbench] cell {prepared[index].job_num} ({cell.run_name}): its result, "
            f"reused, recorded in MLflow now (run {recorded.get('mlflow_run_id')})",
            flush=True,
        )


def remeasured_at_random(
    prepared: Sequence[PreparedCell[Any]], done: dict[int, dict[str, Any]], count: int, seed: int
) -> set[int]:
    """`count` of the cells that finished earlier (`done`, by position in `prepared`), chosen
    at random (seeded by `seed`: the same sweep, seed and results choose the same cells), taken
    out of `done` so that they are measured again, and said so.

    Why: the analysis's noise floor between runs (`harness.analysis.noise`) is the difference
    between two runs of one cell. Cells measured again because they were unsteady were chosen
    for being noisy; cells chosen at random were not, so only they give a floor the next run
    of a cell can be judged against."""
    if count <= 0 or not done:
        return set()
    chosen = set(random.Random(seed).sample(sorted(done), min(count, len(done))))
    for index in chosen:
        del done[index]
    names = ", ".join(
        f"{prepared[index].job_num} ({prepared[index].cell.run_name})" for index in sorted(chosen)
    )
    print(
        f"[distbench] {len(chosen)} cell(s) finished earlier, chosen at random "
        f"(hydra.launcher.remeasure_sample={count}, remeasure_seed={seed}), run again: "
        f"{names}",
        flush=True,
    )
    return chosen


def cell_outcome(
    config: DictConfig,
    output_dir: Path,
    *,
    ended_as: RunStatus | None,
    logs: str,
    started: str,
    cause: str | None = None,
) -> dict[str, Any]:
    """The cell's result: what rank 0 recorded, or else a record made from what is left.

    `ended_as` is the launcher's own view of how the cell ended (`timeout` when it ran out of
    time, `oom` when the scheduler killed it for memory), or None when it only saw it end;
    `cause`, what the launcher knows of why (e.g. the job never started), the record's first
    line.
    """
    if (output_dir / RESULT_FILE).exists():
        return read_result(output_dir)
    # Rank 0 may have recorded the cell where its directory could not take it
    # (harness.records.record).
    checked = check_cell(config)
    cell = checked.config
    if cell.tracking.enabled:
        elsewhere = result_recorded_for(
            tracking_uri(cell.tracking.uri, cell.run.output_dir),
            cell.tracking.experiment,
            checked.key,
            output_dir,
        )
        if elsewhere is not None:
            return elsewhere
    reports = read_rank_reports(output_dir)
    summarized, ranks = summarize_rank_reports(reports, cell.world_size, RunStatus.failed)
    status = ended_as or summarized
    raised = raised_before_reporting(logs) if status is RunStatus.failed and not reports else None
    if cause is None and raised is not None:
        cause = f"the cell ended without a result: {raised}, before it could report (below)"
    lines = [cause or _CAUSES.get(status, "the cell ended without a result"), *ranks, logs]
    return record_failure(checked, output_dir, status, "\n".join(lines), started=started)


_WORKER_LOG_HEADER = re.compile(r"^--- worker (\d+) stderr \(end\):$", re.MULTILINE)
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)"
    r"(?::.*)?$"
)


def raised_before_reporting(logs: str) -> str | None:
    """ "worker N raised <the exception's line>" where a worker's log (`worker_logs_tail`) ends
    in a Python traceback: the worker raised before distbench's code could report (e.g. while
    submitit unpickled its job, importing a launcher module); None where no log does, as for a
    worker killed by a signal, whose log ends wherever the kill found it."""
    parts = _WORKER_LOG_HEADER.split(logs)  # text before, then (worker, its log) pairs
    for worker, text in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in text.splitlines() if line.strip()]
        if (
            lines
            and _EXCEPTION_LINE.match(lines[-1])
            and any(line.startswith("Traceback (most recent call last)") for line in lines)
        ):
            return f"worker {worker} raised {lines[-1][:300]}"
    return None


def worker_logs_tail(job: submitit.Job, tasks: int, characters: int = 2000) -> str:
    """The end of every worker's stderr, for the record of a cell that left no result."""
    parts = []
    for task in range(tasks):
        try:
            text = job.task(task).stderr() or ""
        except Exception:  # noqa: BLE001 - a missing log must not hide the failure itself
            text = ""
        parts.append(f"--- worker {task} stderr (end):\n{text[-characters:]}")
    return "\n".join(parts)


def sweep_returns(
    prepared: Sequence[PreparedCell[Any]], results: Sequence[dict[str, Any]], job_ids: Sequence[str]
) -> list[Any]:
    """What a launcher hands back to Hydra: one JobReturn per cell, in cell order; the sweep's
    summary table, and the summary line made of the same records, are printed on the way."""
    from hydra.core.utils import JobReturn, JobStatus

    print(summary_table(results), flush=True)
    print(f"sweep: {SweepSummary.of(results).line()}", flush=True)
    note_cell_results(results)  # the command's exit status: 1 unless every cell ended ok
    return [
        JobReturn(
            overrides=cell.overrides,
            cfg=cell.config,
            working_dir=str(result.get("output_dir", cell.output_dir)),
            task_name=job_id,
            status=JobStatus.COMPLETED,
            _return_value=result,
        )
        for cell, result, job_id in zip(prepared, results, job_ids)
    ]


def quality_columns(metrics: dict[str, float]) -> str:
    """The table's eval accuracy and time to target ('-' where not measured)."""
    accuracy = f"{metrics['eval_accuracy']:>8.4f}" if "eval_accuracy" in metrics else f"{'-':>8}"
    if "reached_target" not in metrics:
        target = "-"
    elif metrics["reached_target"]:
        target = f"{metrics['time_to_target_s']:.1f} s"
    else:
        target = "not reached"
    return f"{accuracy} {target:>11}"


def tokens_column(metrics: dict[str, float]) -> str:
    """A language model's tokens/s; '-' for an image cell (one prediction per sample, so
    images/s says it all) and for a cell recorded before tokens/s was."""
    tokens = metrics.get("tokens_per_second")
    if tokens is None or tokens == metrics.get("images_per_second"):
        return "-"
    return f"{tokens:.0f}"


def summary_table(results: Sequence[dict]) -> str:
    """A plain-text table of a sweep's cells, printed when the sweep ends; under each cell
    that did not end ok, the one line that says why (its record holds the whole error), and
    under each cell reused from an earlier run, where that run is. `std` is the spread over
    the cell's repeats, '-' for a cell of one repeat (a footnote says so)."""
    header = (
        f"{'#':>3}  {'cell':<44} {'status':<8} {'s/epoch':>9} {'std':>7} "
        f"{'images/s':>9} {'tokens/s':>9} {'peak MB':>8} {'eval acc':>8} {'to target':>11}"
    )
    rows = [header]
    no_spread = unsteady = False
    for number, result in enumerate(results):
        metrics = result.get("metrics", {})
        no_spread |= bool(metrics) and std_column(metrics) == "-"
        mark = UNSTEADY_MARK if is_unsteady(metrics) else " "
        unsteady |= mark != " "
        figures = (
            f"{metrics['seconds_per_epoch']:>8.3f}{mark} {std_column(metrics):>7} "
            f"{metrics['images_per_second']:>9.1f} {tokens_column(metrics):>9} "
            f"{metrics['peak_memory_mb']:>8.0f} {quality_columns(metrics)}"
            if metrics
            else f"{'-':>9} {'-':>7} {'-':>9} {'-':>9} {'-':>8}"
        )
        rows.append(f"{number:>3}  {result['run_name']:<44} {result['status']:<8} {figures}")
        if result["status"] != RunStatus.ok.value:
            rows.append(f"{'':>5}why: {failure_reason(result.get('error'), width=90)}")
        if is_reused(result):
            rows.append(f"{'':>5}reused: measured earlier, in {result.get('output_dir')}")
        if mark != " ":
            steadiness = result.get("environment", {}).get("steadiness", "unsteady")
            rows.append(f"{'':>5}{failure_reason(steadiness, width=120)}")
    if no_spread:
        rows.append(STD_FOOTNOTE)
    if unsteady:
        rows.append(UNSTEADY_FOOTNOTE)
    return "\n".join(rows)
