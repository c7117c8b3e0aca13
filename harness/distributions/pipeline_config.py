"""The settings the pipeline models share (GPipe's and PipeDream's inherit them): the stages'
balance, and the checks that refuse a plan that cannot be built before any worker starts.
Their training plumbing is `harness.distributions.pipeline`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.config.accepts import integer
from harness.config.schema import ConfigError, DistbenchConfig, DistributionConfig, require
from workloads.networks.ref import NetworkError


@dataclass
class PipelineConfig(DistributionConfig):
    """What the pipeline models share: they split the network's layer list into stages."""

    # Layers of the network's layer list per stage, e.g. [10, 12]; null = balance the
    # profiled time per layer (forward, backward, updates; `python -m harness.plan`).
    balance: list[int] | None = field(default=None, metadata=integer(0, 1_000_000, "layers"))

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.balance is None or (len(self.balance) > 0 and all(n >= 1 for n in self.balance)),
            "distribution.balance",
            self.balance,
            "a list of layer counts per stage, each 1 or more, or null (profile-balanced)",
        )

    def data_shards(self, cell: DistbenchConfig) -> int:
        """One: every batch enters the pipeline whole, at its first stage (PipeDream divides
        it among a stage's replicas itself)."""
        return 1

    def check_stages(
        self, cell: DistbenchConfig, stage_count: int | None, stage_key: str, stage_value: Any
    ) -> None:
        """Every stage needs one layer or more, a given balance has one count per stage and
        covers the layer list, and an epoch holds a whole pipeline batch: a plan that cannot
        be built fails here rather than in a started cell's workers. `stage_key` and
        `stage_value` name what set the stage count (None: planned later). The stages' sends
        need a backend that carries the device's tensors: gloo sends from host memory only
        (on an H100 its send of a CUDA tensor failed, "writev: Bad address")."""
        require(
            not (self.backend == "gloo" and cell.hardware.device.value == "cuda"),
            "distribution.backend",
            self.backend,
            "gloo cannot send CUDA tensors between pipeline stages; allowed with "
            "hardware.device=cuda: nccl, or null (one GPU per worker)",
        )
        network, dataset = cell.network.label, cell.dataset.key
        layers = pipeline_layer_count(cell)
        if stage_count is not None:
            require(
                stage_count <= layers,
                stage_key,
                stage_value,
                f"{stage_count} pipeline stages for network={network}, which has {layers} "
                f"layers; allowed: at most {layers} stages",
            )
            if self.balance is not None:
                require(
                    len(self.balance) == stage_count,
                    "distribution.balance",
                    self.balance,
                    f"needs one layer count per stage ({stage_count}); "
                    f"allowed: e.g. {even_balance(layers, stage_count)}, or "
                    f"null (balanced on the profile)",
                )
        if self.balance is not None:
            require(
                sum(self.balance) == layers,
                "distribution.balance",
                self.balance,
                f"the layer counts must sum to the {layers} layers of network={network} "
                f"(dataset={dataset}); allowed: e.g. "
                f"{even_balance(layers, len(self.balance))}, or null (balanced on the "
                f"profile)",
            )
        # Every batch enters the pipeline whole; PipeDream's batch division may drop some, but
        # an epoch needs at least one.
        cell.check_epoch_holds(
            1,
            f"an epoch needs at least one full pipeline batch (batch size {cell.batch_size})",
            self.batch_multiple(cell),
        )

    def batch_multiple(self, cell: DistbenchConfig) -> int:
        """What every pipeline batch size must be a multiple of (GPipe: its micro-batches
        when set); what a refused size's suggestion rounds to."""
        return 1

    def parallelism(
        self, cell: DistbenchConfig, resolved: dict[str, Any]
    ) -> tuple[int | list[int], int]:
        stages = len(resolved.get("balance") or []) or cell.world_size
        return 1, stages


def even_balance(layers: int, stages: int) -> str:
    """`layers` split as evenly as can be over `stages` (the first stages one more), in the
    override's form: what a refused balance suggests, e.g. "[8,7]"."""
    share, extra = divmod(layers, stages)
    return f"[{','.join(str(share + (stage < extra)) for stage in range(stages))}]"


def pipeline_layer_count(cell: DistbenchConfig) -> int:
    """Length of the cell's layer list (built on the meta device); a network without one is
    refused here, at validation, with what to set.

    Counted once per version of the network's code (`workloads.networks.layer_counts`), so
    that the launcher checking a sweep's pipeline cells loads no torch: a worker of a cell
    keeps the count it checked (it has torch loaded, and its cell passed its launcher's
    checks); a command checking its input keeps nothing, since bad input writes nothing."""
    from harness.system.worker_env import worker_environment
    from workloads.networks.layer_counts import remembered_layer_count

    try:
        return remembered_layer_count(
            cell.network.ref,
            cell.dataset.spec,
            cell.dataset.cache_dir,
            keep=worker_environment().is_distributed,
        )
    except NetworkError as err:
        raise ConfigError(
            f"distribution={cell.distribution.name} is invalid for this network: {err}"
        ) from None
