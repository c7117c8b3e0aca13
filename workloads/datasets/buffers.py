"""Reuse of the batch buffers that the synthetic loader fills (float32, torch's default dtype).

A float32 ImageNet batch of 64 is 38 MB. glibc serves allocations above 32 MB with a fresh mmap
and returns them to the kernel on free, so every batch would page-fault and zero 38 MB before the
conversion even starts; measured on a 2-core VM this made the 64-batch roughly ten times slower per
image than the 32-batch, whose 19 MB buffer glibc recycles. Recycling the buffers here removes that
cost without touching process-wide allocator settings.

A buffer is handed out again only when no tensor uses it any more: the tensor made by
`torch.from_numpy` keeps a reference to its numpy array until the tensor's storage (and with it
every view of it) is freed, so the array's reference count shows whether it is still in use.
"""

from __future__ import annotations

import sys

import numpy as np
import torch


class BufferPool:
    """Hands out tensors of a requested shape in torch's default dtype (float32 unless a process
    asks for another, as the trajectory tests ask for float64), recycling those the caller has
    dropped."""

    def __init__(self, capacity: int = 4) -> None:
        # A training loop holds the previous batch while the next one is built, and a prefetch may
        # hold one more, so a handful of buffers is enough; more are allocated (not kept) on demand.
        self._capacity = capacity
        self._buffers: list[np.ndarray] = []
        # Held exactly like each buffer, it calibrates the reference count of an unused buffer.
        self._probe = [np.empty(0, dtype=np.float32)]

    def empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        """An uninitialised tensor of `shape` in torch's default dtype, in a recycled buffer
        when one is free."""
        dtype = np.dtype(str(torch.get_default_dtype()).removeprefix("torch."))  # as numpy names it
        for index in range(len(self._buffers)):  # no local name for a buffer: see _unused
            if (
                self._buffers[index].shape == shape
                and self._buffers[index].dtype == dtype
                and self._unused(index)
            ):
                return torch.from_numpy(self._buffers[index])
        array = np.empty(shape, dtype=dtype)
        self._remember(array)
        return torch.from_numpy(array)

    def _unused(self, index: int) -> bool:
        """True if nothing but this pool references buffer `index` (a caller's local name for
        it is a reference too)."""
        return _reference_count(self._buffers, index) <= _reference_count(self._probe, 0)

    def _remember(self, array: np.ndarray) -> None:
        """Keep `array` for reuse, evicting an unused buffer if the pool is full."""
        if len(self._buffers) < self._capacity:
            self._buffers.append(array)
            return
        for index in range(len(self._buffers)):
            if self._unused(index):
                self._buffers[index] = array
                return

    def __getstate__(self) -> dict[str, object]:
        # Buffers are per process; a pickled copy (a DataLoader worker) starts empty.
        return {"_capacity": self._capacity, "_buffers": [], "_probe": self._probe}


def _reference_count(arrays: list[np.ndarray], index: int) -> int:
    """Reference count of `arrays[index]`, taken the same way for a buffer and for the probe."""
    return sys.getrefcount(arrays[index])
