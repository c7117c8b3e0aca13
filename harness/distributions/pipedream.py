"""`pipedream`: PipeDream's pipeline parallelism: 1F1B, weight stashing, replicated stages.

Each worker trains one replica of one stage of the stage plan (`distribution.stages`, e.g.
"2-1": stage 0 on two workers, stage 1 on one). Minibatches (Table 3.3's batch each) are
routed round robin over a stage's replicas and scheduled 1F1B (harness.distributions.onefoneb:
warm-up forwards, then one backward and one forward alternately, no flush between
minibatches). Every backward is followed by this stage's weight update, so the weights a
minibatch's forward used may have been updated several times before its backward runs.

Weight stashing: a forward runs on a snapshot of the weights at their current version
(`torch.func.functional_call` on cloned leaf tensors); the optimizer updates the live
parameters in place, never the snapshot, so the backward computes its gradients with exactly
the weights its forward used. A snapshot is shared by the forwards of one version and freed
when their backwards are done. A minibatch whose backward follows with no update in between
(every minibatch of the last stage) needs no copy and runs on the live parameters.
`version_log` records, per minibatch, the version its forward used and the version of the
snapshot its backward differentiated, so tests can check them.

Replicated stages are data parallel: after each backward, the replicas of the stage average
their gradients with an allreduce in their own process group (`dist.new_group`), so they step
identically. Batch division: every replica of every stage must train the same number of
minibatches, so an epoch's batch count is lowered (`drop`) or raised (`oversample`) to a
multiple of the lcm of the replica counts; the run records how many were dropped or added.

Point-to-point messages are non-blocking sends and blocking receives on the cell's process
group, whose timeout bounds every wait; the schedule is checked to be deadlock-free before it
runs (see onefoneb).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from harness.accepts import text
from harness.config import ConfigError, DistbenchConfig, require
from harness.distributions.base import EpochMeasurement, Trainer, TrainingContext
from harness.distributions.onefoneb import (
    Kind,
    Op,
    check_deadlock_free,
    divisible_batches,
    minibatches_of,
    replica_of,
    worker_ops,
)
from harness.distributions.pipeline import (
    LABEL_TAG,
    PipelineBatches,
    PipelineConfig,
    bubble,
    layer_list,
    shared_plan,
    stage_module,
)
from harness.distributions.spec import (
    DistributionSpec,
    StagePlanner,
    WorkerCounts,
    candidate,
    candidate_settings,
)
from harness.distributions.state import InitialState, assemble_network, epoch_losses
from harness.hardware_profile import HardwareProfile
from harness.metrics import device_time, synchronize
from harness.partition import (
    LinkModel,
    StagePlan,
    balanced_partition,
    check_balance,
    parse_stages,
    plan_pipedream,
)
from harness.predict import memory
from harness.predict import pipedream as equations
from harness.predict.terms import CellFacts, EpochTerms, memory_stage
from harness.profiler import NetworkProfile
from workloads.networks import build_network, to_layer_list
from workloads.task import TaskLoss

ACTIVATION_TAG, GRADIENT_TAG = 1, 2
# `distribution.stages` shorthand for one unreplicated stage per worker.
STRAIGHT = "straight"


class BatchDivision(str, Enum):
    """What to do when an epoch's batches do not divide among the stages' replicas."""

    drop = "drop"  # lower the batch count to the nearest multiple (the thesis' division)
    oversample = "oversample"  # raise it, re-reading batches from the start of the epoch


@dataclass
class PipeDreamConfig(PipelineConfig):
    """PipeDream: 1F1B scheduling, no flush between batches, weight stashing, and data
    parallelism inside replicated stages. `batch_size` is per minibatch entering the
    pipeline."""

    name: str = "pipedream"
    # Replicas per stage joined by '-', e.g. "2-1-1" (sums to the worker count); "straight" =
    # one stage per worker, none replicated (the true 1F1B pipeline, whatever the worker
    # count); null = planned from the profile (harness.partition.plan_pipedream).
    stages: str | None = field(default=None, metadata=text(255))
    batch_division: BatchDivision = BatchDivision.drop

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.stages is not None and self.stages != STRAIGHT:
            try:
                parse_stages(self.stages)
            except ValueError as err:
                raise ConfigError(f"distribution.stages={self.stages!r} is invalid: {err}") \
                    from None

    def check_cell(self, cell: DistbenchConfig) -> None:
        if self.stages == STRAIGHT:  # spelled out once the worker count is known
            self.stages = "-".join(["1"] * cell.world_size)
        stage_count = None
        if self.stages is not None:
            replicas = parse_stages(self.stages)
            require(sum(replicas) == cell.world_size, "distribution.stages", self.stages,
                    f"the replica counts must sum to the {cell.world_size} workers of "
                    f"hardware={cell.hardware.name} (e.g. "
                    f"{'-'.join(['1'] * cell.world_size)})")
            stage_count = len(replicas)
        self.check_stages(cell, stage_count, "distribution.stages", self.stages)
        if self.stages is not None and self.batch_division is BatchDivision.drop:
            # The trainer would drop every batch of an epoch shorter than the batch count the
            # replicas share evenly; refused here, before any worker starts.
            step = math.lcm(*parse_stages(self.stages))
            cell.check_epoch_holds(step, f"distribution.stages={self.stages} shares batches "
                                         f"evenly in multiples of {step}, and "
                                         f"batch_division=drop needs {step} or more batches of "
                                         f"{cell.batch_size} per epoch (or "
                                         f"distribution.batch_division=oversample)")

    def run_name_parts(self, cell: DistbenchConfig) -> list[str]:
        return [f"st{self.stages}"] if self.stages else []

    def parallelism(self, cell: DistbenchConfig,
                    resolved: dict[str, Any]) -> tuple[int | list[int], int]:
        replicas = parse_stages(resolved.get("stages") or self.stages or "1")
        return (replicas[0] if len(set(replicas)) == 1 else list(replicas)), len(replicas)


def pipedream_settings(config: DistbenchConfig) -> PipeDreamConfig:
    assert isinstance(config.distribution, PipeDreamConfig), config.distribution
    return config.distribution


@dataclass(frozen=True)
class VersionRecord:
    """Which weights one minibatch's passes used on this stage."""

    minibatch: int
    forward_version: int  # weight version (optimizer steps so far) the forward ran on
    backward_version: int  # version of the snapshot the backward differentiated
    latest_version: int  # the live weights' version when the backward ran


@dataclass
class _InFlight:
    """A minibatch between its forward and its backward on this stage."""

    inputs: torch.Tensor
    output: torch.Tensor  # the stage's output, or the loss on the last stage
    snapshot: _Snapshot


@dataclass
class _Snapshot:
    version: int
    weights: dict[str, torch.Tensor]  # leaf tensors that require grad
    live: bool = False  # the live parameters themselves (no update before the backward)


class PipeDreamTrainer(Trainer):
    """One replica of one PipeDream stage on this worker."""

    def __init__(self, context: TrainingContext) -> None:
        config, env = context.config, context.session.env
        distribution = pipedream_settings(config)
        self.device = context.device
        self.network = context.workload.model
        self.session = context.session
        self.clock = context.clock
        self.heartbeat = context.heartbeat
        self.batch_size = config.batch_size
        self.plan = shared_plan(context, layer_list(context), PLANNER)
        self.replicas = self.plan.replicas
        self.stage, self.replica = self.plan.stage_of(env.rank)
        self.num_stages = len(self.replicas)
        self.is_first, self.is_last = self.stage == 0, self.stage == self.num_stages - 1
        self.module = stage_module(context, self.plan, self.stage)
        self.optimizer = context.workload.make_optimizer(self.module.parameters())
        self.criterion = TaskLoss()
        self.target_shape = context.workload.spec.target_shape  # () for a label, (T,) for tokens
        self.batches = PipelineBatches(context)
        self.oversample = distribution.batch_division is BatchDivision.oversample
        self.group = self._replica_groups(dt.timedelta(seconds=config.run.progress_timeout_s))
        self.input_shape, self.output_shape = self._boundary_shapes(context)
        self.version = 0
        self.version_log: list[VersionRecord] = []
        self.replica_group = self.stage
        self._snapshot: _Snapshot | None = None
        self._in_flight: dict[int, _InFlight] = {}
        self._sends: list[tuple[dist.Work, torch.Tensor]] = []
        self._bubbles: list[float] = []
        self._stashed_max = 0
        self._checked: set[int] = set()  # batch counts whose schedule is proven deadlock-free
        self._losses: dict[int, torch.Tensor] = {}  # the last stage's, by minibatch, this epoch
        self.initial = InitialState.capture(self.module, self.optimizer)  # this stage's only
        self.epoch_batches = self.division(len(self.batches))
        if self.epoch_batches == 0:
            raise ValueError(
                f"dataset.num_samples gives {len(self.batches)} batches of {self.batch_size}, "
                f"fewer than the {self.plan.replica_lcm} that distribution.stages="
                f"{self.plan.stage_string()} shares evenly; use more samples or "
                f"distribution.batch_division=oversample")

    # -- plan and process groups --------------------------------------------------------------
    def division(self, batches: int) -> int:
        return divisible_batches(batches, self.replicas, self.oversample)

    def _rank(self, stage: int, minibatch: int) -> int:
        """The worker of `stage` that trains `minibatch`."""
        return self.plan.ranks_of(stage)[replica_of(minibatch, self.replicas[stage])]

    def _replica_groups(self, timeout: dt.timedelta) -> dist.ProcessGroup | None:
        """This stage's allreduce group. Every worker creates every group, in stage order, as
        dist.new_group requires; their collectives time out as the cell's do (new groups
        would otherwise get torch's 30-minute default)."""
        mine = None
        for stage, count in enumerate(self.replicas):
            if count > 1:
                group = dist.new_group(self.plan.ranks_of(stage), timeout=timeout)
                if stage == self.stage:
                    assert isinstance(group, dist.ProcessGroup), group  # a member's group
                    mine = group
        return mine

    def _boundary_shapes(self, context: TrainingContext) -> tuple[torch.Size, torch.Size]:
        """Shapes of this stage's input and output for one minibatch (traced on 'meta')."""
        network = context.config.network.ref
        spec = context.workload.spec
        with torch.device("meta"):
            layers = to_layer_list(network, build_network(network, spec))
            activation = torch.zeros((self.batch_size, *spec.input_shape),
                                     dtype=spec.input_dtype)
            part = self.plan.stages[self.stage]
            for layer in layers[:part.first]:
                activation = layer(activation)
            input_shape = activation.shape
            for layer in layers[part.first:part.end]:
                activation = layer(activation)
        return input_shape, activation.shape

    # -- the Trainer protocol -----------------------------------------------------------------
    def warm_up(self, batches: int) -> None:
        if batches <= 0:
            return
        self._run_epoch(0, divisible_batches(batches, self.replicas, oversample=True))
        synchronize(self.device)
        self.clock.reset()

    def train_epoch(self, epoch: int) -> EpochMeasurement:
        start = device_time(self.device)
        trained = self._run_epoch(epoch, self.epoch_batches)
        seconds = device_time(self.device) - start
        losses = epoch_losses(self._losses)
        phases = self.clock.reset()
        idle = bubble(seconds, phases)
        if idle is not None:
            self._bubbles.append(idle)
        # The first stage's replicas count the samples, once per cell.
        return EpochMeasurement(seconds=seconds,
                                samples=trained * self.batch_size if self.is_first else 0,
                                batches=self.epoch_batches, phase_seconds=phases,
                                batch_losses=losses)

    def evaluation_model(self) -> nn.Module:
        """The whole network with every stage's live (latest) weights, replica 0 of each stage
        contributing its stage (a collective; memory: see state.assemble_network)."""
        return assemble_network(self.network, self.module, contributes=self.replica == 0,
                                session=self.session, device=self.device)

    def reset(self) -> None:
        """The initial weights and optimizer state, weight version 0, no stashed snapshot and
        an empty `version_log`. What is measured across repeats (bubbles, the most versions
        stashed) is kept."""
        self.initial.restore(self.module, self.optimizer)
        self.version = 0
        self.version_log.clear()
        self._snapshot = None
        self._in_flight.clear()  # empty between epochs: 1F1B drains every backward
        self._losses.clear()

    def worker_batches(self, loader_batches: int) -> int:
        """The minibatches this worker trains in an epoch: a replicated stage's replicas share
        the epoch's (the loader's batches, or as many as batch division asks for)."""
        return len(minibatches_of(self.replica, self.replicas[self.stage], self.epoch_batches))

    # -- what the harness records besides the epochs ----------------------------------------
    def extra_metrics(self) -> dict[str, float]:
        available = len(self.batches)
        metrics = {
            # PipeDream pipelines whole minibatches: one unit per batch, of the batch's size.
            "micro_batches": 1.0,
            "micro_batch_size": float(self.batch_size),
            "pipeline_stages": float(self.num_stages),
            "batches_dropped": float(max(0, available - self.epoch_batches)),
            "batches_added": float(max(0, self.epoch_batches - available)),
            f"stashed_versions_max_stage{self.stage}": float(self._stashed_max),
        }
        if self._bubbles:
            metrics[f"bubble_stage{self.stage}"] = sum(self._bubbles) / len(self._bubbles)
        return metrics

    def resolved_config(self) -> dict[str, Any]:
        return {"stages": self.plan.stage_string(), "balance": self.plan.balance}

    # -- one epoch ----------------------------------------------------------------------------
    def _run_epoch(self, epoch: int, batches: int) -> int:
        """Run this worker's 1F1B ops over `batches` minibatches; return how many it trained."""
        if batches not in self._checked:
            check_deadlock_free(self.replicas, batches)
            self._checked.add(batches)
        self.module.train()
        rows = self.batches.indices(epoch, batches) if self.is_first else None
        self._losses = {}
        ops = worker_ops(self.replicas, self.stage, self.replica, batches)
        unstashed = _no_update_between(ops)
        for op in ops:
            if op.kind is Kind.forward:
                self._forward(op, rows, stash=op.minibatch not in unstashed)
            else:
                self._backward(op)
                self.heartbeat()
            self._reap_sends()
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()
        return sum(op.kind is Kind.backward for op in ops)

    def _forward(self, op: Op, rows: Any, stash: bool) -> None:
        m = op.minibatch
        labels = None
        if self.is_first:
            with self.clock.phase("data"):
                inputs, labels = self.batches.fetch(rows[m])
            if not self.is_last:
                self._send(labels, self._rank(self.num_stages - 1, m), LABEL_TAG)
        else:
            inputs = self._recv(self.input_shape, torch.float32, self._rank(self.stage - 1, m),
                                ACTIVATION_TAG).requires_grad_()
        if self.is_last and not self.is_first:
            labels = self._recv((self.batch_size, *self.target_shape), torch.int64,
                                self._rank(0, m), LABEL_TAG)
        with self.clock.phase("forward"):
            snapshot = self._current_snapshot() if stash else _Snapshot(
                self.version, dict(self.module.named_parameters()), live=True)
            output = functional_call(self.module, snapshot.weights, (inputs,))
            if self.is_last:
                output = self.criterion(output, labels)
                self._losses[m] = output.detach()
        self._in_flight[m] = _InFlight(inputs, output, snapshot)
        self._stashed_max = max(self._stashed_max, len({
            id(f.snapshot) for f in self._in_flight.values() if not f.snapshot.live}))
        if not self.is_last:
            self._send(output.detach(), self._rank(self.stage + 1, m), ACTIVATION_TAG)

    def _backward(self, op: Op) -> None:
        m = op.minibatch
        flight = self._in_flight.pop(m)
        if self.is_last:
            gradient = None
        else:
            gradient = self._recv(self.output_shape, torch.float32,
                                  self._rank(self.stage + 1, m), GRADIENT_TAG)
        weights = flight.snapshot.weights
        with self.clock.phase("backward"):
            torch.autograd.backward(flight.output, gradient)
        if not self.is_first:
            assert flight.inputs.grad is not None  # the stage's input requires grad
            self._send(flight.inputs.grad, self._rank(self.stage - 1, m), GRADIENT_TAG)
        self.version_log.append(VersionRecord(
            minibatch=m, forward_version=flight.snapshot.version,
            backward_version=flight.snapshot.version if all(
                w.grad is not None for w in weights.values()) else -1,
            latest_version=self.version))
        with self.clock.phase("optimizer"):
            # a weight without a gradient (none reached it) keeps its value, as with grad None
            self._step({name: w.grad for name, w in weights.items() if w.grad is not None})
            for w in weights.values():
                w.grad = None  # the snapshot may serve another in-flight minibatch

    def _step(self, gradients: dict[str, torch.Tensor]) -> None:
        """Apply one minibatch's gradients (averaged over the stage's replicas) to the live
        weights, and advance their version."""
        parameters = dict(self.module.named_parameters())
        if self.group is not None:
            flat = torch.cat([g.reshape(-1) for g in gradients.values()])
            dist.all_reduce(flat, group=self.group)
            flat /= self.replicas[self.stage]
            offset = 0
            for name, gradient in gradients.items():
                gradients[name] = flat[offset:offset + gradient.numel()].view_as(gradient)
                offset += gradient.numel()
        for name, gradient in gradients.items():
            parameters[name].grad = gradient
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.version += 1

    def _current_snapshot(self) -> _Snapshot:
        """The weights at the current version, cloned once per version."""
        if self._snapshot is None or self._snapshot.version != self.version:
            weights = {name: p.detach().clone().requires_grad_()
                       for name, p in self.module.named_parameters()}
            self._snapshot = _Snapshot(self.version, weights)
        return self._snapshot

    # -- point to point -----------------------------------------------------------------------
    def _send(self, tensor: torch.Tensor, rank: int, tag: int) -> None:
        tensor = tensor.contiguous()
        work = dist.isend(tensor, rank, tag=tag)
        assert work is not None  # this rank is in the default group
        self._sends.append((work, tensor))

    def _recv(self, shape: Any, dtype: torch.dtype, rank: int, tag: int) -> torch.Tensor:
        tensor = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(tensor, rank, tag=tag)
        return tensor

    def _reap_sends(self) -> None:
        """Forget sends that completed (their buffers can be freed)."""
        self._sends = [(work, t) for work, t in self._sends if not work.is_completed()]


def pipedream_trainer(context: TrainingContext) -> PipeDreamTrainer:
    return PipeDreamTrainer(context)


def _no_update_between(ops: list[Op]) -> set[int]:
    """Minibatches whose forward and backward have no other backward (so no weight update)
    between them in `ops`: they need no stashed copy, the live weights are still theirs (on
    the last stage, every minibatch)."""
    unstashed: set[int] = set()
    clean: set[int] = set()  # forwards with no backward since
    for op in ops:
        if op.kind is Kind.forward:
            clean.add(op.minibatch)
        else:
            if op.minibatch in clean:
                unstashed.add(op.minibatch)
            clean.clear()  # this backward's update comes before every open forward's backward
    return unstashed


def stage_plan(config: DistbenchConfig, num_layers: int,
               profile: NetworkProfile | None) -> StagePlan:
    """Replicas per stage from `distribution.stages`, else PipeDream's planner on the profile
    (taken at the minibatch); layers per stage from `distribution.balance`, else the planner's
    or the partition that balances the profiled time."""
    settings, workers = pipedream_settings(config), config.world_size
    if settings.stages is not None:
        replicas = parse_stages(settings.stages)
    else:
        assert profile is not None, "PipeDream's planner needs a profile"
        link = LinkModel(config.hardware.intra_node_bandwidth_mbps or LinkModel.bandwidth_mbps)
        planned = plan_pipedream(profile.compute_ms(1.0),
                                 [layer.parameter_mb for layer in profile.layers],
                                 [layer.activation_mb for layer in profile.layers], workers, link)
        if settings.balance is None:
            return planned
        replicas = planned.replicas
    if settings.balance is not None:
        balance = check_balance(settings.balance, num_layers, len(replicas))
    else:
        assert profile is not None, "balancing stages needs a profile"
        balance = balanced_partition(profile.compute_ms(1.0), len(replicas))
    return StagePlan.of(balance, replicas)


def needs_profile(config: DistbenchConfig) -> bool:
    """A profile unless both the replicas and the balance are given."""
    settings = pipedream_settings(config)
    return settings.balance is None or settings.stages is None


PLANNER = StagePlanner(plan=stage_plan, needs_profile=needs_profile)


def minibatches(config: DistbenchConfig, replicas: list[int]) -> int:
    """An epoch's minibatches under PipeDream's batch division (a multiple of the lcm of the
    stages' replica counts, lowered or raised)."""
    return divisible_batches(config.samples_per_epoch // config.batch_size, replicas,
                             pipedream_settings(config).batch_division is BatchDivision.oversample)


def pipeline_stages(config: DistbenchConfig, facts: CellFacts) -> list[equations.PipelineStage]:
    """The plan's stages with their share of the probed sequential step."""
    assert facts.plan is not None
    stages = []
    for index, stage in enumerate(facts.plan.stages):
        layers = facts.layers[stage.first:stage.end]
        last = index == len(facts.plan.stages) - 1
        stages.append(equations.PipelineStage(
            compute_s=facts.step_seconds * sum(layer.compute_share for layer in layers),
            replicas=stage.replicas,
            weights_mb=sum(layer.weights_mb for layer in layers),
            output_mb=0.0 if last else config.batch_size * layers[-1].activation_mb_per_sample))
    return stages


def epoch_terms(config: DistbenchConfig, facts: CellFacts,
                profile: HardwareProfile | None) -> EpochTerms:
    """Pipeline depth, then one minibatch per bottleneck interval (`predict.pipedream`)."""
    assert profile is not None and facts.plan is not None
    steps = minibatches(config, facts.plan.replicas)
    split = equations.epoch_split(pipeline_stages(config, facts), steps, profile)
    return EpochTerms(split.compute_s, split.allreduce_s, split.transfer_s, steps,
                      concurrent=True)


def held_sends(config: DistbenchConfig, replicas: list[int], index: int) -> int:
    """Minibatches whose sent tensors a worker of stage `index` holds at once: over gloo all
    of its epoch's (a gloo send is complete only once waited for, and the trainer waits at
    the epoch's end), elsewhere none beyond those in flight."""
    backend = config.distribution.backend or \
        ("nccl" if config.hardware.device.value == "cuda" else "gloo")
    if backend != "gloo":
        return 0
    return minibatches(config, replicas) // replicas[index]


def memory_per_worker(config: DistbenchConfig, facts: CellFacts) -> list[memory.WorkerMemory]:
    """Each stage replica: its minibatches in flight, its stashed weight versions, a
    replicated stage's allreduce buffer, and what it sent and still holds."""
    assert facts.plan is not None
    replicas = facts.plan.replicas
    workers = []
    for index, stage in enumerate(facts.plan.stages):
        one = memory.pipedream_stage_memory(
            memory_stage(facts, stage.first, stage.end), config.batch_size, replicas, index,
            held_sends=held_sends(config, replicas, index),
            optimizer_states=config.optimizer.state_buffers, runtime_mb=facts.runtime_mb)
        workers.extend([one] * stage.replicas)
    return workers


def candidates(asked: DistbenchConfig, counts: WorkerCounts) -> Iterator[DistbenchConfig]:
    """PipeDream's planner's plan, and the straight pipeline (one stage per worker)."""
    for nodes, per_node in counts:
        straight = "-".join(["1"] * nodes * per_node)
        for stages in (None, straight):
            yield candidate(asked, candidate_settings(asked, PipeDreamConfig, balance=None,
                                                      stages=stages), nodes, per_node)


def label(config: DistbenchConfig, plan: StagePlan | None) -> str:
    stages = plan.stage_string() if plan is not None else pipedream_settings(config).stages
    return f"pipedream {stages or 'planned'}"


def pinned_overrides(config: DistbenchConfig, plan: StagePlan | None) -> list[str]:
    """The plan predicted, pinned: the planner could choose another on another machine."""
    if plan is None:
        return []
    return [f"distribution.stages={plan.stage_string()}",
            f"distribution.balance=[{','.join(map(str, plan.balance))}]"]


SPEC = DistributionSpec(
    name="pipedream", title="PipeDream", settings=PipeDreamConfig, trainer=pipedream_trainer,
    epoch_terms=epoch_terms, memory_per_worker=memory_per_worker, candidates=candidates,
    label=label, pinned_overrides=pinned_overrides, stage_planner=PLANNER)
