"""Default batch sizes per dataset and distribution model (SPEC Table 3.3).

Data-parallel models (Horovod, DDP) and PipeDream use the per-worker batch of the sequential
baseline; GPipe trains a whole batch split into micro-batches, so it has a batch size and a
micro-batch count of its own.
"""

from __future__ import annotations

from typing import NamedTuple


class GPipeBatch(NamedTuple):
    batch_size: int
    micro_batches: int


# dataset -> per-worker batch of sequential, horovod, ddp and pipedream
_PER_WORKER_BATCH: dict[str, int] = {"mnist": 128, "cifar10": 64, "imagenet": 32, "highres": 32}

# dataset -> GPipe whole batch and its number of micro-batches
_GPIPE_BATCH: dict[str, GPipeBatch] = {
    "mnist": GPipeBatch(3072, 24),
    "cifar10": GPipeBatch(2048, 32),
    "imagenet": GPipeBatch(384, 12),
    "highres": GPipeBatch(48, 12),
}


def default_batch_size(dataset: str, distribution: str) -> int:
    """Batch size from Table 3.3 (per worker, or the whole pipeline batch for GPipe)."""
    if distribution == "gpipe":
        return _GPIPE_BATCH[dataset].batch_size
    return _PER_WORKER_BATCH[dataset]


def default_micro_batches(dataset: str) -> int:
    """GPipe's number of micro-batches from Table 3.3."""
    return _GPIPE_BATCH[dataset].micro_batches
