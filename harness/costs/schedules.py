"""A pipeline schedule's time and memory, as the schedules' papers count them.

`p` stages (pipeline ranks), `m` micro-batches per step, `v` stages per rank (virtual
stages), `t` the time of one micro-batch's forward and backward through one rank's layers.
Names as `torch.distributed.pipelining`'s schedules (`distribution.schedule`):

- gpipe (Huang et al. 2019) and 1f1b (Narayanan et al. 2019, PipeDream-Flush): the step is
  `(m + p - 1) t`; the bubble `(p - 1) t`. GPipe keeps every micro-batch's activations
  (`m` in flight), 1F1B at most `p`.
- interleaved_1f1b (Narayanan et al. 2021) and looped_bfs (Lamy-Poirier 2023): each rank
  runs `v` chunks of `1/v` of its layers, so the bubble shrinks to `(p - 1) t / v`; the
  first rank warms up `2(p - 1) + (v - 1) p` chunks before its first backward (Megatron's
  count), so it keeps `(2(p - 1) + (v - 1) p + 1) / v` micro-batches' worth of its layers;
  looped BFS runs every micro-batch's forward first and keeps all `m`.
- interleaved_zb and zbv (Qi et al. 2024) split the backward into its input gradient and
  its weight gradient and fill the bubble with the latter: what is left is the forward's
  share, `(p - 1) t_f / v`; ZB-V keeps 1F1B's `p` in flight. dualpipev (DeepSeek-AI 2024)
  is priced as ZB-V (its overlap of two micro-batches' communication is not modelled) with
  `p + 1` in flight.
"""

from __future__ import annotations

SCHEDULES = (
    "gpipe",
    "1f1b",
    "interleaved_1f1b",
    "looped_bfs",
    "interleaved_zb",
    "zbv",
    "dualpipev",
)
ZERO_BUBBLE = frozenset({"interleaved_zb", "zbv", "dualpipev"})
# One stage per rank; two in a V (rank r holds stages r and 2p - 1 - r); any number looped.
ONE_STAGE = frozenset({"gpipe", "1f1b"})
V_SHAPED = frozenset({"zbv", "dualpipev"})
# At least this many micro-batches per pipeline stage (DualPipeV runs two at once).
MICRO_BATCHES_PER_STAGE = {"dualpipev": 2}
# What a step without a pipeline is priced as (one stage, no bubble).
NO_PIPELINE = "1f1b"


def bubble_seconds(
    schedule: str, stages: int, virtual: int, forward: float, backward: float
) -> float:
    """The idle time of the slowest rank in one step: `forward` and `backward` are one
    micro-batch's through all of a rank's layers."""
    if stages <= 1:
        return 0.0
    if schedule in ZERO_BUBBLE:
        return (stages - 1) * forward / virtual
    return (stages - 1) * (forward + backward) / virtual


def pipeline_seconds(
    schedule: str,
    stages: int,
    virtual: int,
    micro_batches: int,
    forward: float,
    backward: float,
) -> float:
    """One step of `micro_batches` through the pipeline: every micro-batch's work on the
    slowest rank, plus its bubble."""
    work = micro_batches * (forward + backward)
    return work + bubble_seconds(schedule, stages, virtual, forward, backward)


def in_flight(schedule: str, stages: int, virtual: int, micro_batches: int) -> float:
    """Micro-batches' worth of a rank's layers whose activations the first rank keeps at its
    peak (1 without a pipeline: accumulation frees each micro-batch's before the next)."""
    if stages <= 1:
        return 1.0
    if schedule in ("gpipe", "looped_bfs"):
        return float(micro_batches)
    if schedule in ("1f1b", "zbv"):
        return float(min(micro_batches, stages))
    if schedule == "dualpipev":
        return float(min(micro_batches, stages + 1))
    chunks = 2 * (stages - 1) + (virtual - 1) * stages + 1
    return min(chunks, micro_batches * virtual) / virtual
