"""What every distribution model's prediction is made of: the cell's measured facts, an
epoch split by physical cause (`EpochTerms`), and the terms the models share.

Every model's epoch is split by physical cause, so that one fitting procedure serves them all:

    T = fixed + contention * compute + communication * (allreduce + transfer) + ...

- `compute`: the workers' own forward, backward and update, from the sequential probe (the
  thesis' statistical model), arranged as the model's schedule runs it (data parallel: one
  step per batch; GPipe: fill, steady state and drain of the slowest stage, recomputation
  included; PipeDream: pipeline depth, then one minibatch per bottleneck interval);
- `allreduce`: gradient allreduces that do not hide behind the backward pass;
- `transfer`: activations and their gradients sent between pipeline stages.

The raw equation is every free parameter at its prior value (`harness.predict.parameters.RAW`:
contention 1, communication 1, a model's own at theirs). The two are every multi-worker
model's (`SHARED_PARAMETERS`): fitted per hardware and shared between models, because the
physics they stand for (workers sharing a node's cores and memory bandwidth, the share of the
probed bandwidth achieved under load) is the hardware's, not the model's. A model whose
physics has a term of its own declares its parameter in its spec
(`DistributionSpec.free_parameters`, e.g. Horovod's background thread) and puts the term in
its `EpochTerms.model_terms`; `harness.predict.parameters.PARAMETERS` holds them all.

Each model's own equations are in its module (`harness.distributions.<name>`, its
`DistributionSpec`); `harness.predict.cell` dispatches to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.config.schema import DistbenchConfig
from harness.config.units import BYTES_PER_MB
from harness.costs import activations, allreduce, memory, overlap
from harness.costs.partition import StagePlan
from harness.profiles.hardware import HardwareProfile
from harness.profiles.stages import InPlaceStages


@dataclass(frozen=True)
class FreeParameter:
    """One free parameter of the time equations: what it means, and the prior that keeps it
    near the raw equation."""

    name: str
    meaning: str
    prior: float  # its raw value: the equation as derived, before any fit
    # The prior's spread: a deviation of sigma costs as much as one cell 100 % off, so a
    # deviation of sigma / 20 costs what one cell 5 % off does. Wide: the data decide as soon
    # as there are a few cells; with none or one the raw value holds or moves little.
    sigma: float


CONTENTION = FreeParameter(
    "contention",
    "how much slower a worker computes while the other workers of its node compute too "
    "(shared cores, caches and memory bandwidth); 1 = as fast as alone (the probe)",
    1.0,
    5.0,
)
COMMUNICATION = FreeParameter(
    "communication",
    "seconds of communication per second the probed link speeds predict (allreduces and "
    "stage transfers under load, not hidden behind compute); 1 = the probe's speed",
    1.0,
    10.0,
)
# Every multi-worker model's parameters, in the order a fit lists them.
SHARED_PARAMETERS: tuple[FreeParameter, ...] = (CONTENTION, COMMUNICATION)
# The shared parameters at their raw (prior) values (`harness.predict.parameters.RAW` adds
# the models' own).
SHARED_RAW: dict[str, float] = {parameter.name: parameter.prior for parameter in SHARED_PARAMETERS}

# Backward share of a training step when no layer profile says otherwise (data-parallel
# cells): a backward pass costs about twice its forward, and the update little.
BACKWARD_SHARE = 2 / 3


@dataclass(frozen=True)
class LayerFacts:
    weights_mb: float
    activation_mb_per_sample: float  # the layer's output, per sample
    compute_share: float  # of the whole network's forward+backward+update time (pipelines)
    # The same split by phase, as shares of one whole training step (forward + backward + one
    # update of all weights); they sum to 1 over the layers. Pipelines need them apart: GPipe
    # recomputes forwards and updates once per batch, not once per micro-batch.
    forward_share: float = 0.0
    backward_share: float = 0.0
    update_share: float = 0.0
    # What autograd saves for the backward pass (`predict.activations.LayerSaved`), measured;
    # None where it was not (the memory model then counts the layer's output).
    saved: Any = None


@dataclass(frozen=True)
class CellFacts:
    """The inputs of a cell's prediction (measured by `harness.predict.facts.gather`)."""

    weights_mb: float
    gradient_mb: float
    input_mb_per_sample: float
    layers: list[LayerFacts]
    step_seconds: float  # one sequential training step at `step_batch` (probe median)
    step_batch: int  # the batch the models scale from: micro-batch (GPipe), else the batch
    gradient_tensors: int = 1  # parameter tensors with a gradient (Horovod's allreduce count)
    plan: StagePlan | None = None  # pipelines: layers and replicas per stage
    probe_seconds: float = 0.0  # how long measuring these facts took (0 when cached)
    runtime_mb: float = 0.0  # a worker process's memory besides the model (`predict.runtime`)
    # Of `runtime_mb`, what a cell's recorded peak leaves out: on CUDA the context, outside
    # torch's allocator (`profiles.runtime.RuntimeShare`); 0 on a CPU.
    context_mb: float = 0.0
    # Pipelines: the plan's stages timed in place (`harness.stage_timing`), where measured;
    # their time equations then read it instead of the layers' shares of `step_seconds`.
    stages_in_place: InPlaceStages | None = None

    @property
    def activation_mb_per_sample(self) -> float:
        return sum(layer.activation_mb_per_sample for layer in self.layers)


@dataclass(frozen=True)
class EpochTerms:
    """An epoch's prediction before the free parameters are applied (module docstring)."""

    compute_s: float
    allreduce_s: float = 0.0
    transfer_s: float = 0.0
    steps: int = 0
    # Several workers compute at once (every multi-worker model): their compute is what the
    # contention factor scales. A sequential cell's compute is the probe itself.
    concurrent: bool = False
    # The compute was timed as the cell runs it, its workers computing at once (a pipeline's
    # stages timed in place, `CellFacts.stages_in_place`): the contention is in it already,
    # so the contention factor does not scale it again; it is fixed seconds.
    compute_timed_concurrently: bool = False
    # Terms of the model's own free parameters (each declared in its spec): (parameter,
    # seconds per unit of it). Horovod's: the compute that shares its cores with its
    # background thread.
    model_terms: tuple[tuple[FreeParameter, float], ...] = ()

    @property
    def communication_s(self) -> float:
        return self.allreduce_s + self.transfer_s

    def coefficients(self) -> dict[str, float]:
        """Seconds per unit of each free parameter: the row of a (linear) fit."""
        if not self.concurrent:
            return {}
        contended = 0.0 if self.compute_timed_concurrently else self.compute_s
        return {
            CONTENTION.name: contended,
            COMMUNICATION.name: self.communication_s,
            **{parameter.name: seconds for parameter, seconds in self.model_terms},
        }

    def fixed_s(self) -> float:
        """The seconds no free parameter scales."""
        scaled = self.concurrent and not self.compute_timed_concurrently
        return 0.0 if scaled else self.compute_s

    def seconds(self, params: dict[str, float] | None = None) -> float:
        values = {
            **SHARED_RAW,
            **{parameter.name: parameter.prior for parameter, _ in self.model_terms},
            **(params or {}),
        }
        return self.fixed_s() + sum(
            values[name] * coefficient for name, coefficient in self.coefficients().items()
        )


def batches_per_epoch(config: DistbenchConfig) -> int:
    """Training steps of one worker in an epoch, as the harness trains them: full batches only,
    each worker on its shard of the data (`DistributionConfig.data_shards`; PipeDream's count
    is then made divisible by its plan's replicas, in its own terms)."""
    samples, batch = config.samples_per_epoch, config.batch_size
    return samples // config.distribution.data_shards(config) // batch


def communication_overlaps(config: DistbenchConfig) -> bool:
    """Whether collectives can run beside the compute (Eq. 5.1's premise), each only as far as
    there is compute to hide behind (`predict.overlap`).

    On a GPU the collectives run on their own streams and links while the device computes. A
    CPU worker's gloo collective is memory copies and additions, and socket writes, on the cores
    that compute the backward pass: on one machine, where loopback is those copies too, it takes its
    turn. Across nodes a data-parallel allreduce spends most of its time on the link, beside the
    compute (`allreduces_overlap_backward`); FSDP's collectives there still take their turn (their
    copies in and out of the buffers are on the cores: on a timeline FSDP was predicted 23 % too
    fast: docs/benchmarks/2026-11-29-emulated-overlap-bucket-profiles.md, "DDP and Horovod across
    nodes on the overlap timeline (shipped) (2026-11-29)")."""
    return config.hardware.device.value == "cuda"


def allreduces_overlap_backward(config: DistbenchConfig) -> bool:
    """Whether a data-parallel step's allreduces run beside the backward still to run, each
    bucket hiding behind it (`overlapped_allreduce_seconds`): wherever collectives overlap the
    compute (GPUs), and on CPU workers whose allreduce crosses links between machines, where
    the bytes wait on the link while the node's cores go on with the backward. On the cores of
    one machine (one node, or `hardware.one_host` nodes) each allreduce takes its turn: gloo's
    copies and reductions run on the cores the backward needs.

    Measured across two emulated nodes at 1 Gbit/s and 100 Mbit/s, five networks held out one
    at a time (docs/benchmarks/2026-11-29-emulated-overlap-bucket-profiles.md, "DDP and Horovod
    across nodes on the overlap timeline (shipped) (2026-11-29)"): the timeline took DDP's held-out
    MAPE from 8.2 to 5.7 % and Horovod's from 10.9 to 10.3 %, the raw equations' (no fit) from 9.9
    to 4.1 % and 15.9 to 6.5 %. An earlier sweep (2026-11-27) had said the opposite, before FSDP's
    collectives were priced by their wire bytes and with Horovod's allreduces priced as whole 64 MB
    fusion buffers."""
    return communication_overlaps(config) or config.hardware.group_crosses_links(config.world_size)


def burst_bytes(config: DistbenchConfig) -> float:
    """Bytes of a message that leave an emulated node's link at once, above its rate: the
    token bucket that shapes it (`hardware.link.burst_kb`) refills at the rate while the node
    computes, and a message no larger than the bucket passes at the speed of the machine's
    own virtual link. A pipeline's boundary tensors are often that small (VGG-11's 131 KB a
    micro-batch: its GPipe cell measured 2.38 s at 1 Gbit/s and 2.52 s at 100 Mbit/s, where the rate
    alone prices 1.3 s of transfers); what exceeds the bucket goes at the rate (ResNet-50's 1.05 MB:
    8.4 s at 100 Mbit/s priced, 8.35 s measured;
    docs/benchmarks/2026-11-29-emulated-overlap-bucket-profiles.md, "The emulated link's bucket,
    priced (shipped) (2026-11-29)"). 0 on real links, whose bytes all go at the link's speed."""
    link = config.hardware.link
    return link.burst_bytes if link is not None else 0.0


def allreduce_seconds(
    profile: HardwareProfile, workers: int, total_mb: float, messages: int
) -> float:
    """`messages` allreduces moving `total_mb` MB in all among `workers` workers: each pays
    the latency, the bytes pay the bandwidth. The probe's measured allreduce among that many
    workers when the profile has one, else the ring over the slowest link (Eq. 5.1's form:
    2(W-1) steps of m/W MB)."""
    if workers < 2 or total_mb <= 0:
        return 0.0
    try:
        cost = profile.allreduce_cost(workers)
    except KeyError:
        per_message = allreduce.ring_allreduce_seconds(profile, workers, total_mb / messages)
        return messages * per_message
    return messages * cost.latency_s + total_mb * BYTES_PER_MB / cost.bandwidth_bytes_per_s


def data_parallel_terms(
    config: DistbenchConfig,
    facts: CellFacts,
    profile: HardwareProfile,
    *,
    exposed_threshold_mb: float,
    messages: int,
    background: FreeParameter | None = None,
) -> EpochTerms:
    """Eq. 5.1 for a model with one whole replica per worker, with what the workers' hardware
    lets hide: where allreduces can run beside the backward (`allreduces_overlap_backward`:
    GPUs, and CPU workers across nodes), each bucket or fused buffer (of `exposed_threshold_mb`;
    0: one per layer) hides only behind the backward still to run after it
    (`overlapped_allreduce_seconds`: at least the last one is exposed, as the thesis assumes,
    at most all); on CPU workers of one machine every allreduce of the step is exposed, each of
    the `messages` with its latency. `background`: the model's parameter for a thread that
    shares the compute's cores (Horovod's cycle), scaling all of the compute."""
    workers, steps = config.world_size, batches_per_epoch(config)
    if allreduces_overlap_backward(config):
        allreduce = overlapped_allreduce_seconds(
            config, facts, profile, workers, exposed_threshold_mb
        )
    else:
        allreduce = allreduce_seconds(profile, workers, facts.gradient_mb, messages)
    compute = steps * facts.step_seconds
    # Horovod's cycle thread takes its share of a CPU worker's cores wherever the worker
    # computes on them, on one machine or on a node of its own; a GPU worker's compute is the
    # device's.
    model_terms: tuple[tuple[FreeParameter, float], ...] = ()
    if background is not None and config.hardware.device.value != "cuda":
        model_terms = ((background, compute),)
    return EpochTerms(
        compute, steps * allreduce, 0.0, steps, concurrent=True, model_terms=model_terms
    )


def gradient_buckets(facts: CellFacts, cap_mb: float) -> list[tuple[float, float]]:
    """(backward seconds, gradient MB) of each bucket of at most `cap_mb` (0: a bucket per
    layer), in the order the backward pass fills them: from the last layer back, each bucket
    ready once the backward has run through its layers."""
    scale = facts.gradient_mb / max(facts.weights_mb, 1e-12)
    buckets: list[tuple[float, float]] = []
    seconds = megabytes = 0.0
    for layer in reversed(facts.layers):
        seconds += layer_backward_share(facts, layer) * facts.step_seconds
        megabytes += layer.weights_mb * scale
        if megabytes > 0 and (cap_mb <= 0 or megabytes >= cap_mb):
            buckets.append((seconds, megabytes))
            seconds = megabytes = 0.0
    if megabytes > 0 or not buckets:
        buckets.append((seconds, megabytes or facts.gradient_mb))
    return buckets


def layer_backward_share(facts: CellFacts, layer: LayerFacts) -> float:
    """A layer's backward as a share of one step: profiled, else BACKWARD_SHARE spread evenly
    over the layers."""
    if any(other.backward_share > 0 for other in facts.layers):
        return layer.backward_share
    return BACKWARD_SHARE / max(len(facts.layers), 1)


def layer_forward_share(facts: CellFacts, layer: LayerFacts) -> float:
    """A layer's forward as a share of one step: profiled, else the rest of the step after
    BACKWARD_SHARE, spread evenly over the layers."""
    if any(other.forward_share > 0 for other in facts.layers):
        return layer.forward_share
    return (1 - BACKWARD_SHARE) / max(len(facts.layers), 1)


def overlapped_allreduce_seconds(
    config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile, workers: int, cap_mb: float
) -> float:
    """A step's allreduce seconds the backward does not hide (`predict.overlap`): every
    bucket's allreduce queued on the link as soon as the backward has filled it, so that a
    bucket hides only behind the backward still to run after it; at least the last bucket is
    exposed, at most all of them, whatever the thesis' 'only the last' assumes."""
    buckets = gradient_buckets(facts, cap_mb)
    if config.hardware.device.value == "cuda":  # Eq. 5.1's ring over the links, per bucket
        collectives = [
            allreduce.ring_allreduce_seconds(profile, workers, megabytes)
            for _, megabytes in buckets
        ]
    else:  # the probe's allreduce among the workers (the ring where it measured none)
        collectives = [
            allreduce_seconds(profile, workers, megabytes, 1) for _, megabytes in buckets
        ]
    # A CPU worker's allreduce between nodes takes its cores from the backward it runs beside
    # (the probe's `compute_lost_ms_per_mb`; 0 where it measured none, and on a GPU).
    lost = profile.compute_lost_s_per_mb() if config.hardware.device.value != "cuda" else 0.0
    return overlap.after_each_chunk(
        [seconds for seconds, _ in buckets],
        collectives,
        overlaps=True,
        cores_s=[lost * megabytes for _, megabytes in buckets],
    )


def replica_memory(
    config: DistbenchConfig, facts: CellFacts, *, buffer_mb: float = 0.0
) -> memory.WorkerMemory:
    """One worker holding a whole replica that trains a whole (per-worker) batch, with a
    communication buffer of `buffer_mb` (sequential, DDP, Horovod)."""
    return memory.data_parallel_memory(
        facts.weights_mb,
        facts.gradient_mb,
        memory_stage(facts, 0, len(facts.layers)),
        config.batch_size,
        buffer_mb=buffer_mb,
        optimizer_states=config.optimizer.state_buffers,
        runtime_mb=facts.runtime_mb,
    )


def memory_stage(facts: CellFacts, first: int, end: int) -> memory.StageFacts:
    """Layers [first, end) as the memory terms see them: weights, what autograd saves (per
    sample and constant, each storage once) and the boundary tensors a stage keeps. Without
    measured saved bytes (`LayerFacts.saved`), each layer's output stands for them."""
    layers = facts.layers[first:end]
    entering = (
        facts.input_mb_per_sample
        if first == 0
        else facts.layers[first - 1].activation_mb_per_sample
    )
    weights = sum(layer.weights_mb for layer in layers)
    saved = [layer.saved for layer in facts.layers]
    if any(layer is None for layer in saved):
        return memory.StageFacts(
            weights,
            sum(layer.activation_mb_per_sample for layer in layers),
            0.0,
            entering,
            layers[-1].activation_mb_per_sample,
            0.0,
        )
    constant = activations.stage_saved_mb(saved, first, end, 0)
    per_sample = activations.stage_saved_mb(saved, first, end, 1) - constant
    held_in, held_out = activations.stage_boundary_mb(saved, first, end, facts.input_mb_per_sample)
    entries = [
        (
            activations.stage_saved_mb(saved, i, i + 1, 1)
            - activations.stage_saved_mb(saved, i, i + 1, 0),
            activations.stage_saved_mb(saved, i, i + 1, 0),
        )
        for i in range(first, end)
    ]
    largest = max(entries)
    return memory.StageFacts(
        weights,
        per_sample,
        constant,
        entering,
        layers[-1].activation_mb_per_sample,
        held_in + held_out,
        largest[0],
        largest[1],
    )
