"""A sweep's cells as SLURM jobs, through submitit's SLURM executor.

Every cell is its own job, sized from its own config (the stock Hydra submitit launcher sizes
all jobs of a sweep alike): `hardware.nodes` nodes with `hardware.workers_per_node` tasks each
(one task for the sequential baseline), one GPU per task on CUDA hardware. Timings are only
worth something if nothing else runs on the measured hardware, so:

- every cell asks for whole nodes (`--exclusive`);
- by default every cell of a sweep carries the same job name and `--dependency=singleton`, so
  SLURM itself starts them one after another. That matters where nodes share hardware (the
  local test cluster's two "nodes" share one machine's cores), and it keeps holding when the
  shell that submitted the sweep is gone. `array_parallelism: k` makes k such chains (job
  names `<name>-0` .. `<name>-<k-1>`, cell i in chain i mod k): at most k cells at once, each
  on its own exclusive nodes;
- a job that reaches its time limit is re-queued up to `max_num_timeout` times (submitit's
  requeue: SLURM signals the job `signal_delay_s` before its limit, rank 0 requeues it, the
  cell starts again from scratch in the same job and directory); only the last try's timeout
  is recorded (`keep_last_try_to_its_limit`).

The keys of Hydra's submitit plugin that size a job (`nodes`, `tasks_per_node`,
`gpus_per_node`, `gpus_per_task`, `cpus_per_task`) are checks here, never a resize of the
measured cell: a value the cell's hardware config does not imply stops the sweep before any job
is submitted, with one line naming the key, its value, the value the cell needs and the
hardware setting to change (`check_sizing_keys`).

The jobs record themselves (rank 0 writes result.json and the MLflow run), so a sweep loses no
result if the submitting shell dies. While that shell lives, it waits for the jobs, ends a job
whose rank 0 has recorded the cell but whose other workers linger, and records a cell that
ended without a result from the final SLURM state of its job and what its workers left.

Every submitted job is noted under the output root (`JobNote`), so that a re-run of the sweep
follows a job that is still queued or running instead of submitting its cell twice, and records
a job that ended without a result while no launcher watched it.

Job states come from `squeue`, not `sacct`: sacct needs SLURM's accounting database, which
many small clusters (and the local test cluster) do not run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import submitit

from harness.config.schema import ConfigError, DistbenchConfig, HardwareConfig
from harness.records.results import (
    RESULT_FILE,
    RunStatus,
    group_formed_path,
    rank_report_path,
    worker_presence_path,
)
from harness.records.resume import job_note_path, kept_path, path_now
from workloads.datasets.atomic import write_json_atomic

log = logging.getLogger(__name__)

# States after which a job runs no more (squeue's long names).
_RUNNING_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SUSPENDED",
    "STOPPED",
    "SIGNALING",
    "STAGE_OUT",
    "RESV_DEL_HOLD",
    "SPECIAL_EXIT",
}
# A running job put back in the queue (submitit's requeue after the time-limit signal).
_STARTED_STATES = {"RUNNING", "COMPLETING"}
_REQUEUED_STATES = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}
# A job squeue no longer knows (purged after slurm.conf's MinJobAge) has ended.
GONE = "GONE"
# How a job that left no result ended, as a cell status.
_STATUS_OF_STATE = {
    "TIMEOUT": RunStatus.timeout,
    "DEADLINE": RunStatus.timeout,
    "OUT_OF_MEMORY": RunStatus.oom,
}
_POLL_S = 2.0
_UNREACHABLE_LIMIT_S = 600.0


@dataclass(frozen=True)
class CellJobSize:
    """The SLURM allocation of one cell."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int | None

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node


def cell_job_size(cell: DistbenchConfig, launcher: Mapping[str, Any]) -> CellJobSize:
    """Size a cell's job from its config; explicit launcher sizes must agree with it.

    `hydra.launcher.nodes` / `tasks_per_node` / `gpus_per_node` / `gpus_per_task` /
    `cpus_per_task` are null by default (taken from the cell); a value given there is a check
    (`check_sizing_keys`), never a silent resize of the measured cell.
    """
    return job_size(
        cell.hardware,
        cell.world_size,
        launcher,
        what=f"cell {cell.run_name} (distribution.name={cell.distribution.name})",
    )


def job_size(
    hardware: HardwareConfig, workers: int, launcher: Mapping[str, Any], *, what: str = "the job"
) -> CellJobSize:
    """`workers` workers spread over `hardware`'s nodes (all on one node when only one), one
    GPU per task on CUDA hardware; the launcher's sizing keys are checked against it, and its
    other settings against the job script (`check_script_safe`, `check_sweep_settings`),
    before any submission."""
    check_script_safe(launcher)
    check_sweep_settings(launcher)
    if hardware.link is not None:
        check_emulated_nodes(hardware)
    nodes = hardware.nodes if workers > 1 else 1
    tasks_per_node = workers // nodes
    size = CellJobSize(
        nodes=nodes,
        tasks_per_node=tasks_per_node,
        gpus_per_node=tasks_per_node if hardware.device.value == "cuda" else None,
    )
    check_sizing_keys(size, hardware, launcher, what)
    return size


def check_emulated_nodes(hardware: HardwareConfig) -> None:
    """Hardware whose nodes are emulated on this machine (`hardware.link`) needs them up, and
    as many as it has: else one line says how, before any job is submitted."""
    from launchers import emulated

    cluster = emulated.current()
    if cluster is None:
        raise ConfigError(
            f"hardware={hardware.name} is invalid here: its nodes are emulated "
            f"(hardware.link) and none are up; allowed: after python -m "
            f"launchers.emulated up hardware={hardware.name}"
        )
    if len(cluster.nodes) < hardware.nodes:
        raise ConfigError(
            f"hardware.nodes={hardware.nodes} is invalid here: the emulated "
            f"cluster that is up has {len(cluster.nodes)} nodes; allowed: at most "
            f"{len(cluster.nodes)}, or python -m launchers.emulated up "
            f"hardware={hardware.name}"
        )


def check_sizing_keys(
    size: CellJobSize, hardware: HardwareConfig, launcher: Mapping[str, Any], what: str
) -> None:
    """A sizing key of Hydra's submitit plugin given in the launcher config must agree with the
    cell: equal to what the cell needs, or to the whole allocation its hardware config describes
    (the value a user's config for the plugin holds; a cell that needs less, such as the
    one-worker baseline, still gets only what it needs). Anything else would measure another
    cell than the one recorded, so it stops the sweep with one line."""
    hardware_is = (
        f"hardware={hardware.name}: nodes={hardware.nodes}, "
        f"workers_per_node={hardware.workers_per_node}, device="
        f"{hardware.device.value}"
    )
    cuda = hardware.device.value == "cuda"
    # key -> (what the cell needs, the values accepted, the hardware setting behind it)
    expected: dict[str, tuple[int, set[int], str]] = {
        "nodes": (size.nodes, {size.nodes, hardware.nodes}, "hardware.nodes"),
        "tasks_per_node": (
            size.tasks_per_node,
            {size.tasks_per_node, hardware.workers_per_node},
            "hardware.workers_per_node",
        ),
        "gpus_per_node": (
            (
                size.tasks_per_node,
                {size.tasks_per_node, hardware.workers_per_node},
                "hardware.workers_per_node (one GPU per worker)",
            )
            if cuda
            else (0, {0}, "hardware.device (cpu: no GPUs)")
        ),
        "gpus_per_task": (
            (1, {1}, "hardware.device (one GPU per worker)")
            if cuda
            else (0, {0}, "hardware.device (cpu: no GPUs)")
        ),
    }
    if hardware.cpu_threads is not None:
        expected["cpus_per_task"] = (
            hardware.cpu_threads,
            {hardware.cpu_threads},
            "hardware.cpu_threads (torch threads per worker)",
        )
    for key, (needed, accepted, setting) in expected.items():
        given = launcher.get(key)
        if given is None or given in accepted:
            continue
        allowed = ", ".join(str(value) for value in sorted(accepted))
        raise ConfigError(
            f"hydra.launcher.{key}={given} is invalid for {what}: it needs {needed} "
            f"({hardware_is}); allowed: null (sized from the hardware config) or {allowed}; "
            f"for {given}, change {setting} in the hardware config instead"
        )


def cells_at_once(launcher: Mapping[str, Any]) -> int | None:
    """How many cells of a sweep may run at the same time; None: no limit."""
    if launcher.get("one_cell_at_a_time") is False:
        return None
    return int(launcher.get("array_parallelism") or 1)


def check_sweep_settings(launcher: Mapping[str, Any]) -> None:
    """The launcher's sweep policy: counts in range, and no two keys that contradict."""
    for key, least in (("array_parallelism", 1), ("max_num_timeout", 0)):
        value = launcher.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < least
        ):
            raise ConfigError(
                f"hydra.launcher.{key}={value} is invalid: a whole number; allowed: {least} or more"
            )
    parallel = launcher.get("array_parallelism")
    if launcher.get("one_cell_at_a_time") is True and parallel is not None and parallel > 1:
        raise ConfigError(
            f"hydra.launcher.one_cell_at_a_time=true is invalid with "
            f"hydra.launcher.array_parallelism={parallel}: they contradict; allowed: "
            f"one_cell_at_a_time=null (array_parallelism cells at once) or array_parallelism=1"
        )
    for flag in dict(launcher.get("additional_parameters") or {}):
        name = str(flag).replace("-", "_")
        if name in _DERIVED_FLAGS:
            raise ConfigError(
                f"hydra.launcher.additional_parameters.{flag} is invalid: distbench sets "
                f"--{name.replace('_', '-')} itself ({_DERIVED_FLAGS[name]}); allowed: any "
                f"other sbatch flag"
            )


# sbatch flags distbench derives for every cell, which `additional_parameters` (written last by
# submitit, so it would win) must not replace.
_DERIVED_FLAGS = {
    "nodes": "from the cell's hardware config; hydra.launcher.nodes is a check of it",
    "ntasks": "from the cell's hardware config",
    "ntasks_per_node": "from the cell's hardware config; hydra.launcher.tasks_per_node is a "
    "check of it",
    "gpus": "one GPU per worker on CUDA hardware",
    "gpus_per_node": "one GPU per worker on CUDA hardware",
    "exclusive": "whole nodes per cell: hydra.launcher.exclusive",
    "dependency": "cells at once: hydra.launcher.array_parallelism",
    "job_name": "hydra.launcher.name",
    "array": "one job per cell: hydra.launcher.array_parallelism",
    "signal": "the time-limit signal: hydra.launcher.signal_delay_s",
}


# An sbatch flag name as `additional_parameters` may give it (`reservation`, `mail-type`).
_FLAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
# The one launcher key whose lines are shell code by contract (module loads before srun).
_SHELL_CODE_KEYS = {"setup"}
# submitit's other shell-code setting: lines after srun. Refused, so that a sweep's shell code
# has one place to be read (nothing needs to run after the workers: rank 0 records the cell).
_REFUSED_SHELL_CODE_KEYS = {"teardown"}


def check_script_safe(launcher: Mapping[str, Any]) -> None:
    """Refuse settings that would turn into shell code in the job script.

    submitit shell-quotes every value it writes (`#SBATCH --key='value'`, each srun argument),
    but a line break in a value ends the `#SBATCH` comment line and starts a shell line, and
    the names of `additional_parameters` are written unquoted. So every value must be one line
    and every flag name a plain word. Only `setup` holds shell lines, by design; `teardown`,
    which submitit would also write as shell lines, is refused.
    """
    for key in sorted(_REFUSED_SHELL_CODE_KEYS):
        if launcher.get(key) is not None:
            raise ConfigError(
                f"hydra.launcher.{key}={_listed(launcher[key])} is invalid: its lines would "
                f"run as shell code after srun; allowed: null (shell lines go in "
                f"hydra.launcher.setup, the one setting that is shell code)"
            )
    for key, value in launcher.items():
        if key in _SHELL_CODE_KEYS or value is None:
            continue
        if key == "additional_parameters":
            for flag, flag_value in dict(value).items():
                if not _FLAG_NAME.fullmatch(str(flag)):
                    raise ConfigError(
                        f"hydra.launcher.additional_parameters.{flag} is invalid: an sbatch "
                        f"flag name; allowed: letters, digits, '-' and '_'"
                    )
                _check_one_line(f"additional_parameters.{flag}", flag_value)
        else:
            items = value if isinstance(value, Sequence) and not isinstance(value, str) else [value]
            for item in items:
                _check_one_line(str(key), item)


def _listed(value: Any) -> str:
    """A setting's value as an override would write it (a list of lines as a list)."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return str([str(item) for item in value])
    return str(value)


def _check_one_line(key: str, value: Any) -> None:
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in str(value)):
        raise ConfigError(
            f"hydra.launcher.{key}={str(value)!r} is invalid: a value written "
            f"into the job script must be one line; allowed: no line breaks or "
            f"control characters"
        )


# Launcher keys that are submitit's executor-independent parameters; the rest are SLURM's own
# and go to submitit with a `slurm_` prefix. Keys handled here (sizing, sweep policy) are not
# passed on as they are.
_GENERIC_KEYS = {"timeout_min", "cpus_per_task", "mem_gb", "stderr_to_stdout"}
_OWN_KEYS = {
    "submitit_folder",
    "nodes",
    "tasks_per_node",
    "gpus_per_node",
    "gpus_per_task",
    "name",
    "exclusive",
    "one_cell_at_a_time",
    "grace_after_result_s",
    "max_num_timeout",
    "array_parallelism",
    "wait_for_completion",
    "force",
    "_target_",
    "remeasure_unsteady",
    "remeasure_sample",
    "remeasure_seed",
    "passes",
    "unavailable_nodes_timeout_s",
}


def executor_parameters(
    size: CellJobSize, launcher: Mapping[str, Any], cell: DistbenchConfig, job_num: int = 0
) -> dict[str, Any]:
    """submitit parameters of one cell's job (the `job_num`th cell of its sweep)."""
    # `gpus_per_task` given (cpus_per_gpu needs it): the cell's GPUs are asked per task.
    per_task = launcher.get("gpus_per_task") and size.gpus_per_node is not None
    parameters: dict[str, Any] = {
        "nodes": size.nodes,
        "tasks_per_node": size.tasks_per_node,
        "gpus_per_node": None if per_task else size.gpus_per_node,
        "name": str(launcher["name"]),
        "slurm_exclusive": bool(launcher.get("exclusive", True)) or None,
    }
    if per_task:
        parameters["slurm_gpus_per_task"] = 1
    if launcher.get("cpus_per_task") is None and cell.hardware.cpu_threads is not None:
        parameters["cpus_per_task"] = cell.hardware.cpu_threads
    chains = cells_at_once(launcher)
    if chains is not None:  # SLURM starts a chain's jobs (same name, singleton) one by one
        parameters["slurm_dependency"] = "singleton"
        if chains > 1:
            parameters["name"] = f"{parameters['name']}-{job_num % chains}"
    for key, value in launcher.items():
        if key in _OWN_KEYS or value is None:
            continue
        parameters[key if key in _GENERIC_KEYS else f"slurm_{key}"] = value
    if int(launcher.get("max_num_timeout") or 0) > 0:  # also where JobRequeue=0 is the default
        parameters["slurm_additional_parameters"] = {
            "requeue": True,
            **dict(parameters.get("slurm_additional_parameters") or {}),
        }
    return parameters


def cell_executor(
    folder: Path, parameters: Mapping[str, Any], *, max_num_timeout: int = 0
) -> submitit.AutoExecutor:
    """The submitit executor of one cell's job. `max_num_timeout` is always given: submitit's
    own default re-queues a timed-out job 3 times."""
    executor = submitit.AutoExecutor(
        folder=str(folder), cluster="slurm", slurm_max_num_timeout=max_num_timeout
    )
    executor.update_parameters(**parameters)
    return executor


def submit_cell(
    function: Callable[..., Any],
    *args: Any,
    folder: Path,
    parameters: Mapping[str, Any],
    max_num_timeout: int = 0,
) -> submitit.Job:
    """Submit one cell as one SLURM job (sbatch) whose every task calls `function(*args)`;
    a timed-out job is re-queued up to `max_num_timeout` times if `function` has submitit's
    `checkpoint` method."""
    return cell_executor(folder, parameters, max_num_timeout=max_num_timeout).submit(
        function, *args
    )


def tries_before() -> int:
    """In a task of a SLURM job: how many times SLURM re-queued the job before this try."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def forget_earlier_try(output_dir: Path) -> None:
    """In a task of a re-queued job, before the cell starts again: this worker's report of the
    earlier try goes (that try ended when the job was re-queued; its peers' collectives failed
    as rank 0 left), so that it is not read as part of this try's outcome; and its presence,
    which names the earlier try's process (ended: rank 0 would not wait for this one); and on
    rank 0, its note that the earlier try's process group formed."""
    rank = int(os.environ["SLURM_PROCID"])
    rank_report_path(output_dir, rank).unlink(missing_ok=True)
    worker_presence_path(output_dir, rank).unlink(missing_ok=True)
    if rank == 0:
        group_formed_path(output_dir).unlink(missing_ok=True)


def keep_last_try_to_its_limit(max_num_timeout: int) -> None:
    """In a cell's SLURM task, before the cell starts (submitit's signal handlers are set):
    on its last try, the job's time-limit signal is only logged.

    SLURM signals every task `signal_delay_s` before the job's time limit. While tries remain,
    submitit's handler re-queues the job (rank 0 runs `scontrol requeue`): the attempt records
    nothing, the next one measures the cell again (`requeued_even_if_slurm_ends_scontrol`). On
    the last try, that handler would raise UncompletedJobError in the middle of the
    measurement, and rank 0 would record the cell as `failed` before its time is up; instead
    the cell runs on, and if SLURM ends it at its limit the launcher records it as `timeout`
    (the job's TIMEOUT state).
    """
    tries_used = tries_before()
    limit_signal = signal.Signals[f"SIG{submitit.JobEnvironment.USR_SIG}"]
    if tries_used < max_num_timeout:
        submitits = signal.getsignal(limit_signal)
        if callable(submitits):
            signal.signal(limit_signal, requeued_even_if_slurm_ends_scontrol(submitits))
        return

    def last_try(signum: int, frame: object) -> None:
        log.warning(
            "SLURM signalled this job's time limit on its last try (%d of %d, "
            "hydra.launcher.max_num_timeout=%d): the cell runs on until SLURM ends it",
            tries_used + 1,
            max_num_timeout + 1,
            max_num_timeout,
        )

    signal.signal(limit_signal, last_try)


def requeued_even_if_slurm_ends_scontrol(
    requeue: Callable[[int, Any], None],
) -> Callable[[int, Any], None]:
    """submitit's re-queueing signal handler, where SLURM's own SIGTERM may end the job's
    `scontrol requeue` before it returns.

    Re-queueing a running job makes SLURM end its step with SIGTERM, and `scontrol requeue`
    runs inside that step: when the signal reaches it before it exits, submitit's
    `check_call` raises CalledProcessError (died with SIGTERM) from the signal handler, in the
    middle of the cell, and rank 0 recorded the re-queued try as `failed` (seen in a run of
    tests/integration/test_slurm_plugin_config.py, 2026-11-28: the launcher then read the cell as
    ended and its re-queued job never ran). The job was re-queued all the same (the SIGTERM is
    SLURM's doing so): this try ends as submitit ends one it re-queued.
    """

    def requeue_then_exit(signum: int, frame: Any) -> None:
        try:
            requeue(signum, frame)
        except subprocess.CalledProcessError as error:
            command = [str(part) for part in error.cmd]  # submitit passes a list
            if (
                error.returncode != -signal.SIGTERM
                or len(command) < 2
                or Path(command[0]).name != "scontrol"
                or command[1] != "requeue"
            ):
                raise
            log.info(
                "SLURM re-queued this job and ended `%s` with its SIGTERM before it "
                "returned: this try ends, the next one measures the cell again",
                " ".join(command),
            )
            raise SystemExit(-1) from None  # as submitit's own exit after a re-queue

    return requeue_then_exit


@dataclass(frozen=True)
class JobNote:
    """A cell's SLURM job as submitted: what a later run of the sweep needs to follow it, or to
    record it if it ended without a result while no launcher was watching."""

    job_id: str
    folder: str  # submitit's folder, `%j` in it: the job's logs
    output_dir: str  # the cell's output directory in the sweep that submitted it
    tasks: int
    submitted_at: str  # ISO 8601, UTC

    def job(self) -> submitit.Job:
        """The submitted job, as submitit sees it (its logs, scancel)."""
        return submitit.SlurmJob(
            folder=self.folder, job_id=self.job_id, tasks=tuple(range(self.tasks))
        )


def write_job_note(output_root: str | Path, key: str, note: JobNote) -> None:
    """Note the cell's job, replacing the note of any earlier job of the same cell. Its folders
    are kept relative to the output root (`kept_path`), as the cell index keeps results: a
    root moved as a whole after its jobs ended still finds their outputs and logs."""
    kept = replace(
        note,
        folder=kept_path(Path(note.folder), output_root),
        output_dir=kept_path(Path(note.output_dir), output_root),
    )
    write_json_atomic(job_note_path(output_root, key), asdict(kept))


def read_job_note(output_root: str | Path, key: str) -> JobNote | None:
    """The cell's last noted job, its folders where they are now (`path_now`), or None (never
    submitted to SLURM, or an unreadable note)."""
    try:
        note = JobNote(**json.loads(job_note_path(output_root, key).read_text()))
        return replace(
            note,
            folder=str(path_now(note.folder, output_root)),
            output_dir=str(path_now(note.output_dir, output_root)),
        )
    except (OSError, ValueError, TypeError):
        return None


def job_states(job_ids: Sequence[str]) -> dict[str, str]:
    """SLURM's state of each job (squeue's long name, e.g. RUNNING, TIMEOUT), or GONE."""
    return {job_id: state for job_id, (state, _) in job_table(job_ids).items()}


def job_table(job_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """SLURM's state of each job, or GONE, and squeue's reason (why a pending job waits)."""
    if not job_ids:
        return {}
    done = subprocess.run(
        [
            "squeue",
            "--states=all",
            "--noheader",
            "--format=%i|%T|%r",
            f"--jobs={','.join(job_ids)}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    table = {job_id: (GONE, "") for job_id in job_ids}
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:  # every id already purged
            return table
        raise RuntimeError(f"squeue failed: {done.stderr.strip()}")
    for line in done.stdout.splitlines():
        job_id, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if job_id in table:
            table[job_id] = (state.split()[0] if state else GONE, reason.strip())
    return table


# squeue's reasons for a pending job whose nodes cannot run it (down, drained, not responding,
# fewer than it asks for), as opposed to nodes that are busy (Resources) or a job waiting for
# an earlier cell (Dependency).
_UNAVAILABLE_NODES = re.compile(
    r"ReqNodeNotAvail|NodeDown|Nodes required for job are DOWN|"
    r"PartitionNodeLimit|PartitionDown|PartitionInactive"
)


def waits_for_unavailable_nodes(state: str, reason: str) -> bool:
    return state == "PENDING" and _UNAVAILABLE_NODES.search(reason) is not None


def _give_up_on_unavailable_nodes(
    cell: SubmittedCell, reason: str, now: float, limit_s: float
) -> None:
    """Cancel `cell`'s job once it has waited `limit_s` for nodes that cannot run it."""
    if not waits_for_unavailable_nodes(cell.state, reason):
        cell.unavailable_since = None
        return
    if cell.unavailable_since is None:
        cell.unavailable_since = now
        print(
            f"[distbench] SLURM job {cell.job.job_id} waits for nodes that cannot run it "
            f"({reason}); cancelled if still so in {limit_s:.0f} s",
            flush=True,
        )
    elif now - cell.unavailable_since > limit_s and not cell.cancelled:
        cell.never_started = (
            f"SLURM could not start the job: it waited {limit_s:.0f} s for "
            f"nodes that cannot run it ({reason}); cancelled"
        )
        log.warning("job %s: %s", cell.job.job_id, cell.never_started)
        cell.job.cancel(check=False)
        cell.cancelled = True


# A job SLURM holds pending longer than this gets a line (no silent wait over 5 s), then one
# every PENDING_EVERY_S while it still waits.
PENDING_QUIET_S = 5.0
PENDING_EVERY_S = 60.0


def say_pending(cell: SubmittedCell, reason: str, now: float) -> None:
    """A line while SLURM holds `cell`'s job pending (its reason, as squeue gives it), past
    PENDING_QUIET_S and then every PENDING_EVERY_S: the sweep is waiting on the scheduler."""
    if cell.state != "PENDING":
        return
    waited = now - cell.followed_since
    last = cell.pending_said_at
    if waited < PENDING_QUIET_S or (last is not None and now - last < PENDING_EVERY_S):
        return
    cell.pending_said_at = now
    why = f" ({reason})" if reason and reason != "None" else ""
    print(  # (not "SLURM job <id>": that names a submission, in the lines that submit)
        f"[distbench] job {cell.job.job_id} has waited in SLURM's queue for {waited:.0f} s"
        f"{why}: the sweep goes on once SLURM starts it",
        flush=True,
    )


def has_ended(state: str) -> bool:
    return state not in _RUNNING_STATES


# What a job's final state says of why it left no result, where the state says more than
# "it ended" (the record's first line).
_CAUSE_OF_STATE = {
    "NODE_FAIL": "the cell ended without a result: SLURM ended its job because a node of it "
    "failed (its slurmd stopped answering: the node died, or lost its network)",
    "BOOT_FAIL": "the cell ended without a result: a node of its job failed to boot",
}


def cause_of_state(state: str) -> str | None:
    return _CAUSE_OF_STATE.get(state)


def status_of_state(state: str) -> RunStatus | None:
    """The cell status a job's final state implies when the job left no result."""
    return _STATUS_OF_STATE.get(state)


@dataclass
class SubmittedCell:
    """A cell's job as the launcher follows it."""

    job: submitit.Job
    output_dir: Path
    tasks: int
    result_file: str = RESULT_FILE  # what rank 0 writes when it has recorded the job's work
    state: str = "PENDING"
    result_seen_at: float | None = None
    cancelled: bool = False
    requeues: int = 0  # times the launcher saw SLURM put the running job back in the queue
    # Since when the job has waited for nodes that cannot run it (down, drained), if it does.
    unavailable_since: float | None = None
    # Why the launcher cancelled a job that could not start (recorded as the cell's error).
    never_started: str | None = None
    # When the launcher began following the job, and last said that SLURM holds it pending.
    followed_since: float = field(default_factory=time.monotonic)
    pending_said_at: float | None = None


def wait_for_cells(
    cells: Sequence[SubmittedCell],
    *,
    grace_s: float,
    on_end: Callable[[SubmittedCell], None],
    unavailable_limit_s: float = 600.0,
) -> None:
    """Follow the jobs until all have ended, calling `on_end` for each as it ends.

    A job whose rank 0 has recorded the cell but which still runs `grace_s` later (a worker
    that hangs after the measurement) is cancelled, so it does not hold its nodes. A job that
    has waited `unavailable_limit_s` for nodes that cannot run it (a node down or drained:
    its slurmd died, the node is gone) is cancelled, its reason kept for its record
    (`SubmittedCell.never_started`), so that the sweep goes on instead of waiting for ever.
    """
    pending = list(cells)
    last_answer = time.monotonic()
    while pending:
        now = time.monotonic()
        try:
            table = job_table([cell.job.job_id for cell in pending])
            states = {job_id: state for job_id, (state, _) in table.items()}
            last_answer = now
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
            # slurmctld restarting or briefly unreachable: the jobs run on; ask again later.
            if now - last_answer > _UNREACHABLE_LIMIT_S:
                raise RuntimeError(
                    f"SLURM has not answered for {_UNREACHABLE_LIMIT_S:.0f} s; "
                    f"the jobs record themselves ({err})"
                ) from err
            log.warning("could not read the jobs' states (%s); retrying", err)
            time.sleep(_POLL_S)
            continue
        for cell in list(pending):
            before, cell.state = cell.state, states[cell.job.job_id]
            if before in _STARTED_STATES and cell.state in _REQUEUED_STATES:
                cell.requeues += 1
                print(
                    f"[distbench] SLURM job {cell.job.job_id} re-queued ({before} -> "
                    f"{cell.state}, try {cell.requeues + 1}): the cell runs again from "
                    f"the start",
                    flush=True,
                )
            if has_ended(cell.state):
                pending.remove(cell)
                on_end(cell)
                continue
            _give_up_on_unavailable_nodes(cell, table[cell.job.job_id][1], now, unavailable_limit_s)
            say_pending(cell, table[cell.job.job_id][1], now)
            if cell.result_seen_at is None and (cell.output_dir / cell.result_file).exists():
                cell.result_seen_at = now
            if (
                cell.result_seen_at is not None
                and not cell.cancelled
                and now - cell.result_seen_at > grace_s
            ):
                log.warning(
                    "job %s recorded its cell %.0f s ago but still runs; cancelling",
                    cell.job.job_id,
                    now - cell.result_seen_at,
                )
                cell.job.cancel(check=False)
                cell.cancelled = True
        if pending:
            time.sleep(_POLL_S)
