"""Freed host memory kept in the process, so that a training step does not page-fault its
memory back in every time (what every timing process of distbench sets first).

glibc's malloc hands a large block back to the kernel when it is freed (`munmap`, or a trim of the
heap's top), and the next step's tensors of the same size fault their pages in again, each page
zeroed by the kernel. Which blocks go back depends on the heap's history (the mmap threshold adapts
to the blocks freed), so the same step pays a different number of faults in different processes.
Measured on this VM (docs/benchmarks/2026-11-30-freed-memory-kept.md, "Freed memory kept in the
workers (shipped); `calibrate_local` again (2026-11-30)"), MobileNetV2/MNIST at batch 32, one
thread: 11-34 thousand page faults a step and 477-534 ms a step alone, 515-584 ms for each of two
processes stepping at once; with the memory kept, 0 faults, 462 ms alone and 456-470 ms for each of
two. The faults were part of what the time models fitted as "contention" between a node's workers
(two at once read 0.96-1.13 of one alone by the default, 1.00 kept), and of DDP's time on
`local_2cpu` they could not explain.

Keeping freed memory is what PyTorch's CPU performance guide reaches with jemalloc or TCMalloc
("reusing memory as much as possible"); on a GPU the caching allocator does it for device
memory. Here it is two glibc settings, set with `mallopt` once a process starts timing: a fixed
mmap threshold (glibc's largest, 32 MiB: smaller blocks come from the heap and stay in it)
and a trim threshold no heap reaches. Blocks above 32 MiB are still mapped and unmapped each
time. The peak memory a cell records is a high-water mark either way.
"""

from __future__ import annotations

import ctypes

# mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2: 32 MiB on a 64-bit machine.
KEPT_MMAP_THRESHOLD_BYTES = 32 * 1024**2
# mallopt takes an int: the largest trim threshold it can set (2 GiB of free heap top).
KEPT_TRIM_THRESHOLD_BYTES = 2**31 - 1
UNCHANGED = "system allocator unchanged"

_applied: str | None = None  # this process's answer, once `keep_freed_memory` ran


def keep_freed_memory() -> str:
    """Keep freed host memory in this process from now on (once per process; later calls
    return the first's answer), and say how, for the run's record: the settings, or why they
    could not be made (not glibc: musl, macOS), in which case the process runs as it was."""
    global _applied
    if _applied is None:
        _applied = _set_mallopt()
    return _applied


def host_allocator() -> str:
    """How this process allocates host memory, for a run's record (`keep_freed_memory`'s
    answer; the system's default where it was not called)."""
    return _applied or UNCHANGED


def _set_mallopt() -> str:
    try:  # the C library this process runs on (its own symbols)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return f"{UNCHANGED} (no mallopt in this process's C library)"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    refused = [
        name
        for name, parameter, value in (
            ("mmap_threshold", _M_MMAP_THRESHOLD, KEPT_MMAP_THRESHOLD_BYTES),
            ("trim_threshold", _M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD_BYTES),
        )
        if mallopt(parameter, value) != 1
    ]
    if refused:
        return f"glibc malloc: freed memory kept, except {', '.join(refused)} (refused)"
    return (
        f"glibc malloc: freed memory kept (mmap_threshold "
        f"{KEPT_MMAP_THRESHOLD_BYTES // 1024**2} MiB, trim_threshold "
        f"{KEPT_TRIM_THRESHOLD_BYTES // 1024**2} MiB)"
    )
