"""A plan's settings (`distribution=mesh`): the mesh's degrees, the pipeline's schedule,
micro-batches, activation checkpointing and precision, and their checks against a cell. The
package's docstring says what each does."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from harness.config.accepts import integer
from harness.config.batch_sizes import nearest_divisors
from harness.config.schema import ConfigError, DistbenchConfig, require
from harness.distributions.layer_settings import LayerSettingsConfig


class Schedule(str, Enum):
    """The `torch.distributed.pipelining` schedule of a plan with pipeline stages."""

    gpipe = "gpipe"  # ScheduleGPipe: every micro-batch's forward, then every backward
    one_f_one_b = "1f1b"  # Schedule1F1B: one forward, one backward, in the steady state
    interleaved_1f1b = "interleaved_1f1b"  # ScheduleInterleaved1F1B: looped virtual stages
    looped_bfs = "looped_bfs"  # ScheduleLoopedBFS: a virtual stage's micro-batches at once
    interleaved_zb = "interleaved_zb"  # ScheduleInterleavedZeroBubble: weight grads deferred
    zbv = "zbv"  # ScheduleZBVZeroBubble: two stages per worker in a V, zero bubble
    dualpipev = "dualpipev"  # ScheduleDualPipeV: DeepSeek's DualPipe on a V

    @property
    def torch_class(self) -> str:
        """The schedule's class in torch.distributed.pipelining."""
        return {
            "gpipe": "ScheduleGPipe",
            "1f1b": "Schedule1F1B",
            "interleaved_1f1b": "ScheduleInterleaved1F1B",
            "looped_bfs": "ScheduleLoopedBFS",
            "interleaved_zb": "ScheduleInterleavedZeroBubble",
            "zbv": "ScheduleZBVZeroBubble",
            "dualpipev": "ScheduleDualPipeV",
        }[self.value]

    @property
    def stages_per_rank(self) -> tuple[int, int | None]:
        """(fewest, most) stages a worker may hold under this schedule (None: no limit)."""
        if self in (Schedule.gpipe, Schedule.one_f_one_b):
            return 1, 1
        if self in (Schedule.zbv, Schedule.dualpipev):
            return 2, 2  # the V: worker r holds stages r and 2 x pp - 1 - r
        return 2, None

    @property
    def v_shaped(self) -> bool:
        return self in (Schedule.zbv, Schedule.dualpipev)


@dataclass
class MeshConfig(LayerSettingsConfig):
    """A plan's settings: the mesh's degrees, the pipeline's schedule, micro-batches,
    activation checkpointing and precision."""

    name: str = "mesh"
    # Workers that hold whole replicas of each other's weights (data parallel, gradients
    # allreduced across them); with dp_shard > 1, the replicas of HSDP.
    dp_replicate: int = field(default=1, metadata=integer(1, 2**31 - 1, "workers"))
    # Workers each weight, gradient and optimizer state is sharded over (FSDP2); null = the
    # workers the other degrees leave: the world size / (dp_replicate x tp x pp).
    dp_shard: int | None = field(default=None, metadata=integer(1, 2**31 - 1, "workers"))
    # Workers each transformer block's attention and MLP are split over (Megatron-style); the
    # network's source must give a plan (docs/networks.md), its heads and hidden sizes divide.
    tp: int = field(default=1, metadata=integer(1, 2**31 - 1, "workers"))
    # With tp > 1: the norms and the residual stream between blocks split along the sequence
    # too (activations / tp there), all-gathered before each attention and MLP.
    sequence_parallel: bool = False
    # Tensor parallelism whose workers span nodes (tp > hardware.workers_per_node): refused
    # unless asked for, since every layer then waits on the nodes' link.
    tp_across_nodes: bool = False
    # Pipeline stages, each a slice of the network's layer list (times stages_per_rank).
    pp: int = field(default=1, metadata=integer(1, 2**31 - 1, "stages"))
    # The pipeline's schedule (pp > 1): gpipe | 1f1b | interleaved_1f1b | looped_bfs |
    # interleaved_zb | zbv | dualpipev (a string: "1f1b" is no Python name for an enum).
    schedule: str = Schedule.one_f_one_b.value
    # Stages each worker of the pipeline holds (virtual stages); null = the schedule's least
    # (1; 2 for the interleaved, looped and V schedules).
    stages_per_rank: int | None = field(default=None, metadata=integer(1, 1_000_000, "stages"))
    # Samples of one micro-batch; null = a data-parallel position's batch over pp (one
    # micro-batch per stage) with a pipeline, else its whole batch (no accumulation).
    micro_batch_size: int | None = field(default=None, metadata=integer(1, 2**31 - 1, "samples"))
    # (activation_checkpointing, checkpoint_every, precision: LayerSettingsConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        allowed = [kind.value for kind in Schedule]
        require(
            self.schedule in allowed,
            "distribution.schedule",
            self.schedule,
            f"allowed: {', '.join(allowed)}",
        )
        for key in ("dp_replicate", "tp", "pp"):
            require(
                getattr(self, key) >= 1,
                f"distribution.{key}",
                getattr(self, key),
                "must be 1 or more",
            )
        for key in ("dp_shard", "stages_per_rank", "micro_batch_size"):
            value = getattr(self, key)
            require(
                value is None or value >= 1,
                f"distribution.{key}",
                value,
                "must be 1 or more, or null",
            )
        least, most = self.pipeline_schedule.stages_per_rank
        if self.stages_per_rank is not None and self.pp > 1:
            require(
                least <= self.stages_per_rank and (most is None or self.stages_per_rank <= most),
                "distribution.stages_per_rank",
                self.stages_per_rank,
                f"schedule={self.schedule} runs "
                + (f"exactly {least}" if least == most else f"{least} or more")
                + " stage(s) per worker; allowed: "
                + (f"{least}" if least == most else f"{least} or more")
                + ", or null",
            )
        require(
            not self.sequence_parallel or self.tp > 1,
            "distribution.sequence_parallel",
            self.sequence_parallel,
            "splits the sequence over the tensor-parallel workers; allowed with tp=1: false",
        )

    @property
    def pipeline_schedule(self) -> Schedule:
        return Schedule(self.schedule)

    # -- the degrees --------------------------------------------------------------------------
    def shards(self, cell: DistbenchConfig) -> int:
        """dp_shard, resolved: null is what the other degrees leave of the world."""
        if self.dp_shard is not None:
            return self.dp_shard
        return max(cell.world_size // (self.dp_replicate * self.tp * self.pp), 1)

    def data_parallel(self, cell: DistbenchConfig) -> int:
        """Workers that train different samples with the same weights: replicas x shards."""
        return self.dp_replicate * self.shards(cell)

    def weight_shards(self, cell: DistbenchConfig) -> int:
        """One replica's workers: its shards, tensor-parallel workers and pipeline stages."""
        return self.shards(cell) * self.tp * self.pp

    def virtual_stages(self) -> int:
        """Stages each pipeline worker holds."""
        if self.pp == 1:
            return 1
        return (
            self.stages_per_rank
            if self.stages_per_rank is not None
            else self.pipeline_schedule.stages_per_rank[0]
        )

    def stage_count(self) -> int:
        return self.pp * self.virtual_stages()

    def micro_batch(self, cell: DistbenchConfig) -> int:
        """Samples of one micro-batch."""
        if self.micro_batch_size is not None:
            return self.micro_batch_size
        local = cell.batch_size
        return local // self.pp if self.pp > 1 and local % self.pp == 0 else local

    def micro_batches(self, cell: DistbenchConfig) -> int:
        """Micro-batches of a data-parallel position per optimizer step: a pipeline's in one
        schedule step, else the gradient accumulation steps."""
        return max(cell.batch_size // self.micro_batch(cell), 1)

    def accumulation_steps(self, cell: DistbenchConfig) -> int:
        """Forward-backward passes whose gradients accumulate before an optimizer step (a
        pipeline accumulates its micro-batches inside the schedule: 1)."""
        return 1 if self.pp > 1 else self.micro_batches(cell)

    # -- DistributionConfig -------------------------------------------------------------------
    def data_shards(self, cell: DistbenchConfig) -> int:
        return self.data_parallel(cell)

    def data_shard_of(self, cell: DistbenchConfig, rank: int) -> int:
        """Ranks are (pp, dp_replicate, dp_shard, tp), tp innermost: the workers that differ
        only in their tensor-parallel or pipeline position read the same samples."""
        return (rank // self.tp) % self.data_parallel(cell)

    def step_batch(self, cell: DistbenchConfig) -> int:
        return self.micro_batch(cell)

    def tensor_parallelism(self, cell: DistbenchConfig) -> int:
        return self.tp

    def parallelism(
        self, cell: DistbenchConfig, resolved: dict[str, Any]
    ) -> tuple[int | list[int], int]:
        return self.data_parallel(cell), self.pp

    def check_cell(self, cell: DistbenchConfig) -> None:
        from harness.distributions.pipeline_config import pipeline_layer_count

        layers = pipeline_layer_count(cell)  # every plan is built on the network's layer list
        world = cell.world_size
        product = self.dp_replicate * self.tp * self.pp
        if self.dp_shard is None:
            require(
                world % product == 0,
                "distribution.dp_replicate",
                self.dp_replicate,
                f"dp_replicate x tp x pp = {self.dp_replicate} x {self.tp} x {self.pp} must "
                f"divide the cell's {world} workers (hardware.nodes x hardware.workers_per_node)",
            )
        else:
            require(
                product * self.dp_shard == world,
                "distribution.dp_shard",
                self.dp_shard,
                f"dp_replicate x dp_shard x tp x pp = {self.dp_replicate} x {self.dp_shard} x "
                f"{self.tp} x {self.pp} = {product * self.dp_shard} must be the cell's {world} "
                f"workers; allowed: {world // product if world % product == 0 else 'none'} "
                f"(or null: the workers left)",
            )
        per_node = cell.hardware.workers_per_node
        require(
            self.tp_across_nodes
            or cell.hardware.nodes == 1
            or self.tp <= per_node
            and per_node % self.tp == 0,
            "distribution.tp",
            self.tp,
            f"tensor parallelism of {self.tp} workers spans nodes of {per_node} workers (every "
            f"layer would wait on the link); allowed: a divisor of {per_node}, or "
            f"distribution.tp_across_nodes=true",
        )
        if self.tp > 1:
            check_tensor_parallel(cell, self.tp, self.sequence_parallel)
        if self.pp > 1:
            self._check_pipeline(cell, layers)
        self._check_batches(cell)

    def batch_from_global(self, cell: DistbenchConfig, global_batch: int) -> int:
        positions = self.data_parallel(cell)
        require(
            global_batch % positions == 0,
            "run.global_batch",
            global_batch,
            f"must divide among the plan's {positions} data-parallel positions (dp_replicate "
            f"x dp_shard); allowed: a multiple of {positions}",
        )
        require(
            self.batch_size is None or self.batch_size == global_batch // positions,
            "distribution.batch_size",
            self.batch_size,
            f"run.global_batch={global_batch} makes each data-parallel position's batch "
            f"{global_batch // positions}; allowed: null, or {global_batch // positions}",
        )
        return global_batch // positions

    def _check_pipeline(self, cell: DistbenchConfig, layers: int) -> None:
        require(
            not (self.backend == "gloo" and cell.hardware.device.value == "cuda"),
            "distribution.backend",
            self.backend,
            "gloo cannot send CUDA tensors between pipeline stages; allowed with "
            "hardware.device=cuda: nccl, or null",
        )
        stages = self.stage_count()
        require(
            stages <= layers,
            "distribution.pp",
            self.pp,
            f"pp x stages_per_rank = {self.pp} x {self.virtual_stages()} = {stages} stages for "
            f"network={cell.network.label}, which has {layers} layers; allowed: at most "
            f"{layers} stages in all",
        )

    def _check_batches(self, cell: DistbenchConfig) -> None:
        local, micro = cell.batch_size, self.micro_batch(cell)
        require(
            local % micro == 0,
            "distribution.micro_batch_size",
            self.micro_batch_size,
            f"must divide each data-parallel position's batch of {local}; allowed: "
            f"{nearest_divisors(local, micro)}",
        )
        if self.pp > 1:
            count = local // micro
            least = self.pp if self.pipeline_schedule is not Schedule.dualpipev else 2 * self.pp
            require(
                count >= least and (count % self.pp == 0 or self.virtual_stages() == 1),
                "distribution.micro_batch_size",
                self.micro_batch_size,
                f"{count} micro-batch(es) of {micro} per step; schedule={self.schedule} "
                f"over {self.pp} stages needs at least {least}"
                + ("" if self.virtual_stages() == 1 else f", a multiple of {self.pp}")
                + f"; allowed: a batch of {local} in micro-batches of at most {local // least}",
            )
        cell.check_epoch_holds(
            self.data_parallel(cell),
            f"an epoch needs one full batch per data-parallel position (batch {local} x "
            f"{self.data_parallel(cell)} positions)",
        )

    def run_name_head(self, cell: DistbenchConfig) -> list[str]:
        return [plan_label(self, cell)]

    def run_name_parts(self, cell: DistbenchConfig) -> list[str]:
        return [f"g{cell.global_batch_size}"]

    def own_settings(self, cell: DistbenchConfig) -> dict[str, Any]:
        return {
            **super().own_settings(cell),
            "dp_shard": self.shards(cell),
            "stages_per_rank": self.virtual_stages(),
            "micro_batch_size": self.micro_batch(cell),
            "micro_batches": self.micro_batches(cell),
            "accumulation_steps": self.accumulation_steps(cell),
            "global_batch": cell.global_batch_size,
        }


def check_tensor_parallel(cell: DistbenchConfig, degree: int, sequence_parallel: bool) -> None:
    """The network's source gives a tensor-parallel plan, and the network's sizes divide by
    `degree`: asked of the source on the meta device (nothing allocated), ConfigError else."""
    from workloads.networks.ref import NetworkError

    source = cell.network.source_spec
    if source.tensor_parallel_plan is None:
        raise ConfigError(
            f"distribution.tp={degree} is invalid: network {cell.network.label} (network.source="
            f"{source.name}) gives no tensor-parallel plan; allowed: tp=1, or a network whose "
            f"source gives one (the hf presets: gpt2, llama, mistral, qwen2, bert; a module "
            f"with a tensor_parallel_plan method: docs/networks.md)"
        )
    from workloads.networks.tensor_parallel import checked_plan

    try:
        checked_plan(cell.network.ref, cell.dataset.spec, degree, sequence_parallel)
    except NetworkError as err:
        raise ConfigError(f"distribution.tp={degree} is invalid: {err}") from None


def mesh_settings(config: DistbenchConfig) -> MeshConfig:
    assert isinstance(config.distribution, MeshConfig), config.distribution
    return config.distribution


def plan_label(settings: MeshConfig, cell: DistbenchConfig) -> str:
    """The plan in a few characters, axes joined by ' x ' then the pipeline's schedule, the
    micro-batch, checkpointing and precision: e.g. "fsdp2 x tp2 x pp2 1f1b mb4 ac=sel2 bf16"."""
    shards, replicas = settings.shards(cell), settings.dp_replicate
    axes = []
    if replicas > 1 and shards > 1:
        axes.append(f"hsdp{replicas}x{shards}")
    elif shards > 1:
        axes.append(f"fsdp{shards}")
    elif replicas > 1:
        axes.append(f"dp{replicas}")
    if settings.tp > 1:
        axes.append(f"tp{settings.tp}" + ("sp" if settings.sequence_parallel else ""))
    if settings.pp > 1:
        axes.append(f"pp{settings.pp}")
    words = [" x ".join(axes) or "single"]
    if settings.pp > 1:
        virtual = settings.virtual_stages()
        schedule = settings.pipeline_schedule
        looped = virtual > 1 and not schedule.v_shaped
        words.append(schedule.value + (f" v{virtual}" if looped else ""))
    words.append(f"mb{settings.micro_batch(cell)}")
    words += settings.layer_name_parts()
    return " ".join(words)
