"""What every model that trains whole layers can be asked about them: activation checkpointing
and precision, the same settings for `sequential`, `ddp`, `fsdp` and `mesh`
(`LayerSettingsConfig`). How a worker applies them is `harness.distributions.layer_training`.

GPipe recomputes by its own setting (`distribution.recompute`: every micro-batch's stage,
all but the last, or none), which its tables and recommended commands show beside these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from harness.config.accepts import integer
from harness.config.schema import DistbenchConfig, DistributionConfig, require


class Checkpointing(str, Enum):
    """Which layer-list entries recompute their activations in the backward pass."""

    none = "none"  # keep every activation autograd saves
    full = "full"  # every entry recomputes its forward in the backward
    selective = "selective"  # every `checkpoint_every`-th entry does (torchtitan's per-layer AC)


class Precision(str, Enum):
    """What the weights and the compute are kept in."""

    fp32 = "fp32"  # float32 throughout
    # bfloat16 compute (FSDP2's gathered parameters, else autocast), float32 gradient
    # reduction, weights and optimizer state
    bf16_mixed = "bf16_mixed"
    bf16 = "bf16"  # bfloat16 parameters, gradients and optimizer state

    @property
    def short(self) -> str:
        """How a run's name shows it (nothing for float32)."""
        return {"fp32": "", "bf16_mixed": "bf16", "bf16": "bf16p"}[self.value]


@dataclass
class LayerSettingsConfig(DistributionConfig):
    """Activation checkpointing and precision, for a model's settings to inherit."""

    # Activation checkpointing of the network's layer-list entries: none | full | selective.
    activation_checkpointing: Checkpointing = Checkpointing.none
    # selective: every this-many-th entry recomputes (1 is full).
    checkpoint_every: int = field(default=2, metadata=integer(1, 1_000_000, "layers"))
    # fp32 | bf16_mixed (bfloat16 compute; float32 reduction, weights and optimizer state) |
    # bf16 (bfloat16 parameters, gradients and optimizer state).
    precision: Precision = Precision.fp32

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.checkpoint_every >= 1,
            "distribution.checkpoint_every",
            self.checkpoint_every,
            "must be 1 or more",
        )

    def check_cell(self, cell: DistbenchConfig) -> None:
        """Checkpointing recomputes entries of the network's layer list: a network without
        one is refused here (one line saying how to give it one)."""
        super().check_cell(cell)
        if self.activation_checkpointing is not Checkpointing.none:
            from harness.distributions.pipeline_config import pipeline_layer_count

            pipeline_layer_count(cell)

    @property
    def weight_bytes(self) -> int:
        """bfloat16 parameters, gradients and optimizer state with `precision=bf16`; float32
        weights otherwise (`bf16_mixed` computes in bfloat16 from float32 weights)."""
        return 2 if self.precision is Precision.bf16 else 4

    def checkpointed(self, count: int) -> list[int]:
        """The entries of a `count`-entry layer list that recompute."""
        if self.activation_checkpointing is Checkpointing.none:
            return []
        every = 1 if self.activation_checkpointing is Checkpointing.full else self.checkpoint_every
        return [index for index in range(count) if (index + 1) % every == 0]

    def layer_name_parts(self) -> list[str]:
        """What a run's name says of them: "ac=full", "ac=sel2"; "bf16", "bf16p"."""
        parts = []
        if self.activation_checkpointing is Checkpointing.full:
            parts.append("ac=full")
        elif self.activation_checkpointing is Checkpointing.selective:
            parts.append(f"ac=sel{self.checkpoint_every}")
        return parts + ([self.precision.short] if self.precision.short else [])
