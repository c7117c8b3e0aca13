"""`hardware.device_memory_gb` enforced on a CPU worker, by the kernel: RLIMIT_DATA.

On a GPU a cell that does not fit in the device's memory ends with CUDA's out-of-memory error
and is recorded `oom`. On a CPU there is no device to run out of: without a limit, a cell would
take the machine's memory (and swap, or the OOM killer's SIGKILL). So while a CPU worker
measures its cell (process group, network, warm-up, timed epochs, the gathering of the
figures), it runs under a soft RLIMIT_DATA derived from `hardware.device_memory_gb`; an
allocation beyond it fails, and the cell ends as on a GPU: torch's allocator raises
"DefaultCPUAllocator: can't allocate memory" (Python's allocator `MemoryError`),
`harness.worker.run.classify_failure` makes it `oom`, the peers' collectives break at once, and the
rest of the sweep goes on. Nothing is enforced on CUDA hardware (the device enforces itself)
or when `device_memory_gb` is null.

**Why RLIMIT_DATA.** It is enforced by the kernel on each process, needs no privilege (any
process may lower its own soft limit, and raise it again up to the hard limit), and works
where cgroups are read-only (containers, CI) and on SLURM nodes alike; every worker sets it on
itself, so the sequential baseline, a local multi-worker cell and a SLURM job are limited
alike. The kernel counts against it (Linux >= 4.7) the process's private writable mappings,
`VmData` in /proc/<pid>/status: the heap and every anonymous mapping (tensors, allocator
caches, Python objects), thread stacks, the writable data of the loaded libraries. It does not
count file-backed pages mapped read-only (library code, the memory-mapped synthetic dataset
cache) nor shared memory: on a GPU node those are host memory too, not device memory. It fails
the allocation (ENOMEM) instead of killing the process, which is what lets the worker record
itself. RLIMIT_AS would count every reservation of address space, which the CUDA build of
torch makes by the gigabyte without touching it; a cgroup's memory limit needs a writable
cgroup hierarchy and ends the process with the OOM killer's SIGKILL (no rank report).

**What the budget means.** The harness reports a CPU worker's peak memory as its peak resident
set (VmHWM, `harness.measure.metrics.PeakMemory`), which is not what `VmData` counts: a fresh
worker's RSS is mostly library code (file-backed), its VmData mostly memory reserved and never
touched (libraries' data, thread stacks). So the limit is set relative to where the worker stands
when its cell starts:

    RLIMIT_DATA = VmData_now + (device_memory_gb x 10^9 - VmRSS_now)

i.e. the worker's resident memory when the cell starts (the imported libraries, the
interpreter: like a CUDA context on a GPU) counts against the budget, and its private
memory may grow by the rest. Tensors are written as soon as they are allocated, so what the
cell allocates becomes resident: a cell whose peak RSS stays below the budget fits, one that
would go above it ends `oom`. A worker that already holds more than the budget ends `oom`
before it builds anything.

**Measured** (2-core VM, Linux 6.18, torch 2.14's CUDA build on the CPU, ResNet-18 on MNIST at
batch 32, one thread per worker; VmData sampled every 10 ms, MB = 10^6 bytes):

    cell (per worker)     start: VmData / RSS   unlimited: peak VmData / peak RSS   budget: oom / ok
    sequential, 1 worker  915 / 911 MB          1312 (+397) / 1315 (+404) MB        1.28 / 1.30 GB
    DDP, 2 workers        922 / 910 MB          1375 (+453) / 1338 (+428) MB        1.34 / 1.38 GB

(peak RSS under the limit when ok: 1282 MB and 1330 MB). So during a cell VmData grows as RSS
does, to within a few per cent (DDP's gloo and reducer threads add their 8 MB stacks, virtual
only); the budget at which a cell turns from ok to `oom` lies within -2 % .. +3 % of the cell's
unlimited peak RSS, and a cell that fits reports a `peak_memory_mb` below its budget. Of the
0.9 GB a fresh worker holds, 0.7 GB is library code (file-backed; a GPU's CUDA context would be
the counterpart). Tight limits make glibc hand memory back sooner: the same cell peaks some 30
MB lower under a near limit than without one. glibc's per-thread arenas need no
MALLOC_ARENA_MAX here: an arena's 64 MB reservation is PROT_NONE, only the part in use is
writable (and counted). A thread started under a limit that is nearly used up can fail ("can't
start new thread"; tqdm then runs without its monitor thread, harmlessly).
"""

from __future__ import annotations

import contextlib
import logging
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.config.schema import Device, HardwareConfig
from harness.config.units import BYTES_PER_GB

log = logging.getLogger(__name__)

_MB = 1_000_000


def process_memory() -> dict[str, int]:
    """This process's VmData, VmRSS and VmHWM in bytes (from /proc/self/status)."""
    wanted = {"VmData", "VmRSS", "VmHWM"}
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in wanted:
            values[key] = int(rest.split()[0]) * 1024  # the kernel writes kB (KiB)
    return values


def budget_bytes(hardware: HardwareConfig) -> int | None:
    """What one worker of `hardware` may hold, in bytes; None where nothing is enforced
    (CUDA hardware, whose device enforces its own memory, or `device_memory_gb` null)."""
    if hardware.device is not Device.cpu or hardware.device_memory_gb is None:
        return None
    return int(hardware.device_memory_gb * BYTES_PER_GB)


@dataclass(frozen=True)
class MemoryLimit:
    """The limit one worker runs its cell under."""

    device_memory_gb: float
    budget_bytes: int
    data_limit_bytes: int  # the soft RLIMIT_DATA set
    data_at_start_bytes: int  # VmData when it was set
    rss_at_start_bytes: int  # VmRSS when it was set

    def describe(self) -> str:
        return (
            f"hardware.device_memory_gb={self.device_memory_gb:g} "
            f"({self.budget_bytes / _MB:.0f} MB per worker; enforced as RLIMIT_DATA="
            f"{self.data_limit_bytes / _MB:.0f} MB = VmData "
            f"{self.data_at_start_bytes / _MB:.0f} MB + budget - RSS "
            f"{self.rss_at_start_bytes / _MB:.0f} MB at the cell's start)"
        )


def oom_error(error: BaseException, rank: int, limit: MemoryLimit | None) -> str:
    """The one-line record of a worker's out-of-memory error (the traceback goes to its log):
    which rank, under which limit, and the allocator's own first line."""
    message = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    what = type(error).__name__ + (f": {message}" if message else "")
    under = f" under {limit.describe()}" if limit is not None else ""
    return f"rank {rank} ran out of memory{under}: {what}"


class WorkerOverBudget(MemoryError):
    """The worker holds more than its budget before the cell has built anything."""


@contextlib.contextmanager
def device_memory_limit(hardware: HardwareConfig) -> Iterator[MemoryLimit | None]:
    """Enforce `hardware.device_memory_gb` on this process while the block runs (CPU only;
    yields None and enforces nothing otherwise). The soft limit is put back on every exit
    path, so the worker can record its cell, and a failed one, with memory to spare."""
    budget = budget_bytes(hardware)
    if budget is None:
        yield None
        return
    assert hardware.device_memory_gb is not None
    now = process_memory()
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = MemoryLimit(
        device_memory_gb=hardware.device_memory_gb,
        budget_bytes=budget,
        data_limit_bytes=now["VmData"] + budget - now["VmRSS"],
        data_at_start_bytes=now["VmData"],
        rss_at_start_bytes=now["VmRSS"],
    )
    if now["VmRSS"] >= budget:
        raise WorkerOverBudget(
            f"the worker holds {now['VmRSS'] / _MB:.0f} MB (RSS) before its cell starts, "
            f"more than hardware.device_memory_gb={hardware.device_memory_gb:g} allows"
        )
    if hard != resource.RLIM_INFINITY and hard < limit.data_limit_bytes:
        log.warning(
            "RLIMIT_DATA's hard limit (%d MB) is below the budget's limit (%d MB): the "
            "hard limit applies",
            hard / _MB,
            limit.data_limit_bytes / _MB,
        )
    resource.setrlimit(
        resource.RLIMIT_DATA,
        (
            limit.data_limit_bytes
            if hard == resource.RLIM_INFINITY
            else min(limit.data_limit_bytes, hard),
            hard,
        ),
    )
    log.info("memory limit: %s", limit.describe())
    if _rlimit_data_ignored():
        log.warning(
            "the kernel was booted with ignore_rlimit_data: hardware.device_memory_gb "
            "is not enforced on this machine"
        )
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def lift_memory_limit() -> None:
    """Lift the soft limit from any thread, e.g. the watchdog's, while the thread inside
    `device_memory_limit` is stuck and cannot leave its block: recording a cell needs memory."""
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


def _rlimit_data_ignored() -> bool:
    try:
        words = Path("/proc/cmdline").read_text().split()
    except OSError:
        return False
    return any(
        word == "ignore_rlimit_data"
        or (
            word.startswith("ignore_rlimit_data=") and word.partition("=")[2] not in ("0", "n", "N")
        )
        for word in words
    )
