"""Default batch sizes per dataset (Table 3.3, docs/thesis.md) for the models that train one batch
per worker (sequential, Horovod, DDP) or per minibatch (PipeDream). GPipe's whole batch and its
micro-batch count are its own (`harness.distributions.gpipe`); the divisor arithmetic below is what
picks a micro-batch count that splits a given batch, and what refusals suggest."""

from __future__ import annotations

import math

# dataset -> per-worker batch of sequential, horovod, ddp and pipedream
# The token datasets are not in the thesis' table: 8 sequences a worker (1,024 tokens at the
# default seq_len of 128) keeps a small language model's step near a CNN's on this CPU.
_PER_WORKER_BATCH: dict[str, int] = {
    "mnist": 128,
    "cifar10": 64,
    "imagenet": 32,
    "highres": 32,
    "tokens": 8,
    "text": 8,
}


def default_batch_size(dataset: str) -> int:
    """The per-worker batch size of Table 3.3."""
    return _PER_WORKER_BATCH[dataset]


def divisors(number: int) -> list[int]:
    """Every divisor of `number` (1 or more), ascending: the micro-batch counts, shard degrees
    and the like that split it evenly."""
    small = [d for d in range(1, math.isqrt(number) + 1) if number % d == 0]
    return sorted(set(small + [number // d for d in small]))


def largest_divisor(number: int, at_most: int) -> int:
    """The largest divisor of `number` not above `at_most` (1 at least): GPipe's micro-batch
    count when none is set (Table 3.3's count, or the nearest below that splits the batch)."""
    return max(d for d in divisors(number) if d <= max(1, at_most))


def nearest_divisors(number: int, near: int, listed: int = 8) -> str:
    """What a refusal says would split `number` evenly: all its divisors when there are few,
    else the nearest below and above `near` (e.g. "divisors of 3072 nearest 20: 16, 24")."""
    found = divisors(number)
    if len(found) <= listed:
        return f"divisors of {number}: {', '.join(map(str, found))}"
    below = [d for d in found if d <= near][-1:]
    above = [d for d in found if d > near][:1]
    return f"divisors of {number} nearest {near}: {', '.join(map(str, below + above))}"
