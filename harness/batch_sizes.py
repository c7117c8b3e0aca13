"""Default batch sizes per dataset (SPEC Table 3.3) for the models that train one batch per
worker (sequential, Horovod, DDP) or per minibatch (PipeDream). GPipe's whole batch and its
micro-batch count are its own (`harness.distributions.gpipe`)."""

from __future__ import annotations

# dataset -> per-worker batch of sequential, horovod, ddp and pipedream
# The token datasets are not in the thesis' table: 8 sequences a worker (1,024 tokens at the
# default seq_len of 128) keeps a small language model's step near a CNN's on this CPU.
_PER_WORKER_BATCH: dict[str, int] = {"mnist": 128, "cifar10": 64, "imagenet": 32, "highres": 32,
                                     "tokens": 8, "text": 8}


def default_batch_size(dataset: str) -> int:
    """The per-worker batch size of Table 3.3."""
    return _PER_WORKER_BATCH[dataset]
