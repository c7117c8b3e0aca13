"""How `pipedream` trains (its spec, what it costs and offers: the package's __init__). Imported
by a worker only: predicting and the commands never load a trainer."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from harness.costs.onefoneb import (
    Kind,
    Op,
    check_deadlock_free,
    divisible_batches,
    minibatches_of,
    replica_of,
    worker_ops,
)
from harness.distributions.base import EpochMeasurement, Trainer, TrainingContext
from harness.distributions.pipedream import PLANNER, BatchDivision, pipedream_settings
from harness.distributions.pipeline import (
    LABEL_TAG,
    PipelineBatches,
    StageEpochs,
    layer_list,
    shared_plan,
    stage_module,
)
from harness.distributions.state import InitialState, assemble_network, epoch_losses
from harness.measure.metrics import device_time, synchronize
from workloads.networks import build_network, to_layer_list
from workloads.task import TaskLoss

ACTIVATION_TAG, GRADIENT_TAG = 1, 2  # p2p tags of the stages' sends (labels: LABEL_TAG)


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
        config, env = context.config, context.peers.env
        distribution = pipedream_settings(config)
        self.device = context.device
        self.network = context.workload.model
        self.peers = context.peers
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
        target_shape = context.workload.spec.target_shape  # () for a label, (T,) for tokens
        self.labels = torch.empty(
            (self.batch_size, *target_shape), dtype=torch.int64, device="meta"
        )  # what the last stage receives of them
        self.batches = PipelineBatches(context)
        self.oversample = distribution.batch_division is BatchDivision.oversample
        self.group = self._replica_groups(dt.timedelta(seconds=config.run.progress_timeout_s))
        self.input, self.output = self._boundaries(context)
        self.version = 0
        self.version_log: list[VersionRecord] = []
        self.replica_group = self.stage
        self._snapshot: _Snapshot | None = None
        self._in_flight: dict[int, _InFlight] = {}
        self._sends: list[tuple[dist.Work, torch.Tensor]] = []
        self._epochs = StageEpochs()  # this stage's idle share and phases, per epoch
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
                f"distribution.batch_division=oversample"
            )

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

    def _boundaries(self, context: TrainingContext) -> tuple[torch.Tensor, torch.Tensor]:
        """This stage's input and output for one minibatch, traced on 'meta' (no data): the
        shapes and dtypes of what it receives and sends (activations forward, their gradients
        back: float32, or torch's default dtype where a process set another)."""
        network = context.config.network.ref
        spec = context.workload.spec
        with torch.device("meta"):
            layers = to_layer_list(network, build_network(network, spec))
            activation = torch.zeros((self.batch_size, *spec.input_shape), dtype=spec.input_dtype)
            part = self.plan.stages[self.stage]
            for layer in layers[: part.first]:
                activation = layer(activation)
            stage_input = activation
            for layer in layers[part.first : part.end]:
                activation = layer(activation)
        return stage_input, activation

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
        self._epochs.add(seconds, phases)
        # The first stage's replicas count the samples, once per cell.
        return EpochMeasurement(
            seconds=seconds,
            samples=trained * self.batch_size if self.is_first else 0,
            batches=self.epoch_batches,
            phase_seconds=phases,
            batch_losses=losses,
        )

    def evaluation_model(self) -> nn.Module:
        """The whole network with every stage's live (latest) weights, replica 0 of each stage
        contributing its stage (a collective; memory: see state.assemble_network)."""
        return assemble_network(
            self.network,
            self.module,
            contributes=self.replica == 0,
            peers=self.peers,
            device=self.device,
        )

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
        metrics.update(self._epochs.metrics(self.stage))
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
            inputs = self._recv(
                self.input, self._rank(self.stage - 1, m), ACTIVATION_TAG
            ).requires_grad_()
        if self.is_last and not self.is_first:
            labels = self._recv(self.labels, self._rank(0, m), LABEL_TAG)
        with self.clock.phase("forward"):
            snapshot = (
                self._current_snapshot()
                if stash
                else _Snapshot(self.version, dict(self.module.named_parameters()), live=True)
            )
            output = functional_call(self.module, snapshot.weights, (inputs,))
            if self.is_last:
                output = self.criterion(output, labels)
                self._losses[m] = output.detach()
        self._in_flight[m] = _InFlight(inputs, output, snapshot)
        self._stashed_max = max(
            self._stashed_max,
            len({id(f.snapshot) for f in self._in_flight.values() if not f.snapshot.live}),
        )
        if not self.is_last:
            self._send(output.detach(), self._rank(self.stage + 1, m), ACTIVATION_TAG)

    def _backward(self, op: Op) -> None:
        m = op.minibatch
        flight = self._in_flight.pop(m)
        if self.is_last:
            gradient = None
        else:
            gradient = self._recv(self.output, self._rank(self.stage + 1, m), GRADIENT_TAG)
        weights = flight.snapshot.weights
        with self.clock.phase("backward"):
            torch.autograd.backward(flight.output, gradient)
        if not self.is_first:
            assert flight.inputs.grad is not None  # the stage's input requires grad
            self._send(flight.inputs.grad, self._rank(self.stage - 1, m), GRADIENT_TAG)
        self.version_log.append(
            VersionRecord(
                minibatch=m,
                forward_version=flight.snapshot.version,
                backward_version=flight.snapshot.version
                if all(w.grad is not None for w in weights.values())
                else -1,
                latest_version=self.version,
            )
        )
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
                gradients[name] = flat[offset : offset + gradient.numel()].view_as(gradient)
                offset += gradient.numel()
        for name, gradient in gradients.items():
            parameters[name].grad = gradient
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.version += 1

    def _current_snapshot(self) -> _Snapshot:
        """The weights at the current version, cloned once per version."""
        if self._snapshot is None or self._snapshot.version != self.version:
            weights = {
                name: p.detach().clone().requires_grad_()
                for name, p in self.module.named_parameters()
            }
            self._snapshot = _Snapshot(self.version, weights)
        return self._snapshot

    # -- point to point -----------------------------------------------------------------------
    def _send(self, tensor: torch.Tensor, rank: int, tag: int) -> None:
        tensor = tensor.contiguous()
        work = dist.isend(tensor, rank, tag=tag)
        assert work is not None  # this rank is in the default group
        self._sends.append((work, tensor))

    def _recv(self, like: torch.Tensor, rank: int, tag: int) -> torch.Tensor:
        """A tensor of `like`'s shape and dtype (a 'meta' tensor), received from `rank`."""
        tensor = torch.empty(like.shape, dtype=like.dtype, device=self.device)
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
