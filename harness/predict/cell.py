"""One cell's predicted seconds per epoch and memory per worker, for any distribution model.

Every model's epoch time is split the same way, so that one fitting procedure serves them all:

    T = alpha * compute + beta * communication + gamma * steps

`compute` and `communication` are the model's own equation split into its two parts (Eq. 4.x,
5.1, 6.1 + 6.2, `predict.pipedream`), `steps` the optimizer steps (or pipeline batches) of an
epoch. alpha = beta = 1, gamma = 0 is the raw equation. The fitted values have a meaning a
reader can check: alpha is how much slower a step runs inside the distributed job than in the
sequential probe (cores shared with communication, data loading), beta is 1 / (achieved share
of the probed bandwidth x share of communication not hidden behind compute), gamma a fixed
per-step cost (synchronisation, Python, negotiation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from harness.config import DistbenchConfig, DistributionName
from harness.distributions.onefoneb import divisible_batches
from harness.hardware_profile import HardwareProfile
from harness.predict import gpipe, horovod, memory, pipedream
from harness.predict.facts import CellFacts


@dataclass(frozen=True)
class ModelParams:
    """The free parameters of one distribution model's time equation (module docstring)."""

    compute_scale: float = 1.0  # alpha
    communication_scale: float = 1.0  # beta
    step_overhead_s: float = 0.0  # gamma

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


RAW = ModelParams()


@dataclass(frozen=True)
class EpochTerms:
    """An epoch's prediction before the free parameters are applied."""

    compute_s: float
    communication_s: float
    steps: int

    def seconds(self, params: ModelParams = RAW) -> float:
        return (params.compute_scale * self.compute_s
                + params.communication_scale * self.communication_s
                + params.step_overhead_s * self.steps)

    def features(self) -> list[float]:
        """The coefficients of (alpha, beta, gamma): the row of a least-squares fit."""
        return [self.compute_s, self.communication_s, float(self.steps)]


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
    """The cell's epoch split into compute, communication and steps (raw equations)."""
    name = config.distribution.name
    steps = _steps(config, facts)
    if name is DistributionName.sequential or config.world_size == 1:
        return EpochTerms(steps * facts.step_seconds, 0.0, steps)
    assert profile is not None, f"{name.value} over {config.world_size} workers needs a profile"
    if config.distribution.data_parallel:
        return _data_parallel(config, facts, profile, steps)
    if name is DistributionName.gpipe:
        return _gpipe(config, facts, profile, steps)
    split = pipedream.epoch_split(pipedream_stages(config, facts), steps, profile)
    return EpochTerms(split.compute_s, split.communication_s, steps)


def _steps(config: DistbenchConfig, facts: CellFacts) -> int:
    if config.distribution.name is DistributionName.pipedream and facts.plan is not None:
        return divisible_batches(samples_per_epoch(config) // config.batch_size,
                                 facts.plan.replicas,
                                 config.distribution.batch_division.value == "oversample")
    return batches_per_epoch(config)


def _data_parallel(config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile,
                   steps: int) -> EpochTerms:
    """Eq. 5.1 (Horovod: fusion threshold th; DDP: its bucket size)."""
    distribution = config.distribution
    threshold = distribution.fusion_threshold_mb \
        if distribution.name is DistributionName.horovod else distribution.bucket_cap_mb
    exposed = horovod.exposed_mb(facts.gradient_mb, threshold)
    allreduce = horovod.ring_allreduce_seconds(profile, config.world_size, exposed)
    return EpochTerms(steps * facts.step_seconds, steps * allreduce, steps)


def _gpipe(config: DistbenchConfig, facts: CellFacts, profile: HardwareProfile,
           steps: int) -> EpochTerms:
    """Eq. 6.1 + 6.2, T_seq being #mb probed micro-batch steps."""
    micro_batches, plan = config.micro_batches, facts.plan
    assert plan is not None
    t_seq = micro_batches * facts.step_seconds
    compute = gpipe.compute_seconds(t_seq, plan.workers, micro_batches)
    boundaries = [facts.layers[stage.end - 1].activation_mb_per_sample
                  for stage in plan.stages[:-1]]
    costs = gpipe.link_costs(boundaries, facts.step_batch, profile)
    return EpochTerms(steps * compute,
                      steps * gpipe.communication_seconds(costs, micro_batches), steps)


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
    """Predicted peak MB of every worker (`predict.memory`), plus `runtime_mb` each."""
    momentum = config.optimizer.momentum > 0
    distribution = config.distribution
    if not distribution.pipeline:
        buffer = {DistributionName.horovod: min(distribution.fusion_threshold_mb,
                                                facts.gradient_mb),
                  DistributionName.ddp: facts.gradient_mb}.get(distribution.name, 0.0)
        one = memory.data_parallel_mb(facts.weights_mb, facts.activation_mb_per_sample,
                                      config.batch_size, communication_buffer_mb=buffer,
                                      momentum=momentum, runtime_mb=runtime_mb)
        return [one] * (1 if distribution.name is DistributionName.sequential
                        else config.world_size)
    assert facts.plan is not None
    result = []
    for index, stage in enumerate(facts.plan.stages):
        layers = facts.layers[stage.first:stage.end]
        entering = facts.input_mb_per_sample if index == 0 else \
            facts.layers[stage.first - 1].activation_mb_per_sample
        stage_facts = memory.StageFacts(sum(layer.weights_mb for layer in layers),
                                        sum(layer.activation_mb_per_sample for layer in layers),
                                        entering)
        if distribution.name is DistributionName.gpipe:
            one = memory.gpipe_stage_mb(stage_facts, facts.step_batch, config.micro_batches,
                                        distribution.recompute.value, momentum=momentum,
                                        runtime_mb=runtime_mb)
        else:
            one = memory.pipedream_stage_mb(stage_facts, config.batch_size,
                                            len(facts.plan.stages) - 1 - index, stage.replicas,
                                            momentum=momentum, runtime_mb=runtime_mb)
        result.extend([one] * stage.replicas)
    return result


def cost_per_epoch(config: DistbenchConfig, seconds: float) -> float | None:
    """The hardware's price of an epoch: devices in use x hours x price per device-hour."""
    price = config.hardware.price_per_device_hour
    if price is None:
        return None
    devices = 1 if config.distribution.name is DistributionName.sequential \
        else config.world_size
    return devices * seconds / 3600 * price

