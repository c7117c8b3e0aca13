"""`python -m harness.probe hardware=H`: measure how the workers of H talk to each other.

Starts one worker per device of the hardware configuration (locally, or as a SLURM job with
`hydra/launcher=submitit_slurm`, exactly as a grid cell's workers are started) and measures,
over the same torch.distributed backend the distribution models use:

- point-to-point: for every pair of workers, ping-pong round trips at every size of
  `probe.message_bytes`; one-way time = round trip / 2; latency at the smallest message,
  bandwidth fitted over all sizes (the role NVIDIA's p2pBandwidthLatencyTest played in the
  thesis);
- allreduce: among the first k workers for every k from 2 to W, at every message size;
- and what else the registered distribution models declare their time terms read
  (`DistributionSpec.probed_collectives`, `harness.profiles.collectives`): on CPU workers,
  an all-gather and a reduce-scatter timed after compute, and between nodes the compute an
  allreduce takes from the cores beside it.

The probe measures the union of what the models declare, each figure where a model's terms
read it, and holds no code of any model.

Each figure is the median of `probe.repeats` timed repetitions after `probe.warmup` untimed
ones, with devices synchronised; the whole is measured `probe.rounds` times, one round after
the other, each figure kept at its median across the rounds and their spread recorded beside
it (`harness.profiles.rounds`): the probe's own noise. Rank 0 writes the profile
(`hardware_profile.json`) into the probe's directory and as the latest profile of the hardware
(`<run.output_dir>/hardware_profiles/<hardware>.json`, which the predictors read), and logs it
to MLflow (experiment `hardware_probe`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from harness.cli.arguments import overrides_of, overrides_parser
from harness.cli.bad_input import exit_on_bad_input, single_line
from harness.cli.cell_results import FAILED_CELLS_EXIT_CODE
from harness.cli.errors import command
from harness.cli.preflight import check_device_here, check_launcher, check_writable_dir
from harness.commands.compose import compose_config
from harness.config.schema import (
    ConfigError,
    DistbenchConfig,
    LinkEmulation,
    validate,
    without_hydra,
)
from harness.profiles.collectives import AFTER_COMPUTE, Collective
from harness.profiles.hardware import (
    COLLECTIVES_AFTER_COMPUTE_FACT,
    COMPUTE_LOST_FACT,
    PROFILE_FILE,
    HardwareProfile,
    profile_path,
)
from harness.profiles.rounds import ROUNDS_FACT, largest_spread, spread_line
from harness.records.mlflow_store import tracking_uri
from harness.records.tracking import log_run
from harness.system.worker_env import log_to_stderr

if TYPE_CHECKING:  # the local launcher's job; its module loads only when a probe starts
    import submitit

log = logging.getLogger(__name__)

EXPERIMENT = "hardware_probe"


def launch_probe(
    cfg: DictConfig, config: DistbenchConfig, output_dir: Path, launcher: dict[str, Any] | None
) -> HardwareProfile:
    """Start the probe's workers (locally, or on SLURM when `launcher` holds SLURM settings)
    and return the profile rank 0 wrote."""
    from harness.worker.probe_worker import probe_worker  # the workers' code: torch, only now

    workers = config.hardware.world_size
    folder = output_dir / ".submitit" / "%j"
    timeout_min = int((launcher or {}).get("timeout_min", 30))
    if launcher is None:
        job = run_local_probe(
            local_probe_worker, cfg, config, output_dir, folder=folder, timeout_min=timeout_min
        )
    else:
        from launchers import slurm

        size = slurm.job_size(config.hardware, workers, launcher)
        parameters = slurm.executor_parameters(
            size, {**launcher, "one_cell_at_a_time": False}, config
        )
        # Every figure is a collective among all the workers: one that dies would leave the
        # others waiting for it until run.progress_timeout_s, so SLURM ends the step at once
        # (the job then ends without a profile, said in one line below). A cell's job does not
        # ask this: its rank 0 records the cell, with what it measured, when a peer dies.
        parameters["slurm_srun_args"] = [
            *(parameters.get("slurm_srun_args") or []),
            "--kill-on-bad-exit=1",
        ]
        job = slurm.submit_cell(probe_worker, cfg, output_dir, folder=folder, parameters=parameters)
        slurm.wait_for_cells(
            [slurm.SubmittedCell(job, output_dir, workers, PROFILE_FILE)],
            grace_s=20,
            on_end=lambda cell: None,
        )
    if not (output_dir / PROFILE_FILE).exists():
        raise ProbeFailed(
            f"its workers ended without a profile ({_last_words(job, workers)}; their logs: "
            f"{job.paths.folder})",
            config.hardware.name,
        )
    return HardwareProfile.load(output_dir / PROFILE_FILE)


# What srun writes where a task of its step ended badly: "srun: error: node1: task 1: Killed".
_SRUN_TASK_ENDED = re.compile(r"^srun: error: \S+: tasks? [\d,-]+: .+$")


def _last_words(job: submitit.Job, workers: int) -> str:
    """Why a probe ended without a profile, as its workers' logs say: srun's line naming the
    task that ended badly, where SLURM ran it (the others were ended after it: their last
    lines are srun's "Force Terminated"); else the last line a worker wrote on stderr (what
    raised, as a rule); else that none wrote anything."""
    logs = []
    for rank in range(workers):
        try:
            logs.append((rank, (job.task(rank).stderr() or "").strip().splitlines()))
        except Exception:  # noqa: BLE001 - a missing log must not hide the failure itself
            logs.append((rank, []))
    for _, lines in logs:
        said = next((line for line in lines if _SRUN_TASK_ENDED.match(line)), None)
        if said is not None:
            return f"SLURM said: {said[:300]}"
    for rank, lines in logs:
        if lines:
            return f"worker {rank} last wrote: {lines[-1][:300]}"
    return "no worker wrote anything on stderr"


def local_probe_worker(cfg: DictConfig, output_dir: Path) -> dict[str, Any] | None:
    """A worker of a probe on this machine: it ends as soon as the command that started it is
    gone (killed outright, it could not end its workers, which would wait at the rendezvous
    for up to run.progress_timeout_s), as a local cell's workers do."""
    from harness.worker.probe_worker import probe_worker
    from launchers.local import follow_launcher

    follow_launcher()
    return probe_worker(cfg, output_dir)


def run_local_probe(
    worker: Callable[[DictConfig, Path], Any],
    cfg: DictConfig,
    config: DistbenchConfig,
    output_dir: Path,
    *,
    folder: Path,
    timeout_min: int,
) -> submitit.Job:
    """The probe's workers as processes of this machine, waited for until all have ended.

    Every figure is a collective among all of them: one that dies leaves the others waiting
    for it (at the rendezvous, for up to run.progress_timeout_s), so it is watched for
    (`launchers.worker_watch`), and ends the probe at once, named (`ProbeFailed`); so does the
    time limit. A profile rank 0 wrote is kept whatever ended the workers after it."""
    from launchers.local import submit_local, wait_for_cell, worker_line
    from launchers.worker_watch import LostWorkerWatch

    job = submit_local(
        worker,
        cfg,
        output_dir,
        folder=folder,
        tasks=config.hardware.world_size,
        timeout_min=timeout_min,
        name="distbench-probe",
    )
    with LostWorkerWatch(job, output_dir / PROFILE_FILE) as watch:
        timed_out = wait_for_cell(
            job, output_dir, timeout_s=60 * timeout_min, result_file=PROFILE_FILE
        ).timed_out
    if (output_dir / PROFILE_FILE).exists():
        return job
    if timed_out:
        why = f"it did not finish within {timeout_min} min, and its workers were ended"
        raise ProbeFailed(f"{why} (their logs: {job.paths.folder})", config.hardware.name)
    if watch.lost is not None:
        why = f"{worker_line(job, watch.lost)}, and the other workers were ended"
        raise ProbeFailed(why, config.hardware.name)
    return job


class ProbeFailed(Exception):
    """The probe ended without a profile for a reason it can name (a worker that died, its
    time limit): a failed measurement, not a bug, so it ends as a failed cell does (exit status
    1, `harness.cli.cell_results`). What it leaves is kept: its directory, with its workers'
    logs, and the hardware's latest profile, which no partial probe replaces."""

    def __init__(self, why: str, hardware: str) -> None:
        super().__init__(
            f"the probe failed: {why}; no profile was written (the latest for "
            f"hardware={hardware} is unchanged)"
        )


def record_profile(profile: HardwareProfile, config: DistbenchConfig, output_dir: Path) -> Path:
    """Keep the profile as the hardware's latest and log it to MLflow; return the kept path."""
    latest = profile.save(profile_path(Path(config.run.output_dir), profile.hardware))
    if config.tracking.enabled:
        metrics = {"workers": float(profile.workers)}
        latencies = [link.cost.latency_s * 1e6 for link in profile.links]
        bandwidths = [link.cost.bandwidth_bytes_per_s / 1e6 for link in profile.links]
        if profile.links:  # measured where a registered model declares point-to-point
            metrics.update(
                {
                    "link_latency_us_max": max(latencies),
                    "link_latency_us_min": min(latencies),
                    "link_bandwidth_mbps_min": min(bandwidths),
                    "link_bandwidth_mbps_max": max(bandwidths),
                }
            )
        for entry in profile.allreduce:
            metrics[f"allreduce_latency_us_w{entry.workers}"] = entry.cost.latency_s * 1e6
            metrics[f"allreduce_bandwidth_mbps_w{entry.workers}"] = (
                entry.cost.bandwidth_bytes_per_s / 1e6
            )
        if COMPUTE_LOST_FACT in profile.facts:
            metrics[COMPUTE_LOST_FACT] = float(profile.facts[COMPUTE_LOST_FACT])
        rounds = profile.facts.get(ROUNDS_FACT)
        if rounds is not None:
            metrics["rounds"] = float(rounds["rounds"])
            spread = largest_spread(rounds)
            if spread is not None:
                metrics["rounds_spread_max"] = spread
        try:
            log_run(
                uri=tracking_uri(config.tracking.uri, config.run.output_dir),
                experiment=EXPERIMENT,
                run_name=f"probe-{profile.hardware}",
                params=probe_params(config),
                metrics=metrics,
                tags={
                    "hardware": profile.hardware,
                    "output_dir": str(output_dir),
                    "machine": str(profile.facts.get("machine")),
                },
                artifacts=[output_dir / PROFILE_FILE],
            )
        except Exception as err:  # noqa: BLE001 - the profile on disk is the result
            log.warning("MLflow could not record the probe (%s); profile kept in %s", err, latest)
    return latest


def probe_params(config: DistbenchConfig) -> dict[str, Any]:
    """The parts of the config that describe a probe: the hardware and the probe settings."""
    return {"hardware": asdict(config.hardware), "probe": asdict(config.probe)}


# How the summary names each collective timed after compute.
_AFTER_COMPUTE_NAMES = {
    Collective.all_gather: "an all-gather",
    Collective.reduce_scatter: "a reduce-scatter",
}


def summary(profile: HardwareProfile) -> str:
    lines = [
        f"hardware {profile.hardware}: {profile.workers} workers on {profile.nodes} "
        f"node(s), {profile.facts.get('backend')} on {profile.facts.get('device')}"
        + (f" ({profile.facts['machine']})" if profile.facts.get("machine") else ""),
        f"{'link':<10} {'same node':>9} {'latency us':>11} {'bandwidth MB/s':>15}",
    ]
    for link in profile.links:
        lines.append(
            f"{link.src:>3} -> {link.dst:<3} {str(link.same_node):>9} "
            f"{link.cost.latency_s * 1e6:>11.1f} "
            f"{link.cost.bandwidth_bytes_per_s / 1e6:>15.1f}"
        )
    for entry in profile.allreduce:
        lines.append(
            f"allreduce among {entry.workers}: latency "
            f"{entry.cost.latency_s * 1e6:.1f} us, bandwidth "
            f"{entry.cost.bandwidth_bytes_per_s / 1e6:.1f} MB/s"
        )
    if ROUNDS_FACT in profile.facts:
        lines.append(spread_line(profile.facts[ROUNDS_FACT]))
    if COMPUTE_LOST_FACT in profile.facts:
        lines.append(
            f"an allreduce between nodes takes {profile.facts[COMPUTE_LOST_FACT]:.2f} "
            f"ms of a worker's compute per MB, beside it"
        )
    after = profile.facts.get(COLLECTIVES_AFTER_COMPUTE_FACT)
    if after:  # the collectives a model prices its own from, as measured after compute
        largest = max(range(len(after["bytes"])), key=lambda i: after["bytes"][i])
        timed = [
            (_AFTER_COMPUTE_NAMES[collective], after[collective.value][largest])
            for collective in AFTER_COMPUTE
            if collective.value in after
        ]
        if timed:
            (first, seconds), rest = timed[0], timed[1:]
            lines.append(
                f"after {after['compute_before_ms']:.0f} ms of compute, {first} of "
                f"{after['bytes'][largest] / 1e6:.1f} MB among {after['workers']} takes "
                f"{seconds * 1e3:.1f} ms"
                + "".join(f", {name} {taken * 1e3:.1f} ms" for name, taken in rest)
            )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    return overrides_parser("python -m harness.probe", __doc__)


@command
def main(argv: list[str] | None = None) -> None:
    overrides = overrides_of(parser(), argv)
    with exit_on_bad_input():
        cfg = compose_config(overrides, with_hydra=True)
        config = validate(cfg)
        if config.hardware.world_size < 2:
            raise ConfigError(
                f"hardware={config.hardware.name} is invalid for the probe: it has "
                f"{config.hardware.world_size} worker; allowed: hardware with 2 or more "
                f"(hardware.nodes x hardware.workers_per_node)"
            )
        launcher = slurm_launcher_settings(cfg)
        check_launcher(cfg.hydra, sweep=launcher is not None)
        if launcher is None:  # the probe's workers run here
            check_device_here(config)
        check_writable_dir("run.output_dir", config.run.output_dir)  # the profile goes there
    log_to_stderr()
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    output_dir = (Path(config.run.output_dir) / "probes" / config.hardware.name / stamp).resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        profile = launch_probe(without_hydra(cfg), config, output_dir, launcher)
    except ProbeFailed as failed:
        print(f"distbench: {single_line(str(failed))}", file=sys.stderr, flush=True)
        sys.exit(FAILED_CELLS_EXIT_CODE)
    latest = record_profile(profile, config, output_dir)
    print(summary(profile))
    if config.hardware.link is not None:
        print(link_check(profile, config.hardware.link))
    print(f"profile: {output_dir / PROFILE_FILE} (latest for {profile.hardware}: {latest})")


def link_check(profile: HardwareProfile, link: LinkEmulation) -> str:
    """The links between nodes as measured, against the rate they are shaped to."""
    rate = link.bytes_per_s / 1e6
    measured = [
        entry.cost.bandwidth_bytes_per_s / 1e6 for entry in profile.links if not entry.same_node
    ]
    if not measured:
        return f"links shaped to {link.rate_mbit:g} Mbit/s ({rate:.1f} MB/s): none probed"
    worst = max(measured, key=lambda value: abs(value / rate - 1))
    return (
        f"links shaped to {link.rate_mbit:g} Mbit/s ({rate:.1f} MB/s): measured "
        f"{min(measured):.1f}-{max(measured):.1f} MB/s (at most {worst / rate - 1:+.1%} "
        f"off the rate)"
    )


def slurm_launcher_settings(cfg: DictConfig) -> dict[str, Any] | None:
    """The SLURM launcher's settings when `hydra/launcher=submitit_slurm` was chosen."""
    from omegaconf import OmegaConf

    launcher = cfg.hydra.launcher
    if not str(launcher.get("_target_", "")).endswith("SlurmCellsLauncher"):
        return None
    container = OmegaConf.to_container(launcher, resolve=False)
    assert isinstance(container, dict)
    settings = {str(key): value for key, value in container.items()}
    settings["name"] = "distbench-probe"
    return settings


if __name__ == "__main__":
    main()
