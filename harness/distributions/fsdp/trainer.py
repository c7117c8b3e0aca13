"""How `fsdp` trains (its spec, what it costs and offers: the package's __init__). Imported
by a worker only: predicting and the commands never load a trainer."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from harness.config.schema import DistbenchConfig
from harness.distributions.base import TrainingContext
from harness.distributions.fsdp import FSDPConfig, fsdp_settings
from harness.distributions.layer_training import prepare_layers
from harness.distributions.loop import BatchLoopTrainer
from workloads.networks import to_layer_list


# -- training --------------------------------------------------------------------------------
class FSDPTrainer(BatchLoopTrainer):
    """The batch loop over a fully sharded network: FSDP's collectives run inside the forward
    and backward passes (its hooks), so the loop itself is the sequential one."""

    def __init__(
        self, context: TrainingContext, model: nn.Module, mesh: DeviceMesh, skeleton: nn.Module
    ) -> None:
        settings = fsdp_settings(context.config)
        # bf16_mixed: FSDP2's policy gathers the parameters in bfloat16, no autocast
        super().__init__(
            context, model, precision=settings.precision, precision_cast_elsewhere=True
        )
        self.skeleton = skeleton  # the network unsharded, on the meta device (no memory)
        # Workers in the same position of their shard group hold the same shard: the
        # replicas the harness compares (every worker is its own when there is one group).
        self.replica_group = (
            mesh.get_local_rank("shard") if mesh.ndim == 2 else context.peers.env.rank
        )

    def evaluation_model(self) -> nn.Module:
        """The whole network, unsharded, on this worker's device: every parameter's shards
        gathered (a collective), and rank 0's buffers (BatchNorm's statistics, which each
        worker updated with its own data), as the other data-parallel models evaluate."""
        state = {}
        for name, tensor in self.network.state_dict().items():  # the same order on every rank
            if isinstance(tensor, DTensor):
                state[name] = tensor.full_tensor()
            else:
                state[name] = tensor.detach().clone()
                dist.broadcast(state[name], src=0)
        whole = copy.deepcopy(self.skeleton).to_empty(device=self.device)
        whole.load_state_dict(state)
        return whole


def fsdp_trainer(context: TrainingContext) -> BatchLoopTrainer:
    model = context.workload.model.to(context.device)
    settings = fsdp_settings(context.config)
    if not context.peers.env.is_distributed:  # one worker: nothing to shard
        prepare_layers(model, settings, lambda: to_layer_list(context.config.network.ref, model))
        return BatchLoopTrainer(context, model, precision=settings.precision)
    # fully_shard keeps each worker's slice of its own initial values: rank 0's must be
    # everyone's first (DDP's constructor broadcasts them too).
    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
    skeleton = copy.deepcopy(model).to("meta")  # before fully_shard changes the module
    layers = to_layer_list(context.config.network.ref, model)
    prepare_layers(model, settings, lambda: layers)  # after the copy: it keeps the forward
    mesh = shard_mesh(context.config, context.device.type)
    shard_network(model, layers, mesh, settings)
    return FSDPTrainer(context, model, mesh, skeleton)


def shard_mesh(config: DistbenchConfig, device_type: str) -> DeviceMesh:
    """The workers as FSDP sees them: one dimension (every worker a shard), or HSDP's
    (replicate, shard), the shard groups made of consecutive ranks (a node's workers)."""
    shards = fsdp_settings(config).shards(config)
    if shards == config.world_size:
        return init_device_mesh(device_type, (shards,), mesh_dim_names=("shard",))
    return init_device_mesh(
        device_type, (config.world_size // shards, shards), mesh_dim_names=("replicate", "shard")
    )


def shard_network(
    network: nn.Module, layers: list[nn.Module], mesh: DeviceMesh, settings: FSDPConfig
) -> None:
    """`fully_shard` each layer-list entry that has parameters, then the root (innermost
    first, as FSDP2 requires); with mixed precision, each BatchNorm first, in float32."""
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if settings.mixed_precision
        else MixedPrecisionPolicy()
    )
    common: dict[str, Any] = dict(mesh=mesh, reshard_after_forward=settings.reshard_after_forward)
    if settings.mixed_precision:
        for module in network.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                fully_shard(
                    module, mp_policy=MixedPrecisionPolicy(cast_forward_inputs=False), **common
                )
    for layer in layers:
        # (a BatchNorm entry of the list is a unit already, with mixed precision)
        if any(True for _ in layer.parameters()) and not isinstance(layer, FSDPModule):
            fully_shard(layer, mp_policy=policy, **common)
    fully_shard(network, mp_policy=policy, **common)
