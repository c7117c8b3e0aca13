"""How much of a step's communication its compute hides: a timeline of two resources.

A collective hides behind compute only while there is compute left to run beside it, it cannot
start before its data exists (a gradient bucket before the backward has produced it, a unit's
weights before the prefetch is issued), and one link carries one collective at a time. The
thesis' equations assume the opposite extreme where it suits them (every bucket but the last
hidden, whatever the bucket's size against the backward it overlaps), which makes a model with
many large collectives look free on a GPU (they ranked FSDP ahead of DDP on a 4-node
cluster by exactly DDP's last bucket, VGG's 411 MB classifier gathered in the shadow of a
forward well under a millisecond long).

`Timeline` lays a step out as tasks on two resources, `COMPUTE` and `LINK`, each running its
tasks in the order given, a task starting once its resource is free and the tasks it depends on
have ended (list scheduling, as a stream-ordered runtime runs them). Where the workers'
communication cannot run beside their compute (CPU workers on one machine, whose collectives
are copies on the cores that compute: `predict.terms.communication_overlaps`), the link *is*
the compute resource and everything takes its turn. A model describes its step as tasks; what
it exposes is the step's length less its compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

COMPUTE = "compute"
LINK = "link"


@dataclass
class Timeline:
    """Tasks on the compute and the link, in issue order per resource (module docstring)."""

    overlaps: bool = True  # False: the link's tasks run on the compute resource
    _free: dict[str, float] = field(default_factory=lambda: {COMPUTE: 0.0, LINK: 0.0})
    _compute_s: float = 0.0
    _end: float = 0.0
    # The link's tasks that take the compute's cores: (start, end, core seconds per second).
    _on_the_cores: list[tuple[float, float, float]] = field(default_factory=list)

    def run(
        self,
        resource: str,
        seconds: float,
        *,
        after: Sequence[float] = (),
        not_before: float = 0.0,
        cores_s: float = 0.0,
    ) -> tuple[float, float]:
        """Schedule `seconds` of work on `resource` once the tasks ending at `after` have ended
        (and not before `not_before`); its (start, end). A link task's `cores_s`: the seconds
        of the compute's cores it takes while it runs (a CPU worker's collective between nodes:
        socket writes, copies, additions), spread over it; a compute task running beside it
        lasts that much longer, and the time counts as exposed, not as compute."""
        where = resource if self.overlaps else COMPUTE
        start = max([self._free[where], not_before, *after])
        end = start + max(seconds, 0.0)
        if resource == COMPUTE:
            self._compute_s += max(seconds, 0.0)
            end += self._cores_taken(start, end)
        elif cores_s > 0 and self.overlaps and end > start:
            self._on_the_cores.append((start, end, cores_s / (end - start)))
        self._free[where] = end
        self._end = max(self._end, end)
        return start, end

    def _cores_taken(self, start: float, end: float) -> float:
        """Seconds the link's tasks running between `start` and `end` take from the compute
        (to first order: the compute's own stretch does not meet further tasks)."""
        return sum(
            rate * max(min(end, busy_end) - max(start, busy_start), 0.0)
            for busy_start, busy_end, rate in self._on_the_cores
        )

    @property
    def exposed_s(self) -> float:
        """The step's seconds beyond its compute: communication nothing hid."""
        return max(self._end - self._compute_s, 0.0)


def after_each_chunk(
    chunks: Sequence[float],
    collectives: Sequence[float],
    *,
    overlaps: bool,
    cores_s: Sequence[float] = (),
) -> float:
    """Exposed seconds when collective i can start once compute chunk i is done and the
    collectives queue on one link: data parallelism's gradient buckets (or fused buffers)
    after the backward's chunks that produce them. `cores_s[i]`: the seconds of the compute's
    cores collective i takes while it runs (`Timeline.run`; none where not given)."""
    timeline = Timeline(overlaps=overlaps)
    ready = 0.0
    for i, (chunk, collective) in enumerate(zip(chunks, collectives)):
        _, ready = timeline.run(COMPUTE, chunk, after=[ready])
        timeline.run(
            LINK, collective, after=[ready], cores_s=cores_s[i] if i < len(cores_s) else 0.0
        )
    return timeline.exposed_s


def prefetched(
    compute: Sequence[float], fetch: Sequence[float], *, overlaps: bool, ahead: int = 1
) -> tuple[Timeline, list[float]]:
    """Compute chunk i needs fetch i done first; fetch i is issued when chunk i - `ahead`
    starts (FSDP's prefetch of the next unit's weights), fetches queueing on one link. The
    timeline, and when each chunk ended."""
    timeline = Timeline(overlaps=overlaps)
    starts: list[float] = []
    ends: list[float] = []
    fetched: list[float] = []
    for i, (work, data) in enumerate(zip(compute, fetch)):
        issued = starts[i - ahead] if i >= ahead else 0.0
        fetched.append(timeline.run(LINK, data, not_before=issued)[1])
        start, end = timeline.run(COMPUTE, work, after=[fetched[i], *(ends[-1:])])
        starts.append(start)
        ends.append(end)
    return timeline, ends
