"""`mesh`: a parallelism plan as a device mesh (data x tensor x pipeline parallel).

The workers form a mesh of four axes, outermost first `pp` (pipeline stages), `dp_replicate`
(replicas), `dp_shard` (FSDP2 shards), `tp` (tensor parallel), as torchtitan's `ParallelDims`
orders them: a node's workers take consecutive ranks, so the innermost axis, tensor
parallelism, whose collectives run in every layer, lies within a node, and the outer axes
(the pipeline's point-to-point sends, the data-parallel gradients) cross the nodes.

A worker's network is built in the order torchtitan documents (`parallelize.py`):

1. tensor parallelism: each transformer block's attention and MLP split Megatron-style, by
   columns then rows (`torch.distributed.tensor.parallel`), with the plan the network's source
   gives (`NetworkSourceSpec.tensor_parallel_plan`); sequence parallelism optionally splits
   the norms and the residual stream along the sequence between them;
2. activation checkpointing (`torch.utils.checkpoint`) of every block, or of every k-th;
3. data parallelism: `fully_shard` (FSDP2) of each layer-list entry and of the stage over the
   `dp_replicate` x `dp_shard` mesh (HSDP where both exceed 1; replicas only where `dp_shard`
   is 1), with the precision's `MixedPrecisionPolicy`;
4. pipeline: the layer list cut into `pp` x `stages_per_rank` stages, run by a
   `torch.distributed.pipelining` schedule (`schedule`).

One global batch (`run.global_batch`, else `batch_size` per data-parallel position) is split
over the data-parallel positions; each splits its share into micro-batches of
`micro_batch_size`: a pipeline runs them all in one schedule step, a plan without one
accumulates their gradients before the optimizer step. Every plan computes the gradient of the
global batch's mean loss: the sequential model's training, whatever the plan
(tests/integration/test_plans.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from harness.config.schema import DistbenchConfig
from harness.costs.partition import StagePlan
from harness.distributions.mesh.rank_memory import memory_per_worker
from harness.distributions.mesh.settings import (
    MeshConfig,
    Schedule,
    check_tensor_parallel,
    mesh_settings,
    plan_label,
)
from harness.distributions.mesh.step_time import COLLECTIVE_WAIT, epoch_terms
from harness.distributions.spec import DistributionSpec, WorkerCounts, trainer_in
from harness.profiles.collectives import Collective

__all__ = ["SPEC", "MeshConfig", "Schedule", "check_tensor_parallel", "mesh_settings", "plan_label"]


# -- the recommender ------------------------------------------------------------------------
def candidates(asked: DistbenchConfig, counts: WorkerCounts) -> Iterator[DistbenchConfig]:
    """None yet: plans are offered once they are predicted."""
    return iter(())


def label(config: DistbenchConfig, plan: StagePlan | None) -> str:
    return f"{plan_label(mesh_settings(config), config)} x{config.world_size}"


SPEC = DistributionSpec(
    name="mesh",
    title="device mesh (data x tensor x pipeline parallel)",
    settings=MeshConfig,
    trainer=trainer_in(f"{__name__}.trainer", "mesh_trainer"),
    epoch_terms=epoch_terms,
    memory_per_worker=memory_per_worker,
    candidates=candidates,
    label=label,
    free_parameters=(COLLECTIVE_WAIT,),
    profiles_layers=lambda cell: mesh_settings(cell).pp > 1 or mesh_settings(cell).tp > 1,
    probed_collectives=(
        Collective.point_to_point,
        Collective.allreduce,
        Collective.all_gather,
        Collective.reduce_scatter,
    ),
)
