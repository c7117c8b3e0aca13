"""A worker process's memory besides the model, as a record: what `harness.worker.runtime_memory`
measures in a fresh process, what the facts file keeps per data set and device
(`harness.predict.facts.store.FactsStore.runtimes`), and what the memory model adds to every
worker (`CellFacts.runtime_mb`, `CellFacts.context_mb`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeShare:
    """A worker process's memory besides the model (`harness.worker.runtime_memory`), and the
    part of it a cell's recorded peak leaves out: on CUDA the context (the driver's, cuBLAS's
    and cuDNN's memory outside torch's allocator, which `max_memory_allocated` does not see);
    0 on a CPU, whose recorded peak is the process's resident set, and in a share kept before
    the context was kept apart."""

    mb: float
    context_mb: float = 0.0
