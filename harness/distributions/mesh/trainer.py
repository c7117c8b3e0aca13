"""How `mesh` trains (its spec, settings and checks: the package's __init__). Imported by a
worker only: predicting and the commands never load a trainer.

The network is built in torchtitan's order (`build_plan`): tensor parallelism, activation
checkpointing, data-parallel sharding, then the pipeline's stages; each worker keeps the
layers of its own stages and frees the others' tensors.
"""

from __future__ import annotations

import copy
import importlib
import statistics
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from harness.distributions.base import EpochMeasurement, Trainer, TrainingContext
from harness.distributions.layer_settings import Precision
from harness.distributions.layer_training import (
    as_input,
    compute_context,
    compute_dtype,
    loss_dtype,
    prepare_layers,
)
from harness.distributions.loop import timed_batches
from harness.distributions.mesh import mesh_settings
from harness.distributions.mesh.placement import AXES, Coordinates, stage_layers, stages_of
from harness.distributions.pipeline import StageEpochs
from harness.distributions.state import InitialState, epoch_losses
from harness.measure.metrics import PhaseClock, device_time, synchronize
from workloads.networks import to_layer_list
from workloads.networks.registry import source_of
from workloads.task import TaskLoss


def release(layers: list[nn.Module], keep: Iterable[nn.Module]) -> None:
    """Free the tensors of `layers` that no module of `keep` uses (moved to the meta device:
    no memory), so that a worker holds only its own stages' weights. Modules shared by several
    layers (Llama's rotary embedding) stay where a kept layer uses them."""
    kept = {id(tensor) for module in keep for tensor in (*module.parameters(), *module.buffers())}
    for layer in layers:
        for module in layer.modules():
            for name, parameter in list(module._parameters.items()):
                if parameter is not None and id(parameter) not in kept:
                    module._parameters[name] = nn.Parameter(
                        parameter.detach().to("meta"), requires_grad=parameter.requires_grad
                    )
            for name, buffer in list(module._buffers.items()):
                if buffer is not None and id(buffer) not in kept:
                    module._buffers[name] = buffer.to("meta")


class MeshTrainer(Trainer):
    """One worker of a plan: its stages (the whole network without a pipeline), their
    optimizer, and the schedule or the accumulation loop that trains a step."""

    def __init__(self, context: TrainingContext) -> None:
        self.context = context
        self.config = config = context.config
        self.settings = settings = mesh_settings(config)
        self.device = context.device
        self.clock = context.clock
        self.heartbeat = context.heartbeat
        self.loader = context.workload.loader
        self.criterion = TaskLoss()
        world = context.peers.env.world_size
        sizes = (settings.pp, settings.dp_replicate, settings.shards(config), settings.tp)
        self.at = Coordinates.of(context.peers.env.rank, sizes)
        self.mesh: DeviceMesh | None = (
            init_device_mesh(self.device.type, sizes, mesh_dim_names=AXES) if world > 1 else None
        )
        # Workers whose shards are the same (they differ in their replica only) must agree.
        self.replica_group = (self.at.pp * sizes[2] + self.at.dp_shard) * sizes[3] + self.at.tp
        self.micro = settings.micro_batch(config)
        self.accumulation = settings.accumulation_steps(config)
        self.epoch_records: list[tuple[int, float]] = []  # (samples of all workers, seconds)
        # a pipeline worker's idle share and phases per epoch (`bubble_stage<k>`, k its place
        # in the pipeline: the workers at one place average, as their stages run alike)
        self.stage_epochs = StageEpochs()
        self.layers, self.skeleton, self.stage_ids, self.stages = build_plan(
            context, context.workload.model, self.mesh, self.at
        )
        self.modules = nn.ModuleList(self.stages)
        self.optimizer = context.workload.make_optimizer(self.modules.parameters())
        self.schedule = self._schedule() if settings.pp > 1 else None
        self.initial = InitialState.capture(self.modules, self.optimizer)
        self._whole: nn.Module | None = None

    # -- the step -------------------------------------------------------------------------
    def _schedule(self) -> Any:
        assert self.mesh is not None
        group = self.mesh["pp"].get_group()
        count = self.settings.stage_count()
        stages = [
            timed_stage(self.clock, module, index, count, self.device, group)
            for index, module in zip(self.stage_ids, self.stages)
        ]
        pipelining = importlib.import_module("torch.distributed.pipelining")
        schedule_class = getattr(pipelining, self.settings.pipeline_schedule.torch_class)
        micro_batches = self.settings.micro_batches(self.config)
        one = self.settings.pipeline_schedule.stages_per_rank == (1, 1)
        return schedule_class(
            stages[0] if one else stages, n_microbatches=micro_batches, loss_fn=self._loss
        )

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The task's loss, computed in float32 at least (bfloat16 logits are widened)."""
        return self.criterion(loss_dtype(output), target)

    def _autocast(self) -> Any:
        """bfloat16 compute where no FSDP2 policy casts the parameters (no data parallelism)."""
        sharded = self.settings.data_parallel(self.config) > 1
        return compute_context(self.settings.precision, self.device, cast_elsewhere=sharded)

    def _train_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """One optimizer step on this position's batch; its mean loss where this worker
        computes one (every worker without a pipeline; the last stage's with one)."""
        images = as_input(images, self.settings.precision)
        if self.schedule is not None:
            loss = self._pipeline_step(images, labels)
        else:
            loss = self._accumulated_step(images, labels)
        with self.clock.phase("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad()
        return loss

    def _pipeline_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        count = self.settings.stage_count()
        first, last = 0 in self.stage_ids, count - 1 in self.stage_ids
        losses: list[torch.Tensor] = []
        assert self.schedule is not None
        with self._autocast():  # the stages charge their chunks' forward and backward phases
            self.schedule.step(
                *((images,) if first else ()),
                target=labels if last else None,
                losses=losses if last else None,
            )
        if not last:
            return None
        return torch.stack([loss.detach() for loss in losses]).mean()

    def _accumulated_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        network = self.stages[0]
        parts = zip(images.split(self.micro), labels.split(self.micro))
        total: torch.Tensor | float = 0.0
        for index, (inputs, targets) in enumerate(parts):
            last = index == self.accumulation - 1
            if isinstance(network, FSDPModule):  # reduce the gradients once, after the last
                network.set_requires_gradient_sync(last)
            with self.clock.phase("forward"), self._autocast():
                loss = self._loss(network(inputs), targets)
            with self.clock.phase("backward"):
                (loss / self.accumulation).backward()
            total = total + loss.detach()
        assert isinstance(total, torch.Tensor)
        return total / self.accumulation

    # -- Trainer ----------------------------------------------------------------------------
    def warm_up(self, batches: int) -> None:
        if batches <= 0:
            return
        self.modules.train()
        self.loader.set_epoch(0)
        for _, (images, labels) in zip(range(batches), self.loader):
            self._train_step(images.to(self.device), labels.to(self.device))
            self.heartbeat()
        synchronize(self.device)
        self.clock.reset()

    def train_epoch(self, epoch: int) -> EpochMeasurement:
        self.modules.train()
        self.loader.set_epoch(epoch)
        start = device_time(self.device)
        losses: dict[int, torch.Tensor] = {}
        batches = 0
        for batch, (images, labels) in enumerate(self._timed_batches()):
            loss = self._train_step(images, labels)
            if loss is not None:
                losses[batch] = loss
            batches += 1
            self.heartbeat()
        seconds = device_time(self.device) - start
        phases = self.clock.reset()
        if self.schedule is not None:
            self.stage_epochs.add(seconds, phases)
        samples = batches * self.loader.batch_size  # this data-parallel position's
        self.epoch_records.append((samples * self.settings.data_parallel(self.config), seconds))
        # each position's samples counted once (its first stage's first tensor-parallel
        # worker), so that the workers' counts sum to the samples the cell trained
        counts = self.at.tp == 0 and self.at.pp == 0
        return EpochMeasurement(
            seconds=seconds,
            samples=samples if counts else 0,
            batches=batches,
            phase_seconds=phases,
            batch_losses=epoch_losses(losses),
        )

    def _timed_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return timed_batches(self.loader, self.clock, self.device)

    def reset(self) -> None:
        self.initial.restore(self.modules, self.optimizer)

    def evaluation_model(self) -> nn.Module:
        """The whole network on this worker's device: every layer's tensors gathered whole
        (`full_tensor`, a collective among the workers that hold the layer) by its stage's
        workers, sent by the first data-parallel and tensor-parallel worker of each stage to
        all (`Peers.all_gather`), and loaded into a copy of the network as built."""
        state: dict[int, dict[str, torch.Tensor]] = {}
        sends = self.at.dp_replicate == 0 and self.at.dp_shard == 0 and self.at.tp == 0
        for index in self._owned_layers():
            whole = {}
            for name, tensor in self.layers[index].state_dict().items():
                value = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
                whole[name] = value.detach().cpu()
            if sends:
                state[index] = whole
        if self._whole is None:
            self._whole = copy.deepcopy(self.skeleton).to_empty(device=self.device)
        layers = to_layer_list(self.config.network.ref, self._whole)
        gathered = self.context.peers.all_gather(state) if self.mesh is not None else [state]
        with torch.no_grad():
            for part in gathered:
                for index, tensors in part.items():
                    layers[index].load_state_dict(tensors)
        return self._whole

    def _owned_layers(self) -> list[int]:
        bounds = stage_layers(len(self.layers), self.settings.stage_count())
        return [index for stage in self.stage_ids for index in bounds[stage]]

    def extra_metrics(self) -> dict[str, float]:
        """Tokens (token data) or samples per second per worker, over the timed epochs; with a
        pipeline, each pipeline worker's bubble and phases (`StageEpochs.metrics`)."""
        if not self.epoch_records:
            return {}
        stages = self.stage_epochs.metrics(self.at.pp) if self.schedule is not None else {}
        per_sample = self.config.dataset.spec.seq_len if self.config.dataset.spec.tokens else 1
        unit = "tokens" if per_sample > 1 else "samples"
        world = self.context.peers.env.world_size
        rate = statistics.fmean(
            samples * per_sample / seconds for samples, seconds in self.epoch_records
        )
        return {f"{unit}_per_s_per_worker": rate / world, **stages}

    def in_trained_form(self, network: nn.Module) -> nn.Module:
        """Rewritten as the tensor-parallel plan rewrote the trained one (GPT-2's Conv1D as
        nn.Linear), whose names and shapes the state must have."""
        if self.settings.tp > 1:
            ref = self.config.network.ref
            plan = source_of(ref).tensor_parallel_plan
            assert plan is not None
            plan(ref, network, self.settings.tp, self.settings.sequence_parallel)
        return network

    def compute_dtype(self) -> torch.dtype | None:
        return compute_dtype(self.settings.precision)

    def resolved_config(self) -> dict[str, Any]:
        """The settings whose null means "what the others leave", as this cell resolved them
        (recorded in its config and MLflow parameters, so that every plan dimension reads as a
        number): the shards, the stages per worker and the micro-batch. Only settings: what is
        recorded here reads back as the model's settings, and means the same."""
        return {
            "dp_shard": self.settings.shards(self.config),
            "stages_per_rank": self.settings.virtual_stages(),
            "micro_batch_size": self.micro,
        }


def timed_stage(
    clock: PhaseClock,
    module: nn.Module,
    index: int,
    count: int,
    device: torch.device,
    group: dist.ProcessGroup,
) -> Any:
    """A pipeline stage that charges each chunk's forward to the `forward` phase and its
    backward (input and weight gradients alike, as the zero-bubble schedules split them) to
    `backward`: what is left of an epoch is the bubble, waits on the neighbours' sends."""
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            with clock.phase("forward"):
                return super().forward_one_chunk(*args, **kwargs)

        def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            with clock.phase("backward"):
                return super().backward_one_chunk(*args, **kwargs)

        def backward_weight_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            with clock.phase("backward"):
                return super().backward_weight_one_chunk(*args, **kwargs)

    return TimedStage(module, index, count, device, group=group)


def build_plan(
    context: TrainingContext, network: nn.Module, mesh: DeviceMesh | None, at: Coordinates
) -> tuple[list[nn.Module], nn.Module, list[int], list[nn.Module]]:
    """This worker's part of the plan, built in torchtitan's order: (the layer list, a copy of
    the whole network on the meta device for evaluation, this worker's stage indices, its
    stage modules).

    1. precision `bf16`: the parameters themselves in bfloat16;
    2. every worker starts from rank 0's weights (as DDP's constructor broadcasts them);
    3. tensor parallelism over the mesh's `tp` axis, with the source's plan (which may first
       rewrite the network into a splittable form: the evaluation copy is taken after it);
    4. activation checkpointing of the chosen layer-list entries (`prepare_layers`);
    5. the stages this worker holds (all layers without a pipeline), the others' tensors freed;
    6. FSDP2 over (`dp_replicate`, `dp_shard`): each layer-list entry with parameters, then the
       stage, with the precision's policy.
    """
    config, device = context.config, context.device
    settings = mesh_settings(config)
    ref = config.network.ref
    network.to(device)
    if settings.precision is Precision.bf16:  # before the broadcast and the copy for evaluation
        network.to(torch.bfloat16)
    if mesh is not None:
        with torch.no_grad():
            for tensor in network.state_dict().values():
                dist.broadcast(tensor, src=0)
    if settings.tp > 1:
        assert mesh is not None
        source = source_of(ref)
        assert source.tensor_parallel_plan is not None  # refused at validation otherwise
        plan = source.tensor_parallel_plan(ref, network, settings.tp, settings.sequence_parallel)
        skeleton = meta_copy(network)
        parallelize_module(network, mesh["tp"], dict(plan))
    else:
        skeleton = meta_copy(network)
    layers = to_layer_list(ref, network)
    prepare_layers(network, settings, lambda: layers)
    bounds = stage_layers(len(layers), settings.stage_count())
    if settings.pp > 1:
        stage_ids = stages_of(settings, at.pp)
        stages: list[nn.Module] = [
            nn.Sequential(*(layers[i] for i in bounds[s])) for s in stage_ids
        ]
        release(layers, stages)
    else:
        stage_ids, stages = [0], [network]
    if mesh is not None and settings.data_parallel(config) > 1:
        data_mesh = mesh["dp_replicate", "dp_shard"]
        for stage_id, stage in zip(stage_ids, stages):
            units = [layers[i] for i in bounds[stage_id]] if settings.pp > 1 else layers
            shard_stage(stage, units, data_mesh, settings.precision, settings.pp > 1)
    return layers, skeleton, stage_ids, stages


def meta_copy(network: nn.Module) -> nn.Module:
    """A copy of `network` on the meta device, its tensors never copied: `deepcopy` then `.to
    ("meta")` holds a second copy of every weight for a moment, which the worker's allocator
    keeps (`harness.measure.allocator`), a whole network's weights more on every worker's peak.
    Tied weights stay tied (one meta tensor per original)."""
    memo: dict[int, Any] = {}
    for tensor in [*network.parameters(), *network.buffers()]:
        empty = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, nn.Parameter):
            empty = nn.Parameter(empty, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = empty
    return copy.deepcopy(network, memo)


def shard_stage(
    stage: nn.Module,
    units: list[nn.Module],
    mesh: DeviceMesh,
    precision: Precision,
    pipelined: bool,
) -> None:
    """`fully_shard` each of the stage's layers that has parameters, then the stage (innermost
    first, as FSDP2 requires). In a pipeline each unit keeps its gathered weights until its
    backward (a micro-batch's forward and backward are apart in time: regathering between
    them would double the all-gathers), as torchtitan does for pipelined FSDP."""
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if precision is Precision.bf16_mixed
        else MixedPrecisionPolicy()
    )
    reshard = not pipelined
    for unit in units:
        if any(True for _ in unit.parameters()):
            fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(stage, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)


def mesh_trainer(context: TrainingContext) -> Trainer:
    return MeshTrainer(context)
