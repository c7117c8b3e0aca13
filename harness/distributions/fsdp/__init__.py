"""`fsdp`: PyTorch's fully sharded data parallelism (FSDP2, `torch.distributed.fsdp.fully_shard`).

Data parallel like DDP (every worker trains its own shard of each epoch, Table 3.3's batch
per worker), but no worker holds the whole model between uses: each parameter, its gradient
and its optimizer state are split evenly over the `shard_degree` workers of a shard group.
Each entry of the network's layer list that has parameters is one FSDP unit (its
`fully_shard`), the network itself the root, as torchtitan shards each transformer block:

- forward: a unit's parameters are all-gathered just before it runs (the next unit's gather
  is prefetched) and, with `reshard_after_forward`, freed again after it;
- backward: a unit resharded after forward is all-gathered once more; its gradients are
  reduce-scattered, so each worker keeps the averaged gradient of its own shard, and the
  optimizer steps on the shards only;
- with fewer shards than workers (HSDP, `shard_degree` < workers), the workers that hold the
  same shard (one per shard group) also allreduce its gradient.

Every collective goes through torch.distributed: gloo on CPU (torch 2.14 supports FSDP2's
all-gather and reduce-scatter there: tests/unit/harness/distributions/test_fsdp.py trains it), NCCL
on CUDA. Mixed precision (`mixed_precision: true`) gathers and computes in bfloat16 and reduces
gradients in float32; BatchNorm layers keep float32 parameters (their own units, without the input
cast: torch's BatchNorm takes a bfloat16 input with float32 statistics, not bfloat16 parameters with
float32 statistics).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from harness.config.accepts import integer
from harness.config.batch_sizes import nearest_divisors
from harness.config.schema import DistbenchConfig, require
from harness.config.units import BYTES_PER_MB
from harness.costs import memory
from harness.costs.overlap import COMPUTE, LINK, prefetched
from harness.costs.partition import StagePlan
from harness.costs.terms import (
    CellFacts,
    EpochTerms,
    FreeParameter,
    LayerFacts,
    allreduce_seconds,
    batches_per_epoch,
    communication_overlaps,
    layer_backward_share,
    layer_forward_share,
    memory_stage,
)
from harness.distributions.layer_settings import LayerSettingsConfig, Precision
from harness.distributions.spec import (
    DistributionSpec,
    WorkerCounts,
    candidate,
    candidate_settings,
    trainer_in,
)
from harness.profiles.collectives import Collective
from harness.profiles.hardware import HardwareProfile

# An all-gather or a reduce-scatter of M bytes, as a multiple of an allreduce of M bytes among
# the same workers (what the hardware probe measures), for a profile that holds no timing of the
# collectives themselves: on CPU workers the probe times them after compute, as FSDP issues them
# (`collective_seconds`), and no share is used. A ring allreduce is a reduce-scatter followed by an
# all-gather, so on NCCL each is half of one. gloo's are not: measured on a 2-core machine (2 and 4
# workers, 4-16 MB, median of 12 after 3 warm-up, back to back), its all-gather took 0.65-0.81 of an
# allreduce and its reduce-scatter 1.21-1.43 (tests/benchmarks/test_fsdp_collectives.py measures
# them again); after 20 ms of compute, as FSDP runs them, a 33.6 MB all-gather took 1.3
# (docs/benchmarks/2026-11-29-fsdp-collectives-after-compute.md, "FSDP2's collectives between nodes,
# timed after compute (2026-11-29)").
CUDA_SHARE = {"all_gather": 0.5, "reduce_scatter": 0.5}


GLOO_SHARE = {"all_gather": 0.75, "reduce_scatter": 1.3}
# The same collectives over gloo between nodes, where the link, not the cores, sets their pace,
# priced by their bytes on the wire where the probe did not time them after compute
# (`HardwareProfile.collective_after_compute`, which prices them where it did): measured on the
# links' counters of the emulated sweep (`link_sent_mb`), an FSDP2 step with `reshard_after_forward`
# sends 2.08-2.10 times what a DDP step of the same network sends (one allreduce of the gradients):
# an all-gather puts half an allreduce's bytes on the wire ((W-1)/W of the data against 2(W-1)/W),
# gloo's reduce-scatter a whole allreduce's. Their time is not in proportion
# (docs/benchmarks/2026-11-29-fsdp-collectives-after-compute.md, "FSDP2's collectives between nodes,
# timed after compute (2026-11-29)"): after compute an all-gather of a few MB took 0.7 of an
# allreduce, one within the link's bucket passed at once.
GLOO_ACROSS_NODES_SHARE = {"all_gather": 0.5, "reduce_scatter": 1.0}

# FSDP2's own free parameter: around every collective it copies on the worker's cores (each unit's
# shard into the all-gather's input, the gathered output into the parameters, the gradients into the
# reduce-scatter's input), work a CPU worker does on the cores that compute and that the
# collectives' shares above do not hold (they time the bare collectives). Measured across emulated
# nodes (docs/benchmarks/2026-11-29-emulated-calibration-kept.md, "The emulated calibration measured
# again and kept; FSDP across nodes (2026-11-29)"), a fit puts it at about 2 ms per MB at 1 Gbit/s
# and under 0.4 at 100 Mbit/s, where the slow link's waits hide most of it.
COPIES = FreeParameter(
    "fsdp_copies",
    "ms of a worker's cores per MB FSDP2 gathers or reduces (the copies into and out of "
    "each collective's buffers); FSDP only, 0 where workers have devices of their own",
    0.0,
    10.0,
)


_BFLOAT16_SHARE = 0.5  # bytes of a bfloat16 copy of float32 weights


@dataclass
class FSDPConfig(LayerSettingsConfig):
    """FSDP2's settings (and activation checkpointing and precision, `LayerSettingsConfig`)."""

    name: str = "fsdp"
    # Free each unit's gathered parameters after its forward (gather them again for its
    # backward): less memory, one more all-gather per step. false: keep them until backward.
    reshard_after_forward: bool = True
    # Workers each parameter is split over; null = all the cell's workers. Fewer (it must
    # divide the workers) is HSDP: the shard groups are replicas of each other, and allreduce
    # their shards' gradients (e.g. the workers of one node, replicated across nodes).
    shard_degree: int | None = field(default=None, metadata=integer(1, 2**31 - 1, "workers"))
    # bfloat16 parameters for the all-gathers and the compute, float32 gradient reduction and
    # float32 sharded weights and optimizer state (FSDP2's MixedPrecisionPolicy): the same as
    # precision=bf16_mixed, which sets it (the recorded cells' name for it).
    mixed_precision: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            not (self.mixed_precision and self.precision is Precision.bf16),
            "distribution.mixed_precision",
            self.mixed_precision,
            "it means precision=bf16_mixed, but precision=bf16 asks for bfloat16 "
            "parameters; allowed with precision=bf16: false",
        )
        if self.mixed_precision:
            self.precision = Precision.bf16_mixed
        self.mixed_precision = self.precision is Precision.bf16_mixed
        require(
            self.shard_degree is None or self.shard_degree >= 1,
            "distribution.shard_degree",
            self.shard_degree,
            "must be a positive number of workers, or null (all the cell's workers)",
        )

    def shards(self, cell: DistbenchConfig) -> int:
        """Workers each parameter is split over."""
        return self.shard_degree if self.shard_degree is not None else cell.world_size

    def weight_shards(self, cell: DistbenchConfig) -> int:
        """A shard group's workers (one worker: nothing is split)."""
        return self.shards(cell) if cell.world_size > 1 else 1

    def check_cell(self, cell: DistbenchConfig) -> None:
        super().check_cell(cell)
        shards = self.shards(cell)
        require(
            shards <= cell.world_size and cell.world_size % shards == 0,
            "distribution.shard_degree",
            self.shard_degree,
            f"must divide the cell's {cell.world_size} workers (hardware.nodes x "
            f"hardware.workers_per_node); allowed: "
            f"{nearest_divisors(cell.world_size, shards)}, or null (all of them)",
        )

    def run_name_parts(self, cell: DistbenchConfig) -> list[str]:
        parts = [] if self.reshard_after_forward else ["keep"]
        if self.shards(cell) != cell.world_size:
            parts.append(f"shard{self.shards(cell)}")
        return parts + self.layer_name_parts()

    def own_settings(self, cell: DistbenchConfig) -> dict[str, Any]:
        return {**super().own_settings(cell), "shard_degree": self.shards(cell)}


def fsdp_settings(config: DistbenchConfig) -> FSDPConfig:
    assert isinstance(config.distribution, FSDPConfig), config.distribution
    return config.distribution


# -- the performance model -------------------------------------------------------------------
def _units(facts: CellFacts) -> list[float]:
    """Each FSDP unit's weights (MB): the layer-list entries with parameters."""
    return [layer.weights_mb for layer in facts.layers if layer.weights_mb > 0] or [
        facts.weights_mb
    ]


def _share(config: DistbenchConfig, collective: str) -> float:
    """A collective among a shard group as a multiple of an allreduce among it: NCCL's on GPUs,
    gloo's on the cores of one machine, gloo's wire bytes where the group spans nodes."""
    if config.hardware.device.value == "cuda":
        return CUDA_SHARE[collective]
    if config.hardware.group_crosses_links(fsdp_settings(config).shards(config)):
        return GLOO_ACROSS_NODES_SHARE[collective]
    return GLOO_SHARE[collective]


def collective_seconds(
    config: DistbenchConfig, profile: HardwareProfile, collective: str, megabytes: float
) -> float:
    """One all-gather (of `megabytes` gathered) or reduce-scatter (of `megabytes` reduced)
    among the cell's shard group: on CPU workers, as the probe timed it after compute where the
    profile holds that among as many workers (such a collective takes its turn with the compute, and
    its time follows no straight line in its size: a share of the allreduce timed back to back
    priced FSDP 18 % too fast on one machine's cores and 12 % between emulated nodes:
    docs/benchmarks/2026-11-29-fsdp-collectives-after-compute.md, "FSDP2's collectives between
    nodes, timed after compute (2026-11-29)"), else as its share of the probed allreduce of the same
    bytes (`_share`)."""
    shards = fsdp_settings(config).shards(config)
    if shards < 2 or megabytes <= 0:
        return 0.0
    if config.hardware.device.value != "cuda":
        measured = profile.collective_after_compute(collective, shards)
        if measured is not None:
            return measured.seconds_at(megabytes * BYTES_PER_MB)
    return _share(config, collective) * allreduce_seconds(profile, shards, megabytes, 1)


def step_collective_mb(config: DistbenchConfig, facts: CellFacts) -> tuple[float, float]:
    """(MB all-gathered, MB reduce-scattered) in one step: every unit's weights once per
    gather (twice when resharded after forward; bfloat16 with mixed precision), its float32
    gradients once."""
    settings = fsdp_settings(config)
    units = sum(_units(facts))
    gathers = 2 if settings.reshard_after_forward else 1
    gathered = gathers * units * (_BFLOAT16_SHARE if settings.mixed_precision else 1.0)
    return gathered, units * facts.gradient_mb / max(facts.weights_mb, 1e-12)


def step_communication_seconds(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile
) -> float:
    """The collectives of one step that the compute does not hide.

    Per unit: an all-gather of its weights (bfloat16 with mixed precision) before its
    forward and, when resharded after forward, again before its backward; a reduce-scatter of
    its float32 gradients after its backward; with HSDP, an allreduce of the gradient's shard
    among the shard groups. On CPU workers every collective takes its turn on the cores the
    compute uses (`communication_overlaps`). Where the collectives can run beside the
    compute (GPUs), FSDP prefetches each next unit's
    gather while the current unit computes and reduces each unit's gradients while the
    backward goes on, each hidden only as far as the compute it runs beside lasts
    (`_exposed_on_a_timeline`)."""
    if communication_overlaps(config):
        return _exposed_on_a_timeline(config, facts, profile)
    settings = fsdp_settings(config)
    shards = settings.shards(config)
    replicas = config.world_size // shards
    units = _units(facts)
    gathers = 2 if settings.reshard_after_forward else 1
    precision = _BFLOAT16_SHARE if settings.mixed_precision else 1.0
    gradient_scale = facts.gradient_mb / max(facts.weights_mb, 1e-12)
    seconds = sum(
        gathers * collective_seconds(config, profile, "all_gather", unit * precision)
        + collective_seconds(config, profile, "reduce_scatter", unit * gradient_scale)
        for unit in units
    )
    if replicas > 1:
        gradient_mb = step_collective_mb(config, facts)[1]
        seconds += allreduce_seconds(profile, replicas, gradient_mb / shards, len(units))
    return seconds


@dataclass(frozen=True)
class UnitWork:
    """One FSDP unit's step: its compute (seconds) and its collectives (seconds)."""

    forward_s: float
    backward_s: float
    gather_s: float
    reduce_s: float  # reduce-scatter, and with HSDP the shard's allreduce among the replicas


def unit_work(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile
) -> list[UnitWork]:
    """Each unit (a layer-list entry with parameters, with the parameterless entries after it
    up to the next one) with its forward, backward and collectives."""
    settings = fsdp_settings(config)
    shards = settings.shards(config)
    replicas = config.world_size // shards
    precision = _BFLOAT16_SHARE if settings.mixed_precision else 1.0
    gradient_scale = facts.gradient_mb / max(facts.weights_mb, 1e-12)
    groups: list[list[LayerFacts]] = []
    for layer in facts.layers:
        if layer.weights_mb > 0 or not groups:
            groups.append([])
        groups[-1].append(layer)
    units = []
    for group in groups:
        weights = sum(layer.weights_mb for layer in group)
        gradient = weights * gradient_scale
        reduce = collective_seconds(config, profile, "reduce_scatter", gradient)
        if replicas > 1:
            reduce += allreduce_seconds(profile, replicas, gradient / shards, 1)
        units.append(
            UnitWork(
                forward_s=sum(layer_forward_share(facts, layer) for layer in group)
                * facts.step_seconds,
                backward_s=sum(layer_backward_share(facts, layer) for layer in group)
                * facts.step_seconds,
                gather_s=collective_seconds(config, profile, "all_gather", weights * precision),
                reduce_s=reduce,
            )
        )
    return units


def _exposed_on_a_timeline(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile
) -> float:
    """FSDP2's step on a timeline (`predict.overlap`): the forward gathers each unit's weights
    before it computes, the next unit's prefetched as the current one starts; the backward,
    from the last unit back, gathers again where resharded (prefetched one ahead) and issues
    each unit's reduce-scatter as its backward ends; the update waits for every reduction.
    One link carries them in the order issued."""
    units = unit_work(config, facts, profile)
    reshard = fsdp_settings(config).reshard_after_forward
    timeline, forward_ends = prefetched(
        [unit.forward_s for unit in units], [unit.gather_s for unit in units], overlaps=True
    )
    ended = forward_ends[-1] if forward_ends else 0.0
    backward = list(reversed(units))
    fetched, reduced = ended, []
    for i, unit in enumerate(backward):
        start, ended = timeline.run(COMPUTE, unit.backward_s, after=[fetched, ended])
        if reshard and i + 1 < len(backward):  # the next unit's weights, prefetched now
            fetched = timeline.run(LINK, backward[i + 1].gather_s, not_before=start)[1]
        reduced.append(timeline.run(LINK, unit.reduce_s, after=[ended])[1])
    update = max(facts.step_seconds - sum(u.forward_s + u.backward_s for u in units), 0.0)
    timeline.run(COMPUTE, update, after=reduced)
    return timeline.exposed_s


def epoch_terms(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile | None
) -> EpochTerms:
    """The workers' own steps at the per-worker batch (DDP's compute term), FSDP's
    collectives (`step_communication_seconds`) once per step, and on CPU workers the copies
    around them (`COPIES`)."""
    steps = batches_per_epoch(config)
    compute = steps * facts.step_seconds
    if config.world_size < 2:
        return EpochTerms(compute, steps=steps)
    assert profile is not None
    model_terms: tuple[tuple[FreeParameter, float], ...] = ()
    if config.hardware.device.value != "cuda":
        copied_mb = sum(step_collective_mb(config, facts))
        model_terms = ((COPIES, steps * copied_mb / 1000),)  # COPIES is in ms per MB
    return EpochTerms(
        compute,
        steps * step_communication_seconds(config, facts, profile),
        0.0,
        steps,
        concurrent=True,
        model_terms=model_terms,
    )


def memory_per_worker(config: DistbenchConfig, facts: CellFacts) -> list[memory.WorkerMemory]:
    """A worker's shard of the float32 weights, gradients and momentum (1/shards of each),
    the gathered (unsharded) weights in use, and a whole per-worker batch's activations.

    The peak is where the backward starts: with `reshard_after_forward` two units are
    gathered then (the last one's, still in use, and the next one's, prefetched), and the
    gradients of the unit being reduced are whole until the reduce-scatter; without it every
    unit is still gathered from the forward. Activations are counted in float32 (with mixed
    precision most are bfloat16: an upper bound)."""
    settings = fsdp_settings(config)
    shards = settings.shards(config) if config.world_size > 1 else 1
    units = sorted(_units(facts), reverse=True)
    precision = _BFLOAT16_SHARE if settings.mixed_precision else 1.0
    gathered = sum(units) if not settings.reshard_after_forward else sum(units[:2])
    stage = memory_stage(facts, 0, len(facts.layers))
    batch = config.batch_size
    one = memory.WorkerMemory(
        weights=facts.weights_mb / shards,
        gradients=memory.gradients_mb(facts.gradient_mb) / shards,
        optimizer=memory.optimizer_state_mb(facts.weights_mb, config.optimizer.state_buffers)
        / shards,
        buffers=(gathered * precision + units[0]) if shards > 1 else 0.0,
        activations=memory.activations_mb(stage, batch),
        backward=memory.backward_temporaries_mb(stage, batch),
        runtime=facts.runtime_mb,
    )
    return [one] * config.world_size


# -- the recommender and the reports ---------------------------------------------------------
def candidates(asked: DistbenchConfig, counts: WorkerCounts) -> Iterator[DistbenchConfig]:
    """Each worker count with and without resharding after forward (memory against one more
    all-gather per step); on several nodes also HSDP with a node's workers as shard group."""
    for nodes, per_node in counts:
        if nodes * per_node < 2:
            continue
        for reshard in (True, False):
            yield candidate(
                asked,
                candidate_settings(
                    asked, FSDPConfig, reshard_after_forward=reshard, shard_degree=None
                ),
                nodes,
                per_node,
            )
        if nodes > 1 and per_node > 1:
            yield candidate(
                asked, candidate_settings(asked, FSDPConfig, shard_degree=per_node), nodes, per_node
            )


def label(config: DistbenchConfig, plan: StagePlan | None) -> str:
    """The workers and, where they are not the defaults, the settings the cell's name shows."""
    return " ".join([f"fsdp x{config.world_size}", *fsdp_settings(config).run_name_parts(config)])


SPEC = DistributionSpec(
    name="fsdp",
    title="PyTorch FSDP2",
    settings=FSDPConfig,
    trainer=trainer_in(f"{__name__}.trainer", "fsdp_trainer"),
    epoch_terms=epoch_terms,
    memory_per_worker=memory_per_worker,
    candidates=candidates,
    label=label,
    free_parameters=(COPIES,),
    probed_collectives=(
        Collective.point_to_point,  # the ring over the links, on GPUs
        Collective.allreduce,  # HSDP's, and the share of it a collective takes on GPUs
        Collective.all_gather,
        Collective.reduce_scatter,
    ),
)
