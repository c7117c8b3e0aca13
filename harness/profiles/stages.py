"""A pipeline's stages timed in place (`python -m harness.stage_timing`), as a record: each
stage's compute per micro-batch as the pipeline runs it, every stage a process of its own, with
the machine's speed then. The facts file keeps it (`predict.facts.store.FactsStore`) and a
pipeline's time equations read it instead of its layers' shares of one sequential step
(`CellFacts.stages_in_place`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class StageSeconds:
    """One stage's compute per micro-batch (forward; backward with any recomputation) and its
    update per batch, in seconds."""

    forward_s: float
    backward_s: float
    update_s: float


@dataclass(frozen=True)
class InPlaceStages:
    """A pipeline's stages timed in place, with the reference kernel its workers timed around
    them (`worker.steadiness.machine_speed_ms`: the machine's speed then; None: not timed)."""

    stages: tuple[StageSeconds, ...]
    reference_ms: float | None
    measured_at: str

    def at_speed(self, reference_ms: float | None) -> InPlaceStages:
        """The stages at the machine speed whose reference kernel took `reference_ms` (as
        measured where either is unknown)."""
        if not reference_ms or not self.reference_ms:
            return self
        ratio = reference_ms / self.reference_ms
        return replace(
            self,
            reference_ms=reference_ms,
            stages=tuple(
                StageSeconds(
                    stage.forward_s * ratio, stage.backward_s * ratio, stage.update_s * ratio
                )
                for stage in self.stages
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "stages": [asdict(stage) for stage in self.stages],
            "reference_ms": self.reference_ms,
            "measured_at": self.measured_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InPlaceStages:
        return cls(
            tuple(StageSeconds(**stage) for stage in data["stages"]),
            data.get("reference_ms"),
            str(data.get("measured_at", "")),
        )
