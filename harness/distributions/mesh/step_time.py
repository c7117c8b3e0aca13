"""A plan's epoch on the workers measured here, split by cause (`harness.costs.terms`), from
the network's measured facts (a sequential step at the micro-batch, each layer's share of it)
and the probed links.

Per optimizer step, on the pipeline worker that computes the most:

- **compute**: each of its layers' forward and backward at one micro-batch (the layer's share
  of the sequential step), a block's divided over `tp` (the embedding and the head are whole),
  a checkpointed layer's forward again in its backward; every micro-batch through the pipeline
  plus the schedule's bubble (`harness.costs.schedules`); the update once, over its shard;
- **allreduce** (collectives): per micro-batch and block, tensor parallelism's four
  all-reduces of the block's output (two forward, two backward; two more for a recomputed
  forward) among the tensor-parallel group; FSDP2's all-gathers of the worker's weights (before
  each micro-batch's forward and backward; once a step in a pipeline, which keeps them
  gathered), its reduce-scatter of the gradients and HSDP's all-reduce of the shard across
  replicas, once a step. Rings over the probed links between the group's workers (Eq. 5.1's
  form: an all-gather or a reduce-scatter is half an all-reduce's steps). A CPU worker's gloo
  collective takes its turn on the cores (`harness.costs.terms.communication_overlaps`): none
  hides behind compute;
- **transfer**: each chunk's boundary activations sent forward and their gradients back, per
  micro-batch, on the link between neighbouring pipeline workers.

The fitted contention scales the compute, the fitted communication the collectives and the
transfers, as for every multi-worker model. A plan has a term of its own
(`COLLECTIVE_WAIT`): every collective call (tensor parallelism's four per block and micro-batch,
FSDP2's gather and reduction per unit, HSDP's all-reduce, each pipeline send) waits for the
group's other workers to reach it, and goes through DTensor's dispatch and redistributions: a
fixed cost per call that neither the ring's bytes nor the blocks' shares of a sequential step
hold. Where workers share cores it is a scheduler's turn (four workers on two cores: 9.9 ms a
call, fitted; docs/benchmarks/2026-12-07-planner-published.md).
"""

from __future__ import annotations

from harness.config.schema import DistbenchConfig
from harness.config.units import BYTES_PER_MB
from harness.costs.schedules import NO_PIPELINE, pipeline_seconds
from harness.costs.terms import (
    CellFacts,
    EpochTerms,
    FreeParameter,
    batches_per_epoch,
    burst_bytes,
    layer_backward_share,
    layer_forward_share,
)
from harness.distributions.layer_settings import Precision
from harness.distributions.mesh.placement import stage_layers, stages_of
from harness.distributions.mesh.settings import mesh_settings
from harness.profiles.hardware import HardwareProfile

COLLECTIVE_WAIT = FreeParameter(
    "plan_collective_wait",
    "ms each collective call of a plan (tensor parallelism's per block, FSDP2's per unit, "
    "HSDP's, each pipeline send) waits for its group's workers and DTensor's dispatch, beyond "
    "its bytes on the link; distribution=mesh only",
    0.0,
    100.0,
)


def ring_seconds(profile: HardwareProfile, ranks: list[int], megabytes: float) -> float:
    """An all-reduce of `megabytes` among `ranks` as a ring over the probed links between
    them: 2(W-1) steps of m/W MB, each at the pace of the ring's slowest link."""
    workers = len(ranks)
    if workers < 2 or megabytes <= 0:
        return 0.0
    step = max(
        profile.link(ranks[i], ranks[(i + 1) % workers]).seconds(megabytes * BYTES_PER_MB / workers)
        for i in range(workers)
    )
    return 2 * (workers - 1) * step


def _groups(config: DistbenchConfig) -> tuple[list[int], list[int], list[int], int]:
    """Worker 0's tensor-parallel, shard and replica groups, and the stride between pipeline
    neighbours, on the mesh `pp x dp_replicate x dp_shard x tp` (outermost first)."""
    settings = mesh_settings(config)
    tp, shards = settings.tp, settings.shards(config)
    tensor = list(range(tp))
    shard = [k * tp for k in range(shards)]
    replica = [k * tp * shards for k in range(settings.dp_replicate)]
    return tensor, shard, replica, tp * shards * settings.dp_replicate


def epoch_terms(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile | None
) -> EpochTerms:
    """The plan's epoch by cause (the module's docstring)."""
    settings = mesh_settings(config)
    steps = batches_per_epoch(config)
    if config.world_size < 2:
        return EpochTerms(steps * facts.step_seconds, steps=steps)
    assert profile is not None
    micro = settings.micro_batch(config)
    micro_batches = settings.micro_batches(config)
    shards, tp, pp = settings.shards(config), settings.tp, settings.pp
    count = len(facts.layers)
    bounds = stage_layers(count, settings.stage_count())
    checkpointed = set(settings.checkpointed(count))
    tensor, shard, replica, pipeline_stride = _groups(config)

    def split(index: int) -> bool:
        return 0 < index < count - 1

    def layer(index: int) -> tuple[float, float]:
        facts_of = facts.layers[index]
        forward = layer_forward_share(facts, facts_of) * facts.step_seconds
        backward = layer_backward_share(facts, facts_of) * facts.step_seconds
        if split(index):
            forward, backward = forward / tp, backward / tp
        return forward, backward + (forward if index in checkpointed else 0.0)

    busiest: tuple[float, float, list[int]] = (0.0, 0.0, [])
    for pp_rank in range(pp):
        owned = [index for stage in stages_of(settings, pp_rank) for index in bounds[stage]]
        forward = sum(layer(index)[0] for index in owned)
        backward = sum(layer(index)[1] for index in owned)
        if forward + backward > busiest[0] + busiest[1]:
            busiest = (forward, backward, owned)
    forward, backward, owned = busiest
    update = sum(layer.update_share for layer in facts.layers) * facts.step_seconds
    per_step = pipeline_seconds(
        settings.schedule if pp > 1 else NO_PIPELINE,
        pp,
        settings.virtual_stages(),
        micro_batches,
        forward,
        backward,
    ) + update / (tp * shards)

    # Tensor parallelism: every block of the busiest worker, every micro-batch.
    tensor_parallel = 0.0
    for index in owned:
        if split(index):
            message = facts.layers[index].activation_mb_per_sample * micro
            collectives = 4 + (2 if index in checkpointed else 0)
            tensor_parallel += collectives * ring_seconds(profile, tensor, message)
    tensor_parallel *= micro_batches

    # Data parallelism: FSDP2's gathers and reduction, HSDP's replicas.
    weights = sum(facts.layers[index].weights_mb / (tp if split(index) else 1) for index in owned)
    gathered = weights * (1.0 if settings.precision is Precision.fp32 else 0.5)
    gradients = weights * (0.5 if settings.precision is Precision.bf16 else 1.0)
    data_parallel = 0.0
    if shards > 1:
        gathers = 2 * micro_batches if pp == 1 else 1
        data_parallel += gathers * ring_seconds(profile, shard, gathered) / 2
        data_parallel += ring_seconds(profile, shard, gradients) / 2
    data_parallel += ring_seconds(profile, replica, gradients / shards)

    # Pipeline transfers: each chunk's boundary, forward and back, per micro-batch.
    transfer = 0.0
    if pp > 1:
        boundary = max(
            facts.layers[bounds[stage][-1]].activation_mb_per_sample for stage in range(pp)
        )
        link = profile.link(0, pipeline_stride)
        send = link.seconds(boundary * micro * BYTES_PER_MB, burst_bytes=burst_bytes(config))
        transfer = 2 * settings.virtual_stages() * micro_batches * send
    calls = 0.0
    if tp > 1:
        calls += micro_batches * sum(
            4 + (2 if index in checkpointed else 0) for index in owned if split(index)
        )
    units = sum(1 for index in owned if facts.layers[index].weights_mb > 0)
    if shards > 1:
        calls += (2 * micro_batches if pp == 1 else 1) * units + units
    if settings.dp_replicate > 1:
        calls += units
    if pp > 1:
        calls += 2 * settings.virtual_stages() * micro_batches
    dispatch = steps * calls / 1000  # seconds per ms of the parameter: every call, every step
    return EpochTerms(
        steps * per_step,
        steps * (tensor_parallel + data_parallel),
        steps * transfer,
        steps,
        concurrent=True,
        model_terms=((COLLECTIVE_WAIT, dispatch),) if dispatch else (),
    )
