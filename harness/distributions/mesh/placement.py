"""Where a plan puts things: a worker's coordinates on the mesh, the layer list cut into
stages, and which stages a pipeline worker holds. Pure: the trainer builds by it, the memory
model counts by it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.distributions.mesh.settings import MeshConfig

AXES = ("pp", "dp_replicate", "dp_shard", "tp")  # outermost first: tp within a node


@dataclass(frozen=True)
class Coordinates:
    """A worker's place on the mesh."""

    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int

    @classmethod
    def of(cls, rank: int, sizes: tuple[int, int, int, int]) -> Coordinates:
        position = []
        for size in reversed(sizes):
            position.append(rank % size)
            rank //= size
        return cls(*reversed(position))


def stage_layers(layers: int, stages: int) -> list[range]:
    """The layer list cut into `stages` contiguous slices, as even as can be (the first
    slices one layer more)."""
    share, extra = divmod(layers, stages)
    bounds, start = [], 0
    for stage in range(stages):
        end = start + share + (stage < extra)
        bounds.append(range(start, end))
        start = end
    return bounds


def stages_of(settings: MeshConfig, pp_rank: int) -> list[int]:
    """The stages pipeline worker `pp_rank` holds: one; `pp_rank + k x pp` in the looped
    schedules; `pp_rank` and `2 x pp - 1 - pp_rank` in the V schedules."""
    virtual = settings.virtual_stages()
    if settings.pp > 1 and settings.pipeline_schedule.v_shaped:
        return [pp_rank, 2 * settings.pp - 1 - pp_rank]
    return [pp_rank + k * settings.pp for k in range(virtual)]
