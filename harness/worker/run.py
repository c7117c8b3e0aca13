"""One grid cell, end to end: validate, build, warm up, time the epochs, record.

`run_cell` is a plain function of a composed config, so tests and launchers call it the same
way `python -m harness` does. Whatever happens inside the measurement (an out-of-memory error,
a crash), the cell ends with a result.json and an MLflow run that say so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import logging
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch.distributed.tensor import DTensor

from harness.config.schema import DistbenchConfig, RunConfig
from harness.distributions.base import EpochMeasurement, Trainer, TrainingContext
from harness.distributions.registry import spec_of
from harness.measure.allocator import keep_freed_memory
from harness.measure.metrics import PeakMemory, PhaseClock, RepeatStatistics, Summary
from harness.measure.steadiness import Steadiness, memory_reference_seconds, reference_seconds
from harness.records.cell import CheckedCell
from harness.records.eventlog import EventLog, RunFacts, precision_name
from harness.records.outcome import merge_rank_reports, new_result, now, record_failure
from harness.records.record import CONFIG_FILE, keep_logging_when_the_disk_fails, record
from harness.records.results import (
    RESULT_FILE,
    RepeatResult,
    RunStatus,
    write_group_formed,
    write_rank_report,
    write_worker_presence,
)
from harness.runtime.distributed import Peers, joined_peers
from harness.runtime.environment import start_conditions
from harness.runtime.evaluation import Evaluation, evaluate
from harness.runtime.seeding import repeat_seed, seed_everything, set_deterministic
from harness.runtime.workload import Workload, build_workload
from harness.system.processes import this_process
from harness.system.worker_env import WorkerEnvironment, worker_environment
from harness.worker.divergence import (
    DivergedError,
    check_finite_eval_loss,
    check_finite_losses,
)
from harness.worker.interruption import (
    add_measured_epochs,
    interrupted_error,
    launcher_interrupted_by,
    signal_exit_code,
    signal_name,
    under_launcher,
)
from harness.worker.memory_limit import (
    MemoryLimit,
    device_memory_limit,
    lift_memory_limit,
    oom_error,
)
from harness.worker.watchdog import ProgressWatchdog
from workloads.networks import build_network
from workloads.progress import Progress, steps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RepeatOutcome:
    """How one repeat ended, the same on every worker (evaluations are summed over them)."""

    epochs: int  # epochs trained: run.epochs, or fewer when the target was reached earlier
    evaluations: list[Evaluation]  # one per epoch; empty when run.eval is off
    # run_start to run_stop: the training and the evaluations, not the initialisation
    # (MLPerf's score when the target was reached).
    run_seconds: float
    reached_target: bool | None = None  # None: no run.target_accuracy


@dataclass(frozen=True)
class WorkerMeasurement:
    """What one worker measured; rank 0 gathers these from every worker."""

    epochs: list[EpochMeasurement]  # every repeat's timed epochs, repeat after repeat
    seeds: list[int]  # the seed of each repeat
    peak_memory_mb: float
    memory_kind: str
    parameter_digest: str  # sha256 of the trained parameters: replicas must agree
    # Workers with the same replica_group hold replicas of the same parameters (all workers of
    # a data-parallel cell; the replicas of one stage of a pipeline).
    replica_group: int = 0
    # What only some distribution models measure (e.g. a pipeline's bubble per stage); a key
    # that several workers report is averaged over them.
    extra_metrics: dict[str, float] = field(default_factory=dict)
    # Config values the trainer resolved (e.g. a pipeline's balance); recorded into the
    # result's config, as the batch size from Table 3.3 is.
    resolved_config: dict[str, Any] = field(default_factory=dict)
    outcomes: list[RepeatOutcome] = field(default_factory=list)  # one per repeat
    # MB the node's link and its loopback carried while the process group was open
    # (harness.runtime.distributed.NodeLink.traffic), reported by the first worker of each node
    # of a cell spanning nodes.
    link_traffic: dict[str, float] = field(default_factory=dict)
    # The reference kernel's seconds before the trainer was built and after it finished
    # (harness.measure.steadiness): how much this worker's machine changed speed meanwhile.
    reference_seconds: tuple[float, float] = (0.0, 0.0)
    # The memory-bound reference kernel's, timed with it.
    memory_reference_seconds: tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True)
class Measurement:
    """A cell's measurement over all its workers, as the job sees it."""

    workers: list[WorkerMeasurement]  # in rank order
    # Predictions one sample adds to the loss: 1 for an image, seq_len for a token sequence.
    tokens_per_sample: int = 1
    steadiness_threshold: float = 0.10  # run.steadiness_threshold

    def steadiness(self) -> Steadiness:
        return Steadiness(
            reference_before=[w.reference_seconds[0] for w in self.workers],
            reference_after=[w.reference_seconds[1] for w in self.workers],
            repeat_epochs=self.repeat_epoch_seconds(),
            threshold=self.steadiness_threshold,
            memory_before=[w.memory_reference_seconds[0] for w in self.workers],
            memory_after=[w.memory_reference_seconds[1] for w in self.workers],
        )

    @property
    def seeds(self) -> list[int]:
        return self.workers[0].seeds  # every worker seeds alike

    @property
    def outcomes(self) -> list[RepeatOutcome]:
        return self.workers[0].outcomes  # every worker saw the same

    def epoch_seconds(self) -> list[float]:
        """An epoch lasts until its slowest worker is done."""
        return [
            max(worker.epochs[e].seconds for worker in self.workers)
            for e in range(len(self.workers[0].epochs))
        ]

    def _per_repeat(self, per_epoch: list[float]) -> list[list[float]]:
        """A per-epoch list cut into one list per repeat (a repeat that reached its target
        early has fewer epochs)."""
        sizes = [outcome.epochs for outcome in self.outcomes] or [
            len(per_epoch) // len(self.seeds)
        ] * len(self.seeds)
        bounds = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
        return [per_epoch[bounds[k] : bounds[k + 1]] for k in range(len(sizes))]

    def repeat_epoch_seconds(self) -> list[list[float]]:
        """`epoch_seconds`, one list per repeat."""
        return self._per_repeat(self.epoch_seconds())

    def repeat_seconds_per_epoch(self) -> list[float]:
        """Each repeat's seconds per epoch: the mean of its epochs."""
        return [statistics.fmean(epochs) for epochs in self.repeat_epoch_seconds()]

    def train_losses(self) -> list[float]:
        """Each epoch's mean training loss over its batches. A batch's loss is the mean of the
        workers that computed one for it (data-parallel shards of equal size: the loss of the
        whole batch; a pipeline: its last stage's)."""
        losses = []
        for e in range(len(self.workers[0].epochs)):
            per_batch: dict[int, list[float]] = {}
            for worker in self.workers:
                for batch, loss in worker.epochs[e].batch_losses.items():
                    per_batch.setdefault(batch, []).append(loss)
            if per_batch:
                losses.append(statistics.fmean(statistics.fmean(v) for v in per_batch.values()))
        return losses

    def evaluations(self) -> list[Evaluation]:
        return [evaluation for outcome in self.outcomes for evaluation in outcome.evaluations]

    def repeats(self) -> list[RepeatResult]:
        results = []
        for k, (seed, mean, epochs) in enumerate(
            zip(self.seeds, self.repeat_seconds_per_epoch(), self.repeat_epoch_seconds())
        ):
            outcome = self.outcomes[k] if self.outcomes else None
            last = outcome.evaluations[-1] if outcome and outcome.evaluations else None
            reached = outcome.reached_target if outcome else None
            results.append(
                RepeatResult(
                    repeat=k,
                    seed=seed,
                    seconds_per_epoch=mean,
                    epoch_seconds=epochs,
                    eval_accuracy=last.accuracy if last else None,
                    reached_target=reached,
                    time_to_target_s=outcome.run_seconds if outcome and reached else None,
                    epochs_to_target=outcome.epochs if outcome and reached else None,
                )
            )
        return results

    def phase_seconds(self) -> dict[str, list[float]]:
        """Seconds per phase per epoch, averaged over the workers."""
        phases = self.workers[0].epochs[0].phase_seconds
        return {
            phase: [
                statistics.fmean(w.epochs[e].phase_seconds[phase] for w in self.workers)
                for e in range(len(self.workers[0].epochs))
            ]
            for phase in phases
        }

    def replica_digests(self) -> dict[int, set[str]]:
        """Parameter digests per replica group; in sync when each group has one."""
        groups: dict[int, set[str]] = {}
        for worker in self.workers:
            groups.setdefault(worker.replica_group, set()).add(worker.parameter_digest)
        return groups

    def extra_metrics(self) -> dict[str, float]:
        """The workers' extra metrics, each averaged over the workers that report it."""
        values: dict[str, list[float]] = {}
        for worker in self.workers:
            for key, value in worker.extra_metrics.items():
                values.setdefault(key, []).append(value)
        return {key: statistics.fmean(reported) for key, reported in values.items()}

    def link_traffic(self) -> dict[str, float]:
        """MB over the nodes' links and their loopbacks, summed over the nodes (a cell spanning
        nodes; empty otherwise): what shows which network the cell's traffic took."""
        totals: dict[str, float] = {}
        for worker in self.workers:
            for key, megabytes in worker.link_traffic.items():
                totals[key] = totals.get(key, 0.0) + megabytes
        return totals

    def metrics(self) -> dict[str, float]:
        epoch_seconds = self.epoch_seconds()
        seconds = Summary.of(epoch_seconds)
        samples_per_epoch = sum(worker.epochs[0].samples for worker in self.workers)
        metrics = {
            "seconds_per_epoch": seconds.mean,
            "seconds_per_epoch_median": seconds.median,
            "seconds_per_epoch_std": seconds.std,
            "seconds_per_epoch_min": seconds.min,
            "seconds_per_epoch_max": seconds.max,
            "images_per_second": samples_per_epoch * len(epoch_seconds) / sum(epoch_seconds),
            # Language models are compared in tokens/s: samples/s x tokens per sample (an
            # image counts 1, so for images it equals images_per_second).
            "tokens_per_second": samples_per_epoch
            * len(epoch_seconds)
            / sum(epoch_seconds)
            * self.tokens_per_sample,
            "samples_per_epoch": float(samples_per_epoch),
            "batches_per_epoch": float(self.workers[0].epochs[0].batches),
            "world_size": float(len(self.workers)),
            "peak_memory_mb": max(worker.peak_memory_mb for worker in self.workers),
        }
        metrics.update(repeat_metrics(self.repeat_seconds_per_epoch()))
        if len(self.workers) > 1:
            for rank, worker in enumerate(self.workers):
                metrics[f"peak_memory_mb_rank{rank}"] = worker.peak_memory_mb
            # Replicas that drifted apart would make the timings meaningless.
            metrics["replicas_in_sync"] = float(
                all(len(digests) == 1 for digests in self.replica_digests().values())
            )
        metrics.update(self.extra_metrics())
        metrics.update(self.link_traffic())
        metrics.update(self.steadiness().metrics())
        for phase, per_epoch in self.phase_seconds().items():
            metrics[f"{phase}_seconds_per_epoch"] = statistics.fmean(per_epoch)
        metrics.update(quality_metrics(self.repeats(), self.evaluations(), self.train_losses()))
        return metrics


def quality_metrics(
    repeats: list[RepeatResult], evaluations: list[Evaluation], train_losses: list[float]
) -> dict[str, float]:
    """What the training achieved: the last epoch's training loss; with evaluation, the final
    eval accuracy and loss (means over the repeats' last evaluations) and the seconds an
    evaluation takes; with a target, whether every repeat reached it and, if so, the time and
    epochs to it (mean, spread, and from 5 repeats MLPerf's olympic mean)."""
    metrics: dict[str, float] = {}
    if train_losses:
        metrics["train_loss"] = train_losses[-1]
    if evaluations:
        finals = [r.eval_accuracy for r in repeats if r.eval_accuracy is not None]
        metrics["eval_accuracy"] = statistics.fmean(finals)
        metrics["eval_loss"] = evaluations[-1].loss
        metrics["eval_samples"] = float(evaluations[-1].samples)
        metrics["eval_seconds"] = statistics.fmean(e.seconds for e in evaluations)
    if any(r.reached_target is not None for r in repeats):
        reached = all(r.reached_target for r in repeats)
        metrics["reached_target"] = float(reached)
        if reached:
            for name in ("time_to_target_s", "epochs_to_target"):
                stats = RepeatStatistics.of([float(getattr(r, name)) for r in repeats])
                metrics[name] = stats.mean
                if stats.n > 1:
                    metrics[f"{name}_std"] = stats.std
                if stats.trimmed_mean is not None:
                    metrics[f"{name}_olympic_mean"] = stats.trimmed_mean
    return metrics


def repeat_metrics(repeat_seconds: list[float]) -> dict[str, float]:
    """The repeats' statistics of seconds per epoch: `repeats` always; the spread over the
    repeats and the 95 % confidence interval of their mean from 2 repeats on; the trimmed mean
    from 5 on. (`seconds_per_epoch` itself, the mean, equals the repeats' mean: every repeat
    times the same number of epochs.)"""
    stats = RepeatStatistics.of(repeat_seconds)
    metrics = {"repeats": float(stats.n)}
    if stats.ci95_low is not None and stats.ci95_high is not None:
        metrics["seconds_per_epoch_repeat_std"] = stats.std
        metrics["seconds_per_epoch_ci95_low"] = stats.ci95_low
        metrics["seconds_per_epoch_ci95_high"] = stats.ci95_high
    if stats.trimmed_mean is not None:
        metrics["seconds_per_epoch_trimmed_mean"] = stats.trimmed_mean
    return metrics


def select_device(config: DistbenchConfig, local_rank: int = 0) -> torch.device:
    """The configured device; a missing CUDA device is a configuration error, not a fallback."""
    if config.hardware.device.value == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "hardware.device='cuda' but torch sees no CUDA device here; "
                "allowed on this machine: cpu"
            )
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def measure(
    config: DistbenchConfig,
    device: torch.device,
    peers: Peers,
    heartbeat: Callable[[], None],
    events: EventLog,
    measured: list[EpochMeasurement] | None = None,
) -> WorkerMeasurement:
    """Build this worker's workload, warm up, then train and time `run.repeats` repeats of
    `run.epochs` epochs, evaluating after each epoch (`run.eval`).

    The repeats share this worker's process, process group, network and trainer, built and
    warmed up once (MLPerf's untimed initialisation): building a trainer again would re-run
    Horovod's rendezvous and `hvd.init()` (once per process), a pipeline's profiling and plan
    (which could then differ between repeats) and its process groups. Each repeat is an
    independent run: it starts from the optimizer state the trainer was built with
    (`Trainer.reset`, which also undoes what warm-up trained, as MLPerf requires) and from the
    initial weights of its seed (`initialise_weights`), and its seed controls everything random
    during training: the data order and the RNGs of Python, NumPy and torch.

    `measured`, if given, receives each timed epoch as it ends: what an interrupted cell keeps.
    """
    if config.hardware.cpu_threads is not None:
        torch.set_num_threads(config.hardware.cpu_threads)
    events.init_start()
    # A pipeline feeds every batch through all its workers: its data is not sharded by worker.
    shards = config.distribution.data_shards(config)
    shard = config.distribution.data_shard_of(config, peers.env.rank)
    workload = build_workload(config, rank=shard, world_size=shards)
    progress = EpochProgress(
        enabled=config.run.progress and peers.env.is_main, batches=len(workload.loader)
    )

    def beat() -> None:  # after every batch, warm-up included
        heartbeat()
        progress.update()

    context = TrainingContext(
        config=config,
        workload=workload,
        device=device,
        clock=PhaseClock(device, enabled=config.run.phase_timing),
        peers=peers,
        heartbeat=beat,
    )
    speed_before = machine_speed(device, peers)  # before the trainer starts anything
    trainer = spec_of(config).trainer(context)
    progress.batches = trainer.worker_batches(progress.batches)
    memory = PeakMemory(device)
    memory.reset()
    if config.run.warmup_batches:  # a phase of its own before the first timed epoch
        log.info("warm-up: %d batch(es), not timed", config.run.warmup_batches)
    trainer.warm_up(config.run.warmup_batches)
    events.init_stop(config, run_facts(config, workload, trainer))
    epochs, seeds, outcomes = [], [], []
    for repeat in range(config.run.repeats):
        seeds.append(repeat_seed(config.run.seed, repeat))
        trained, outcome = train_repeat(
            config, context, trainer, repeat, seeds[-1], events, progress, measured
        )
        epochs += trained
        outcomes.append(outcome)
    trainer.finish()
    with memory.left_out():  # the reference kernel's memory is no part of the cell's
        speed_after = machine_speed(device, peers)
    return WorkerMeasurement(
        epochs=epochs,
        seeds=seeds,
        peak_memory_mb=memory.peak_mb(),
        memory_kind=memory.kind,
        parameter_digest=parameter_digest(workload.model),
        replica_group=trainer.replica_group,
        extra_metrics=trainer.extra_metrics(),
        resolved_config=trainer.resolved_config(),
        outcomes=outcomes,
        reference_seconds=(speed_before[0], speed_after[0]),
        memory_reference_seconds=(speed_before[1], speed_after[1]),
    )


def machine_speed(device: torch.device, peers: Peers) -> tuple[float, float]:
    """The reference kernels' seconds (`harness.measure.steadiness`: the matrix products, then
    the memory-bound one). The products are timed by the cell's workers together: none times
    them while another still builds its trainer or finishes it (a Horovod worker's background
    thread runs from `hvd.init` to `hvd.shutdown`, on the cores the others time their kernel
    on: with it, 4 of 8 Horovod cells were still flagged). The memory-bound kernel is timed by
    one worker at a time, the others waiting at a barrier: two streams at once share the
    memory bandwidth, and how much of their trials overlapped read as drift (28 to 46 ms for
    the same two workers of one cell, before and after)."""
    peers.barrier()
    compute = reference_seconds(device)
    memory = 0.0
    for turn in range(peers.env.world_size):
        peers.barrier()
        if turn == peers.env.rank:
            memory = _memory_kernel_seconds(device)
    peers.barrier()  # nobody goes on to build or record while the last one times it
    return compute, memory


def _memory_kernel_seconds(device: torch.device) -> float:
    """The memory-bound kernel's seconds, or 0 (not timed) where its arrays do not fit: it is
    recorded, not judged, and a cell under a tight `hardware.device_memory_gb` whose training
    fitted must not end `oom` for the 192 MB of arrays it asks for after its last epoch (the
    allocator keeps what training freed, `harness.measure.allocator`)."""
    try:
        return memory_reference_seconds(device)
    except (RuntimeError, MemoryError) as error:
        if classify_failure(error) is not RunStatus.oom:
            raise
        log.info("the memory-bound reference kernel was not timed: %s", str(error).splitlines()[0])
        return 0.0


def run_facts(config: DistbenchConfig, workload: Workload, trainer: Trainer) -> RunFacts:
    """What the MLPerf log states about the run: the splits' sizes, the plan the trainer
    resolved, the lowest precision the layers compute in (the parameters' dtype unless mixed
    precision computes in another), and the config file the cell records."""
    dtype = trainer.compute_dtype() or next(workload.model.parameters()).dtype
    return RunFacts(
        train_samples=len(workload.loader.dataset),  # type: ignore[arg-type]
        eval_samples=len(workload.eval_dataset) if workload.eval_dataset is not None else 0,  # type: ignore[arg-type]
        resolved=trainer.resolved_config(),
        precision=precision_name(dtype),
        config_file=CONFIG_FILE,
    )


def train_repeat(
    config: DistbenchConfig,
    context: TrainingContext,
    trainer: Trainer,
    repeat: int,
    seed: int,
    events: EventLog,
    progress: EpochProgress | None = None,
    measured: list[EpochMeasurement] | None = None,
) -> tuple[list[EpochMeasurement], RepeatOutcome]:
    """One repeat, MLPerf's run: from the trainer's initial weights, seed every RNG and the data
    order with `seed`, then train and time up to `run.epochs` epochs (numbered from 0 in each
    repeat: the data order is a function of (seed, epoch); the log and the progress bar count
    them from 1, `epoch_label`), evaluating after each one outside its time; stop at the first
    evaluation that reaches `run.target_accuracy`."""
    run = config.run
    trainer.reset()
    if repeat > 0:  # repeat 0 starts from the weights the trainer was built with (run.seed's)
        initialise_weights(context.workload, config, seed, trainer)
    seed_everything(seed)
    context.workload.loader.reseed(seed)
    events.run_start(repeat, seed)
    started = time.perf_counter()
    epochs: list[EpochMeasurement] = []
    evaluations: list[Evaluation] = []
    reached = None if run.target_accuracy is None else False
    progress = progress or EpochProgress(enabled=False, batches=0)
    for epoch in range(run.epochs):
        label = epoch_label(run, repeat, epoch)
        events.epoch_start(repeat, epoch)
        with progress.epoch(label):
            epochs.append(trainer.train_epoch(epoch))
        if measured is not None:
            measured.append(epochs[-1])
        events.epoch_stop(repeat, epoch)
        log.info(
            "%s: %.3f s (%d %s)%s",
            label,
            epochs[-1].seconds,
            epochs[-1].samples,
            sample_unit(context.config),
            _whose_epoch(context),
        )
        check_finite_losses(epochs[-1].batch_losses, label)
        if context.workload.eval_dataset is None:
            continue
        evaluations.append(evaluate_epoch(context, trainer, events, repeat, epoch))
        check_finite_eval_loss(
            evaluations[-1].loss,
            label,
            context.config.distribution.step_batch(context.config),
            context.workload.model,
        )
        if run.target_accuracy is not None and evaluations[-1].accuracy >= run.target_accuracy:
            reached = True
            break
    outcome = RepeatOutcome(
        epochs=len(epochs),
        evaluations=evaluations,
        run_seconds=time.perf_counter() - started,
        reached_target=reached,
    )
    events.run_stop(repeat, success=reached is not False)
    if reached is not None:
        log.info(
            "repeat %d/%d: %s",
            repeat + 1,
            run.repeats,
            f"reached eval accuracy {run.target_accuracy} after {outcome.epochs} epoch(s), "
            f"{outcome.run_seconds:.2f} s"
            if reached
            else f"did not reach eval accuracy {run.target_accuracy} in {run.epochs} epoch(s)",
        )
    return epochs, outcome


def initialise_weights(
    workload: Workload, config: DistbenchConfig, seed: int, trainer: Trainer | None = None
) -> None:
    """Give the network the initial weights of a network built from `seed`, as an independent
    run with that seed starts (MLPerf seeds each run's initialisation too). Every worker builds
    the same weights from the same seed, in the form the trainer trains them
    (`Trainer.in_trained_form`); the values are copied into the trainer's own tensors (a
    pipeline's stages share the workload model's modules), so nothing is rebuilt. Tensors this
    worker freed (another pipeline stage's, on the meta device) stay as they are."""
    seed_everything(seed)
    built = build_network(config.network.ref, workload.spec)
    fresh = (trainer.in_trained_form(built) if trainer is not None else built).state_dict()
    with torch.no_grad():
        workload.model.load_state_dict(
            {
                name: target if target.is_meta else _placed_like(target, fresh[name])
                for name, target in workload.model.state_dict().items()
            }
        )


def _placed_like(target: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`value` laid out as `target` is: a sharded parameter (FSDP2's DTensor) gets its own
    shard of the whole value every worker built alike; a plain tensor stays as it is."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(target, DTensor):
        return value
    return distribute_tensor(value.to(target.device), target.device_mesh, target.placements)


def evaluate_epoch(
    context: TrainingContext, trainer: Trainer, events: EventLog, repeat: int, epoch: int
) -> Evaluation:
    """Evaluate the network as trained so far on the held-out split (every worker takes part)."""
    assert context.workload.eval_dataset is not None
    events.eval_start(repeat, epoch)
    started = time.perf_counter()
    evaluation = evaluate(
        trainer.evaluation_model(),
        context.workload.eval_dataset,
        batch_size=context.config.batch_size,
        peers=context.peers,
        device=context.device,
        heartbeat=context.heartbeat,
        started=started,
    )
    events.eval_stop(repeat, epoch, accuracy=evaluation.accuracy, loss=evaluation.loss)
    log.info(
        "%s: eval accuracy %.4f, loss %.4f (%d %s, %.2f s)",
        epoch_label(context.config.run, repeat, epoch),
        evaluation.accuracy,
        evaluation.loss,
        evaluation.samples,
        sample_unit(context.config),
        evaluation.seconds,
    )
    return evaluation


def _whose_epoch(context: TrainingContext) -> str:
    """Which worker's epoch a log line times, where the cell has several: the cell's epoch
    time, in its summary, is its slowest worker's."""
    env = context.peers.env
    if env.world_size <= 1:
        return ""
    return (
        f" on worker {env.rank} of {env.world_size} (the cell's epoch time, in its summary, "
        f"is its slowest worker's)"
    )


def epoch_label(run: RunConfig, repeat: int, epoch: int) -> str:
    """An epoch as the log line and the progress bar both name it, counted from 1: "epoch 1/2",
    or "repeat 2/3, epoch 1/2" in a cell of several repeats."""
    of_repeats = f"repeat {repeat + 1}/{run.repeats}, " if run.repeats > 1 else ""
    return f"{of_repeats}epoch {epoch + 1}/{run.epochs}"


def sample_unit(config: DistbenchConfig) -> str:
    """What a sample of the cell is, for the log lines: images, or token sequences."""
    return "sequences" if config.dataset.spec.tokens else "images"


class EpochProgress:
    """Rank 0's progress over the batches of the epoch being timed (`run.progress`): a bar on
    a terminal, else a line every half minute of a long epoch (`workloads.progress`).

    Driven by the trainer's heartbeat, which every distribution model calls after each batch
    (each minibatch a PipeDream worker finishes), so every model shows the same bar; the
    warm-up's batches, outside `epoch`, do not count. `batches` is the bar's total: the
    batches this worker trains in an epoch."""

    def __init__(self, *, enabled: bool, batches: int) -> None:
        self.enabled = enabled
        self.batches = batches
        self._bar: Progress | None = None

    @contextlib.contextmanager
    def epoch(self, label: str) -> Iterator[None]:
        # leave=False: the epoch's log line takes the bar's place once the epoch is timed; in
        # a file that line follows the epoch, so a line of progress only for a long one.
        with steps(
            self.batches,
            label,
            "batch",
            enabled=self.enabled,
            mininterval=1.0,
            first_line_s=30.0,
            every_s=30.0,
        ) as self._bar:
            try:
                yield
            finally:
                self._bar = None

    def update(self) -> None:
        if self._bar is not None:
            self._bar.update()


def parameter_digest(model: torch.nn.Module) -> str:
    """sha256 over the bytes of every parameter this worker holds, in order (taken after the
    timed epochs); of this worker's shard where a parameter is sharded over workers (a
    DTensor)."""
    digest = hashlib.sha256()
    for parameter in model.parameters():
        if parameter.is_meta:  # another pipeline stage's, freed on this worker
            continue
        local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
        # as raw bytes: NumPy has no bfloat16
        digest.update(
            local.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        )
    return digest.hexdigest()


def classify_failure(error: BaseException) -> RunStatus:
    """Out-of-memory errors (CUDA's, the CPU allocator's, Python's, a failed mmap's ENOMEM,
    C++'s bad_alloc) are `oom`; a collective that timed out is `timeout`; anything else
    `failed`; a loss that stopped being finite is `diverged`."""
    if isinstance(error, DivergedError):
        return RunStatus.diverged
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return RunStatus.oom
    text = str(error).lower()
    if any(
        sign in text
        for sign in (
            "out of memory",
            "can't allocate memory",
            "cannot allocate memory",
            "bad_alloc",
        )
    ):
        return RunStatus.oom
    if "timed out" in text:  # a collective whose peer never answered (gloo, NCCL watchdog)
        return RunStatus.timeout
    return RunStatus.failed


def run_cell(cell: CheckedCell, output_dir: Path | None = None) -> dict[str, Any]:
    """Measure one grid cell on this worker and, on rank 0, record it; return the result.

    Every worker of a cell calls this, with the config its entry point checked
    (harness.records.cell.check_cell). Errors during the measurement do not raise: they end up in
    the result with status `oom`, `failed` or `timeout`, and each worker that fails leaves a rank
    report.
    """
    config = cell.config
    keep_freed_memory()  # every step pays no page faults for memory freed by the last one
    env = worker_environment()
    output_dir = Path(output_dir or _hydra_output_dir() or _fresh_run_dir(config))
    started = now()
    machine_at_start = start_conditions()  # before this cell loads the machine itself
    device = torch.device("cpu")
    status, error, measurement = RunStatus.ok, None, None
    memory_limit: MemoryLimit | None = None
    events: EventLog | None = None
    measured: list[EpochMeasurement] = []  # the timed epochs so far, kept if interrupted
    interrupted: int | None = None  # the exit status of the signal that ended the cell
    interrupted_by: str | None = None  # that signal's name (its launcher's, in a sweep)
    link_shaping: str | None = None  # how an emulated node's link was shaped (hardware.link)
    keep_logging_when_the_disk_fails()
    if env.is_distributed and not env.is_main:  # rank 0 waits for no report of a peer seen gone
        write_worker_presence(output_dir, env.rank, this_process())

    def report_stall(report: str) -> None:
        """Runs in the watchdog's thread while the measuring thread is stuck; the process
        ends when this returns (or after harness.worker.watchdog.STALL_RECORD_S)."""
        write_rank_report(output_dir, env.rank, RunStatus.timeout, report)
        if env.is_distributed:
            return  # the launcher records the cell from all its workers' reports
        # A cell of one worker is recorded by itself, also under no launcher (`python -m
        # harness` without -m). The stuck thread cannot lift its memory limit: lift it here.
        lift_memory_limit()
        record_failure(cell, output_dir, RunStatus.timeout, report, started=started)

    # Collectives give up after progress_timeout_s and the cell records itself; the watchdog
    # is the backstop for a worker stuck where no collective times out.
    watchdog_s = 1.25 * config.run.progress_timeout_s + 5
    with ProgressWatchdog(watchdog_s, on_stall=report_stall) as watchdog:
        try:
            _check_world_size(config, env)
            set_deterministic(config.run.deterministic)  # before the first CUDA kernel
            device = select_device(config, env.local_rank)
            # On a CPU, hardware.device_memory_gb is enforced while the cell is measured
            # (harness.worker.memory_limit), and lifted before anything is recorded.
            with (
                device_memory_limit(config.hardware) as memory_limit,
                joined_peers(
                    env,
                    device,
                    backend=config.distribution.backend,
                    timeout_s=config.run.progress_timeout_s,
                    link=config.hardware.link,
                ) as peers,
            ):
                if env.is_distributed and env.is_main:
                    write_group_formed(output_dir, env.world_size)
                events = EventLog.for_worker(output_dir, env.is_main)
                with events:
                    worker = measure(config, device, peers, watchdog.beat, events, measured)
                if peers.link is not None and env.local_rank == 0:
                    worker = dataclasses.replace(worker, link_traffic=peers.link.traffic())
                    link_shaping = peers.link.shaping
                measurement = Measurement(
                    peers.all_gather(worker),
                    tokens_per_sample=config.dataset.spec.tokens_per_sample,
                    steadiness_threshold=config.run.steadiness_threshold,
                )
        except Exception as err:  # noqa: BLE001 - a failing cell is a result, not a crash
            status, error = classify_failure(err), traceback.format_exc()
            if status is RunStatus.diverged:
                error = str(err)  # where and the value: not a bug, no traceback
            if status is RunStatus.oom and config.hardware.device.value == "cpu":
                # One line says it all; the traceback stays in this worker's log.
                log.error("rank %d: out of memory at\n%s", env.rank, error)
                error = oom_error(err, env.rank, memory_limit)
            log.error(
                "rank %d of cell %s ended with status %s: %s",
                env.rank,
                config.run_name,
                status.value,
                err,
            )
            write_rank_report(output_dir, env.rank, status, error)
        except (KeyboardInterrupt, SystemExit) as err:
            interrupted = signal_exit_code(err)
            if interrupted is None or env.is_distributed:
                raise  # a launcher's cell is recorded by it (launchers.cells.cell_outcome)
            interrupted_by = (  # in a sweep, only where the launcher itself was interrupted
                launcher_interrupted_by(output_dir)
                if under_launcher()
                else signal_name(interrupted)
            )
            if interrupted_by is None:
                raise
    if interrupted is not None and interrupted_by is not None:
        record_interruption(
            cell, output_dir, started, device, measured, interrupted, interrupted_by
        )
    if not env.is_main:
        return {"rank": env.rank, "status": status.value}
    if status is not RunStatus.ok and env.is_distributed:
        status, error = merge_rank_reports(output_dir, env.world_size, status, error)

    result = new_result(cell, output_dir, started, device, status, error)
    result.environment.update(machine_at_start)
    if link_shaping is not None:
        result.environment["link"] = link_shaping
    if measurement is not None:
        result.metrics = measurement.metrics()
        result.epoch_seconds = measurement.epoch_seconds()
        result.repeats = measurement.repeats()
        result.phase_seconds = measurement.phase_seconds()
        result.train_loss = measurement.train_losses()
        result.eval_loss = [evaluation.loss for evaluation in measurement.evaluations()]
        result.eval_accuracy = [evaluation.accuracy for evaluation in measurement.evaluations()]
        result.environment["memory_kind"] = measurement.workers[0].memory_kind
        result.environment["steadiness"] = measurement.steadiness().text()
        result.config["distribution"].update(measurement.workers[0].resolved_config)
    record(result, config, events.text() if events is not None else None)
    return result.to_dict()


def _check_world_size(config: DistbenchConfig, env: WorkerEnvironment) -> None:
    if env.world_size != config.world_size:
        raise RuntimeError(
            f"the cell needs {config.world_size} workers (hardware.nodes x "
            f"hardware.workers_per_node for distribution.name={config.distribution.name})"
            f" but was launched with {env.world_size}"
        )


def record_interruption(
    cell: CheckedCell,
    output_dir: Path,
    started: str,
    device: torch.device,
    measured: list[EpochMeasurement],
    exit_code: int,
    by: str,
) -> NoReturn:
    """Record a single-process cell ended by a signal (named `by`: its own, or the one that
    interrupted its launcher) as `interrupted`, with the epochs it measured; print one line
    and exit with the signal's status (harness.worker.interruption)."""
    # A second Ctrl-C (or its launcher's, forwarded) must not cut the record short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    error = interrupted_error(by, len(measured))
    result = new_result(cell, output_dir, started, device, RunStatus.interrupted, error)
    add_measured_epochs(result, measured)
    record(result, cell.config)
    print(
        f"distbench: cell {cell.config.run_name} {error}; recorded as interrupted in "
        f"{output_dir / RESULT_FILE}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(exit_code)


def _hydra_output_dir() -> str | None:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None


def _fresh_run_dir(config: DistbenchConfig) -> Path:
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")
    return Path(config.run.output_dir) / "runs" / stamp
