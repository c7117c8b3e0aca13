"""A plan's memory on each of its workers, from the network's measured facts (its layers'
weights and what autograd saves for each, `harness.predict.facts`): what `distribution=mesh`
holds where, term by term.

- **Weights, gradients, optimizer state**: the worker's stages' layers (`placement`); the
  blocks' split over `tp` (the embedding and the output head stay whole: the tensor-parallel
  plans split the blocks' projections only); everything sharded over `dp_shard` by FSDP2.
  `bf16` halves all three; `bf16_mixed` keeps them in float32.
- **Gathered weights** (`dp_shard` > 1): FSDP2's unsharded units, in the precision it gathers in:
  the unit computing and the one prefetched, with one unit's whole gradient before its
  reduce-scatter; in a pipeline every unit of the worker's stages stays gathered from its
  forward to its backward (`trainer.shard_stage`).
- **Activations**: what autograd saves for the worker's layers at one micro-batch, times the
  micro-batches of them the schedule keeps in flight (`harness.costs.schedules.in_flight`); a
  checkpointed layer keeps only its input. Tensor parallelism splits what lies between a block's
  column- and row-parallel projections and replicates the rest: Korthikanti et al.'s count for
  a GPT block, 24 of 34 bytes per token and hidden unit split, 10 replicated (sequence
  parallelism splits all). The largest layer's backward temporaries once.
- **Runtime**: the worker process besides the model (measured).
"""

from __future__ import annotations

from harness.config.schema import DistbenchConfig
from harness.costs import memory
from harness.costs.schedules import NO_PIPELINE, in_flight
from harness.costs.terms import CellFacts, memory_stage
from harness.distributions.layer_settings import Checkpointing, Precision
from harness.distributions.mesh.placement import Coordinates, stage_layers, stages_of
from harness.distributions.mesh.settings import mesh_settings

# Korthikanti et al. (2022), Table 2: of a GPT block's 34 bytes saved per token and hidden unit
# (no recomputation, scores aside), 24 lie between the column- and row-parallel projections
# (split by tensor parallelism), 10 outside them (replicated unless sequence-parallel).
SPLIT_SHARE = 24 / 34


def _split(tp: int, sequence_parallel: bool) -> float:
    """The share of a block's saved activations one tensor-parallel worker keeps."""
    if tp == 1:
        return 1.0
    if sequence_parallel:
        return 1 / tp
    return (1 - SPLIT_SHARE) + SPLIT_SHARE / tp


def worker_memory(config: DistbenchConfig, facts: CellFacts, rank: int) -> memory.WorkerMemory:
    """Worker `rank`'s peak memory, term by term (the module's docstring)."""
    settings = mesh_settings(config)
    shards = settings.shards(config)
    sizes = (settings.pp, settings.dp_replicate, shards, settings.tp)
    at = Coordinates.of(rank, sizes)
    count = len(facts.layers)
    bounds = stage_layers(count, settings.stage_count())
    owned = [bounds[stage] for stage in stages_of(settings, at.pp)]
    layers = sorted(index for stage in owned for index in stage)
    # The blocks are split over tp; the first entry (embedding) and the last (head) are whole.
    split = {index for index in layers if 0 < index < count - 1}

    def local(index: int) -> float:
        weights = facts.layers[index].weights_mb
        return weights / settings.tp if index in split else weights

    weights = sum(local(index) for index in layers)
    halves = settings.precision is Precision.bf16
    width = 0.5 if halves else 1.0
    gathered = 0.0
    if shards > 1:
        gather = 1.0 if settings.precision is Precision.fp32 else 0.5
        units = sorted((local(index) for index in layers), reverse=True)
        in_use = units if settings.pp > 1 else units[:2]
        gathered = sum(in_use) * gather + units[0] * width
    micro = settings.micro_batch(config)
    checkpointed = set(settings.checkpointed(count))
    activations = backward = 0.0
    activation_width = 1.0 if settings.precision is Precision.fp32 else 0.5
    share = _split(settings.tp, settings.sequence_parallel)
    for stage in owned:
        for index in stage:
            facts_of = memory_stage(facts, index, index + 1)
            kept = (
                micro * facts_of.input_mb_per_sample
                if index in checkpointed
                else memory.activations_mb(facts_of, micro)
            )
            activations += kept * (share if index in split else 1.0)
            backward = max(backward, memory.backward_temporaries_mb(facts_of, micro))
    flight = in_flight(
        settings.schedule if settings.pp > 1 else NO_PIPELINE,
        settings.pp,
        settings.virtual_stages(),
        settings.micro_batches(config),
    )
    if settings.activation_checkpointing is not Checkpointing.none:
        # the layer being recomputed holds its whole activations again
        largest = max(
            memory.activations_mb(memory_stage(facts, index, index + 1), micro) for index in layers
        )
        backward += largest
    return memory.WorkerMemory(
        weights=weights / shards * width,
        gradients=memory.gradients_mb(weights) / shards * width,
        optimizer=memory.optimizer_state_mb(weights, config.optimizer.state_buffers)
        / shards
        * width,
        buffers=gathered,
        activations=flight * activations * activation_width,
        backward=backward * activation_width,
        runtime=facts.runtime_mb,
    )


def memory_per_worker(config: DistbenchConfig, facts: CellFacts) -> list[memory.WorkerMemory]:
    """Every worker's peak memory (`worker_memory`)."""
    return [worker_memory(config, facts, rank) for rank in range(config.world_size)]
