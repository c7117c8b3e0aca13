"""Collectives over one axis of a device mesh, priced as rings on the link that axis sits on.

NCCL's ring algorithms move `(n-1)/n` of a buffer through each rank's link per all-gather or
reduce-scatter, twice that per all-reduce (Patarasuk and Yuan 2009; Eq. 5.1's ring, which
`harness.costs.allreduce` prices from measured links). Each step pays the link's latency.
"""

from __future__ import annotations

from dataclasses import dataclass

# Share of a link's data-sheet rate NCCL's bus bandwidth reaches on large messages (nccl-tests
# reach 75-85 % of NVLink and InfiniBand rates).
LINK_EFFICIENCY = 0.8


@dataclass(frozen=True)
class Link:
    """What one rank sends through to the others of its axis: bytes/s per direction, seconds
    per message."""

    bandwidth: float
    latency: float

    @property
    def effective(self) -> float:
        return self.bandwidth * LINK_EFFICIENCY


def all_gather_seconds(link: Link, full_bytes: float, ranks: int) -> float:
    """Every rank ends with the whole `full_bytes` buffer, holding 1/ranks of it before."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * full_bytes / link.effective + (ranks - 1) * link.latency


def reduce_scatter_seconds(link: Link, full_bytes: float, ranks: int) -> float:
    """Every rank ends with its 1/ranks of the sum of everyone's `full_bytes` buffer."""
    return all_gather_seconds(link, full_bytes, ranks)


def all_reduce_seconds(link: Link, full_bytes: float, ranks: int) -> float:
    """A reduce-scatter and an all-gather of `full_bytes`."""
    return 2 * all_gather_seconds(link, full_bytes, ranks)


def send_seconds(link: Link, message_bytes: float) -> float:
    """One point-to-point message (a pipeline stage's activations or their gradients)."""
    return message_bytes / link.effective + link.latency
