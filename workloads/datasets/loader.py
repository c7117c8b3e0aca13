"""One epoch of batches for one data-parallel rank, reproducible from (seed, epoch).

Every rank computes the same permutation of the sample indices from (seed, epoch), takes every
world_size-th index starting at its rank (the split `DistributedSampler` uses) and drops what does
not fill a whole batch, so the shards are disjoint and all ranks run the same number of steps, which
collective communication requires. Unlike `DistributedSampler`, nothing is padded with repeated
samples: the samples per epoch are exactly `len(loader) * batch_size` on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate

Batch = tuple[torch.Tensor, torch.Tensor]


class EpochLoader:
    """Iterable over this rank's batches of one epoch: (float32 N×C×H×W images, int64 N labels).

    Datasets that fetch whole batches (`fetches_whole_batches`, the synthetic ones) are read with
    one `__getitems__` call per batch: in the training process when `num_workers == 0`, which
    avoids all DataLoader overhead, else in DataLoader workers. Other datasets (the real ones) are
    read per sample by a DataLoader and collated.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        seed: int,
        shuffle: bool = True,
        num_workers: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        _check_arguments(batch_size, seed, num_workers, rank, world_size)
        self.dataset = dataset
        self.num_workers = num_workers
        self._schedule = ShardSchedule(
            dataset_length(dataset),
            batch_size,
            seed=seed,
            shuffle=shuffle,
            rank=rank,
            world_size=world_size,
        )
        self._data_loader: DataLoader | None = None

    @property
    def batch_size(self) -> int:
        return self._schedule.batch_size

    @property
    def epoch(self) -> int:
        return self._schedule.epoch

    @property
    def seed(self) -> int:
        return self._schedule.seed

    def reseed(self, seed: int) -> None:
        """Derive the data order from `seed` from now on (a cell's next repeat).

        The schedule is read afresh at each iteration, so a DataLoader and its persistent
        workers follow; their per-worker random seeds still come from the first seed.
        """
        _check_arguments(
            self.batch_size, seed, self.num_workers, self._schedule.rank, self._schedule.world_size
        )
        self._schedule.seed = seed

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration uses (deterministic in (seed, epoch))."""
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        self._schedule.epoch = epoch

    def __len__(self) -> int:
        """Full batches of this rank per epoch (the same on every rank)."""
        return len(self._schedule)

    @property
    def samples_per_epoch(self) -> int:
        """Samples this rank reads per epoch."""
        return len(self) * self.batch_size

    def batch_indices(self) -> np.ndarray:
        """Dataset indices of this rank's batches this epoch, shape (len(self), batch_size)."""
        return self._schedule.batch_indices()

    def __iter__(self) -> Iterator[Batch]:
        if self.num_workers == 0 and _fetches_whole_batches(self.dataset):
            for indices in self.batch_indices():
                yield cast(Any, self.dataset).__getitems__(indices.tolist())
        else:
            yield from self._workers_loader()

    def _workers_loader(self) -> DataLoader:
        """A DataLoader over the schedule, created once so its workers persist across epochs."""
        if self._data_loader is None:
            batched = _fetches_whole_batches(self.dataset)
            self._data_loader = DataLoader(
                self.dataset,
                # The schedule, not the loader: a loader <-> DataLoader reference cycle would leave
                # the workers to the cyclic garbage collector, whose shutdown of them can stall.
                batch_sampler=self._schedule,
                num_workers=self.num_workers,
                collate_fn=_already_collated if batched else None,
                persistent_workers=self.num_workers > 0,
                # Seeds the workers' random augmentation reproducibly.
                generator=torch.Generator().manual_seed(self._schedule.seed),
            )
        return self._data_loader


class ShardSchedule(Sampler[list[int]]):
    """This rank's batches of dataset indices in the current epoch; a DataLoader batch sampler.

    Reading `epoch` each time it is iterated lets one DataLoader (and its worker processes) serve
    every epoch.
    """

    def __init__(
        self,
        dataset_size: int,
        batch_size: int,
        *,
        seed: int,
        shuffle: bool,
        rank: int,
        world_size: int,
    ) -> None:
        self.dataset_size = dataset_size
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0

    def __len__(self) -> int:
        return self.dataset_size // self.world_size // self.batch_size

    def batch_indices(self) -> np.ndarray:
        """Indices of shape (len(self), batch_size): every world_size-th of the epoch's order."""
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.dataset_size)
        else:
            order = np.arange(self.dataset_size)
        shard = order[self.rank :: self.world_size][: len(self) * self.batch_size]
        return shard.reshape(len(self), self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batch_indices().tolist())


def dataset_length(dataset: Dataset) -> int:
    """len() of a map-style dataset (torch's `Dataset` type does not declare `__len__`)."""
    return len(cast(Sized, dataset))


def fetch_batch(dataset: Dataset, indices: Sequence[int]) -> Batch:
    """The batch of `indices` in the training process: one `__getitems__` read where the
    dataset fetches whole batches (the synthetic ones), else per sample, collated."""
    if _fetches_whole_batches(dataset):
        return dataset.__getitems__(list(indices))  # type: ignore[attr-defined]
    return default_collate([dataset[int(i)] for i in indices])


def _fetches_whole_batches(dataset: Dataset) -> bool:
    return bool(getattr(dataset, "fetches_whole_batches", False))


def _already_collated(batch: Any) -> Any:
    """Collate function for datasets whose `__getitems__` already returns a batch."""
    return batch


def _check_arguments(
    batch_size: int, seed: int, num_workers: int, rank: int, world_size: int
) -> None:
    """Reject arguments that would silently produce wrong shards or orders."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be 0 or more, got {num_workers}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"need world_size >= 1 and 0 <= rank < world_size, got rank={rank}, "
            f"world_size={world_size}"
        )
