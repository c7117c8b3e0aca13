"""Every plan of a world size at one global batch, as `distribution=mesh` can train it.

The degrees factor the world: tensor parallelism inside a node and dividing the heads, the
key/value heads and the MLP's width; pipeline stages at most the layers (and their virtual
stages too); data parallelism the rest, sharded (FSDP2), replicated (DDP) or both (HSDP,
sharded inside a node, replicated across). Micro-batches divide each data-parallel position's
share of the global batch; each schedule takes the micro-batch counts and virtual stages
`distribution=mesh` accepts. Recomputation is none, every second block, or every block;
precision bf16_mixed (float32 weights and optimizer state: `--predict` prices bf16 and fp32
too); sequence parallelism with tensor parallelism, or not.
"""

from __future__ import annotations

from collections.abc import Iterator

from harness.costs.plan_step import Cluster, PlanShape
from harness.costs.schedules import (
    MICRO_BATCHES_PER_STAGE,
    NO_PIPELINE,
    ONE_STAGE,
    SCHEDULES,
    V_SHAPED,
)
from harness.costs.transformer import Recompute, TransformerShape

PRECISIONS = ("bf16_mixed",)
RECOMPUTES = ((Recompute.none, 1), (Recompute.layers, 2), (Recompute.full, 1))
# Virtual stages tried per rank for the schedules that loop (the V schedules hold exactly 2).
VIRTUAL_STAGES = (2, 4)
MAX_MICRO_BATCH = 16


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tensor_degrees(shape: TransformerShape, cluster: Cluster) -> list[int]:
    """Degrees that split every head group and the MLP evenly, inside one node."""
    return [
        t
        for t in divisors(cluster.gpus_per_node)
        if shape.heads % t == 0 and shape.kv_heads % t == 0 and shape.ffn % t == 0
    ]


def data_splits(data_parallel: int, tp: int, pp: int, cluster: Cluster) -> set[tuple[int, int]]:
    """(dp_replicate, dp_shard): FSDP over all, DDP over all, and HSDP sharded over a node's
    ranks of the data axis, replicated across nodes."""
    splits = {(1, data_parallel), (data_parallel, 1)}
    in_node = max(cluster.gpus_per_node // tp, 1)
    if 1 < in_node < data_parallel and data_parallel % in_node == 0 and pp == 1:
        splits.add((data_parallel // in_node, in_node))
    return splits


def schedules(shape: TransformerShape, pp: int, micro_batches: int) -> Iterator[tuple[str, int]]:
    """(schedule, virtual stages) a pipeline of `pp` stages can run `micro_batches` with."""
    if pp == 1:
        yield NO_PIPELINE, 1
        return
    if micro_batches < pp:
        return
    for schedule in SCHEDULES:
        if schedule in ONE_STAGE:
            yield schedule, 1
            continue
        if schedule in V_SHAPED:
            least = MICRO_BATCHES_PER_STAGE.get(schedule, 1) * pp
            if micro_batches >= least and 2 * pp <= shape.layers:
                yield schedule, 2
            continue
        if micro_batches % pp:
            continue
        for virtual in VIRTUAL_STAGES:
            if pp * virtual <= shape.layers:
                yield schedule, virtual


def plans(
    shape: TransformerShape,
    cluster: Cluster,
    world: int,
    global_batch: int,
    optimizer_states: int = 2,
) -> Iterator[PlanShape]:
    """Every plan of `world` ranks at `global_batch` sequences per step, training with an
    optimizer that keeps `optimizer_states` buffers per weight."""
    for tp in tensor_degrees(shape, cluster):
        if world % tp:
            continue
        for pp in divisors(world // tp):
            if pp > shape.layers:
                continue
            data_parallel = world // (tp * pp)
            if global_batch % data_parallel:
                continue
            local = global_batch // data_parallel
            for micro in divisors(local):
                if micro > MAX_MICRO_BATCH:
                    break
                for replicate, shard in sorted(data_splits(data_parallel, tp, pp, cluster)):
                    for schedule, virtual in schedules(shape, pp, local // micro):
                        for recompute, every in RECOMPUTES:
                            for precision in PRECISIONS:
                                for sequence_parallel in (False, True) if tp > 1 else (False,):
                                    yield PlanShape(
                                        dp_replicate=replicate,
                                        dp_shard=shard,
                                        tp=tp,
                                        pp=pp,
                                        global_batch=global_batch,
                                        micro_batch=micro,
                                        schedule=schedule,
                                        virtual=virtual,
                                        sequence_parallel=sequence_parallel,
                                        recompute=recompute,
                                        recompute_every=every,
                                        precision=precision,
                                        optimizer_states=optimizer_states,
                                    )
