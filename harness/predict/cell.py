"""One cell's predicted seconds per epoch and memory per worker, for any distribution model.

Every model's epoch is split by physical cause, so that one fitting procedure serves them all:

    T = fixed + contention * compute + communication * (allreduce + transfer) + ...

- `compute`: the workers' own forward, backward and update, from the sequential probe (the
  thesis' statistical model), arranged as the model's schedule runs it (data parallel: one
  step per batch; GPipe: fill, steady state and drain of the slowest stage, recomputation
  included; PipeDream: pipeline depth, then one minibatch per bottleneck interval);
- `allreduce`: gradient allreduces that do not hide behind the backward pass;
- `transfer`: activations and their gradients sent between pipeline stages.

The raw equation is every free parameter at its prior value (`RAW`): contention 1,
communication 1. What the parameters mean, and which model uses which, is in
`harness.analysis.fit.PARAMETERS`; they are fitted per hardware and shared between models,
because the physics they stand for (workers sharing a node's cores and memory bandwidth, the
share of the probed bandwidth achieved under load) is the hardware's, not the model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.config import DistbenchConfig, DistributionName, Recompute
from harness.distributions.onefoneb import divisible_batches
from harness.hardware_profile import HardwareProfile
from harness.metrics import BYTES_PER_MB
from harness.predict import activations, gpipe, horovod, memory, pipedream
from harness.predict.facts import CellFacts

# Free parameters of the time equations at their raw (prior) values.
RAW: dict[str, float] = {"contention": 1.0, "communication": 1.0, "horovod_background": 0.0}

# DDP's first gradient bucket is small (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES), so
# that the first allreduce starts early in the backward pass.
DDP_FIRST_BUCKET_MB = 1.0
# Backward share of a training step when no layer profile says otherwise (data-parallel
# cells): a backward pass costs about twice its forward, and the update little.
BACKWARD_SHARE = 2 / 3


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
    # Compute that shares its cores with Horovod's background thread, which wakes every
    # cycle (`distribution.cycle_time_ms`) to negotiate and fuse whatever gradients are ready,
    # all through the step, not only while it communicates. 0 where it has cores of its own.
    background_s: float = 0.0

    @property
    def communication_s(self) -> float:
        return self.allreduce_s + self.transfer_s

    def coefficients(self) -> dict[str, float]:
        """Seconds per unit of each free parameter: the row of a (linear) fit."""
        if not self.concurrent:
            return {}
        return {"contention": self.compute_s, "communication": self.communication_s,
                "horovod_background": self.background_s}

    def fixed_s(self) -> float:
        """The seconds no free parameter scales."""
        return 0.0 if self.concurrent else self.compute_s

    def seconds(self, params: dict[str, float] | None = None) -> float:
        values = {**RAW, **(params or {})}
        return self.fixed_s() + sum(values[name] * coefficient
                                    for name, coefficient in self.coefficients().items())


def samples_per_epoch(config: DistbenchConfig) -> int:
    """`dataset.num_samples`, or the whole dataset (Table 3.2) when it is null."""
    from workloads.datasets import dataset_spec

    if config.dataset.num_samples is not None:
        return config.dataset.num_samples
    return dataset_spec(config.dataset.name.value).num_images


def batches_per_epoch(config: DistbenchConfig) -> int:
    """Training steps of one worker in an epoch, as the harness trains them: full batches only,
    each data-parallel worker on its 1/W shard (PipeDream's count is then made divisible by
    its plan's replicas, see `epoch_terms`)."""
    samples, batch = samples_per_epoch(config), config.batch_size
    if config.distribution.data_parallel:
        return samples // config.world_size // batch
    return samples // batch


def epoch_terms(config: DistbenchConfig, facts: CellFacts,
                profile: HardwareProfile | None) -> EpochTerms:
    """The cell's epoch split into compute, allreduce, transfer and steps (raw equations)."""
    name = config.distribution.name
    steps = _steps(config, facts)
    if name is DistributionName.sequential or config.world_size == 1:
        return EpochTerms(steps * facts.step_seconds, steps=steps)
    assert profile is not None, f"{name.value} over {config.world_size} workers needs a profile"
    if config.distribution.data_parallel:
        return _data_parallel(config, facts, profile, steps)
    if name is DistributionName.gpipe:
        return _gpipe(config, facts, profile, steps)
    split = pipedream.epoch_split(pipedream_stages(config, facts), steps, profile)
    return EpochTerms(split.compute_s, split.allreduce_s, split.transfer_s, steps,
                      concurrent=True)


def _steps(config: DistbenchConfig, facts: CellFacts) -> int:
    if config.distribution.name is DistributionName.pipedream and facts.plan is not None:
        return pipedream_minibatches(config, facts.plan.replicas)
    return batches_per_epoch(config)


def pipedream_minibatches(config: DistbenchConfig, replicas: list[int]) -> int:
    """An epoch's minibatches under PipeDream's batch division (a multiple of the lcm of the
    stages' replica counts, lowered or raised)."""
    return divisible_batches(samples_per_epoch(config) // config.batch_size, replicas,
                             config.distribution.batch_division.value == "oversample")


def communication_overlaps(config: DistbenchConfig) -> bool:
    """Whether gradient allreduces can run beside the backward pass (Eq. 5.1's premise).

    On a GPU the collectives run on their own streams and links while the device computes. A
    CPU worker's gloo allreduce is memory copies and additions on the same cores that compute
    the backward pass, which every worker keeps busy: it cannot hide, it takes its turn."""
    return config.hardware.device.value == "cuda"


def ddp_buckets(gradient_mb: float, bucket_cap_mb: float) -> int:
    """DDP's allreduces per step: a small first bucket, then buckets of `bucket_cap_mb`."""
    first = min(gradient_mb, DDP_FIRST_BUCKET_MB)
    return 1 + math.ceil(max(gradient_mb - first, 0.0) / bucket_cap_mb)


def horovod_allreduces(gradient_mb: float, gradient_tensors: int, threshold_mb: float,
                       cycle_time_ms: float, backward_s: float) -> int:
    """Horovod's allreduces per step: every cycle (`cycle_time_ms`) its background thread
    fuses the gradients that became ready since the last one into one allreduce (at most
    `threshold_mb` each). A backward pass spanning many cycles hands over a few tensors per
    cycle, so the count is the number of cycles it spans, bounded by the tensors (one each)
    and at least what the threshold forces (Tensor Fusion's buffers)."""
    by_threshold = math.ceil(gradient_mb / threshold_mb) if threshold_mb > 0 else gradient_tensors
    cycles = math.ceil(backward_s * 1000 / cycle_time_ms)
    return max(1, by_threshold, min(gradient_tensors, cycles))


def allreduce_seconds(profile: HardwareProfile, workers: int, total_mb: float,
                      messages: int) -> float:
    """`messages` allreduces moving `total_mb` MB in all among `workers` workers: each pays
    the latency, the bytes pay the bandwidth. The probe's measured allreduce among that many
    workers when the profile has one, else the ring over the slowest link (Eq. 5.1's form:
    2(W-1) steps of m/W MB)."""
    if workers < 2 or total_mb <= 0:
        return 0.0
    try:
        cost = profile.allreduce_cost(workers)
    except KeyError:
        ring = horovod.ring_allreduce_seconds
        per_message = ring(profile, workers, total_mb / messages)
        return messages * per_message
    return messages * cost.latency_s + total_mb * BYTES_PER_MB / cost.bandwidth_bytes_per_s


def _data_parallel(config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile,
                   steps: int) -> EpochTerms:
    """Eq. 5.1, with what the workers' hardware lets hide: on dedicated devices only the last
    bucket (DDP) or fused buffer (Horovod) is exposed, as the thesis assumes; on CPU workers
    sharing cores every allreduce of the step is (`communication_overlaps`), each message with
    its latency (DDP's buckets, Horovod's per-cycle fusions)."""
    distribution, workers = config.distribution, config.world_size
    horovod_model = distribution.name is DistributionName.horovod
    threshold = distribution.fusion_threshold_mb if horovod_model else distribution.bucket_cap_mb
    if communication_overlaps(config):
        exposed = horovod.exposed_mb(facts.gradient_mb, threshold)
        allreduce = horovod.ring_allreduce_seconds(profile, workers, exposed)
    else:
        if horovod_model:
            messages = horovod_allreduces(facts.gradient_mb, facts.gradient_tensors, threshold,
                                          distribution.cycle_time_ms,
                                          BACKWARD_SHARE * facts.step_seconds)
        else:
            messages = ddp_buckets(facts.gradient_mb, threshold)
        allreduce = allreduce_seconds(profile, workers, facts.gradient_mb, messages)
    compute = steps * facts.step_seconds
    background = compute if horovod_model and not communication_overlaps(config) else 0.0
    return EpochTerms(compute, steps * allreduce, 0.0, steps, concurrent=True,
                      background_s=background)


def recompute_share(recompute: Recompute, micro_batches: int) -> float:
    """Share of the micro-batches whose forward runs again in the backward pass (GPipe's
    activation checkpointing): all (`always`), all but the last (`except_last`), none."""
    return {Recompute.always: 1.0, Recompute.never: 0.0,
            Recompute.except_last: (micro_batches - 1) / micro_batches}[recompute]


def _gpipe(config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile,
           steps: int) -> EpochTerms:
    """GPipe per batch: the schedule over the plan's real stages (`gpipe.schedule_seconds`,
    Eq. 6.1 generalised to uneven stages and recomputation) and Eq. 6.2's transfers."""
    micro_batches, plan = config.micro_batches, facts.plan
    assert plan is not None
    t = facts.step_seconds  # one sequential step at the micro-batch size
    stages = [gpipe.StageWork(
        forward_s=t * sum(layer.forward_share for layer in facts.layers[s.first:s.end]),
        backward_s=t * sum(layer.backward_share for layer in facts.layers[s.first:s.end]),
        update_s=t * sum(layer.update_share for layer in facts.layers[s.first:s.end]))
        for s in plan.stages]
    compute = gpipe.schedule_seconds(
        stages, micro_batches, recompute_share(config.distribution.recompute, micro_batches))
    boundaries = [facts.layers[stage.end - 1].activation_mb_per_sample
                  for stage in plan.stages[:-1]]
    costs = gpipe.link_costs(boundaries, facts.step_batch, profile)
    return EpochTerms(steps * compute, 0.0,
                      steps * gpipe.communication_seconds(costs, micro_batches), steps,
                      concurrent=True)


def pipedream_stages(config: DistbenchConfig,
                     facts: CellFacts) -> list[pipedream.PipelineStage]:
    """The plan's stages with their share of the probed sequential step."""
    assert facts.plan is not None
    stages = []
    for index, stage in enumerate(facts.plan.stages):
        layers = facts.layers[stage.first:stage.end]
        last = index == len(facts.plan.stages) - 1
        stages.append(pipedream.PipelineStage(
            compute_s=facts.step_seconds * sum(layer.compute_share for layer in layers),
            replicas=stage.replicas,
            weights_mb=sum(layer.weights_mb for layer in layers),
            output_mb=0.0 if last else config.batch_size * layers[-1].activation_mb_per_sample))
    return stages


def memory_per_worker_mb(config: DistbenchConfig, facts: CellFacts, *,
                         runtime_mb: float = 0.0) -> list[float]:
    """Predicted peak MB of every worker (`predict.memory`): the model's terms, the measured
    runtime share (`facts.runtime_mb`) and `runtime_mb`, a remainder learnt from other cells."""
    return [worker.total + runtime_mb for worker in memory_terms_per_worker(config, facts)]


def memory_terms_per_worker(config: DistbenchConfig, facts: CellFacts) -> list:
    """Every worker's predicted peak, term by term (`predict.memory.WorkerMemory`)."""
    momentum = config.optimizer.momentum > 0
    distribution = config.distribution
    runtime = facts.runtime_mb
    if not distribution.pipeline:
        # Horovod reads its threshold in MiB (harness.distributions.horovod): 64 -> 67.1 MB
        buffer = {DistributionName.horovod: memory.horovod_buffer_mb(
                      facts.gradient_mb, distribution.fusion_threshold_mb * 1.048576),
                  DistributionName.ddp: memory.ddp_buffer_mb(facts.gradient_mb)
                  }.get(distribution.name, 0.0)
        one = memory.data_parallel_memory(
            facts.weights_mb, facts.gradient_mb, memory_stage(facts, 0, len(facts.layers)),
            config.batch_size, buffer_mb=buffer, momentum=momentum, runtime_mb=runtime)
        return [one] * (1 if distribution.name is DistributionName.sequential
                        else config.world_size)
    assert facts.plan is not None
    replicas = [stage.replicas for stage in facts.plan.stages]
    result = []
    for index, stage in enumerate(facts.plan.stages):
        part = memory_stage(facts, stage.first, stage.end)
        if distribution.name is DistributionName.gpipe:
            one = memory.gpipe_stage_memory(part, facts.step_batch, config.micro_batches,
                                            distribution.recompute.value, momentum=momentum,
                                            runtime_mb=runtime)
        else:
            one = memory.pipedream_stage_memory(part, config.batch_size, replicas, index,
                                                held_sends=held_sends(config, replicas, index),
                                                momentum=momentum, runtime_mb=runtime)
        result.extend([one] * stage.replicas)
    return result


def held_sends(config: DistbenchConfig, replicas: list[int], index: int) -> int:
    """Minibatches whose sent tensors a PipeDream worker of stage `index` holds at once: over
    gloo all of its epoch's (a gloo send is complete only once waited for, and the trainer
    waits at the epoch's end), elsewhere none beyond those in flight."""
    backend = config.distribution.backend or \
        ("nccl" if config.hardware.device.value == "cuda" else "gloo")
    if backend != "gloo":
        return 0
    return pipedream_minibatches(config, replicas) // replicas[index]


def memory_stage(facts: CellFacts, first: int, end: int):  # noqa: ANN201 - memory.StageFacts
    """Layers [first, end) as the memory terms see them: weights, what autograd saves (per
    sample and constant, each storage once) and the boundary tensors a stage keeps. Without
    measured saved bytes (`LayerFacts.saved`), each layer's output stands for them."""
    layers = facts.layers[first:end]
    entering = facts.input_mb_per_sample if first == 0 else \
        facts.layers[first - 1].activation_mb_per_sample
    weights = sum(layer.weights_mb for layer in layers)
    saved = [layer.saved for layer in facts.layers]
    if any(layer is None for layer in saved):
        return memory.StageFacts(weights, sum(layer.activation_mb_per_sample for layer in layers),
                                 0.0, entering, layers[-1].activation_mb_per_sample, 0.0)
    constant = activations.stage_saved_mb(saved, first, end, 0)
    per_sample = activations.stage_saved_mb(saved, first, end, 1) - constant
    held_in, held_out = activations.stage_boundary_mb(saved, first, end,
                                                      facts.input_mb_per_sample)
    entries = [(activations.stage_saved_mb(saved, i, i + 1, 1)
                - activations.stage_saved_mb(saved, i, i + 1, 0),
                activations.stage_saved_mb(saved, i, i + 1, 0)) for i in range(first, end)]
    largest = max(entries)
    return memory.StageFacts(weights, per_sample, constant, entering,
                             layers[-1].activation_mb_per_sample, held_in + held_out,
                             largest[0], largest[1])


def cost_per_epoch(config: DistbenchConfig, seconds: float) -> float | None:
    """The hardware's price of an epoch: devices in use x hours x price per device-hour."""
    price = config.hardware.price_per_device_hour
    if price is None:
        return None
    devices = 1 if config.distribution.name is DistributionName.sequential \
        else config.world_size
    return devices * seconds / 3600 * price

