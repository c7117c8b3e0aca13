"""Whether a network's weights can fit a worker's memory at all, asked before any cell starts.

A cell whose network's weights, gradients and optimizer state alone exceed the memory of a
worker can only end `oom`, after its workers have started, imported torch and tried to
allocate them (a GPT-2 with a billion-token vocabulary asks a CPU worker for terabytes). That
is bad input, and the config says enough to find it: the network's parameter count, which
checking it on the meta device gives anyway (`workloads.networks.check.NetworkSize`), and
what the memory model counts per weight (`harness.costs.memory`, the layer above, whose terms
these follow: the weight, its gradient, the optimizer's buffers). Only what clearly cannot fit
is refused, so the need is a lower bound:

- the weights, one gradient per trainable weight and the optimizer's buffers
  (`OptimizerConfig.state_buffers`) per trainable weight, nothing else: no activation, no
  communication buffer, no runtime, no copy of the starting weights (a cell refused here does
  not fit whatever its batch);
- divided among as many workers as the distribution model may split one copy of them over
  (`DistributionConfig.weight_shards`: 1 for a replica per worker, every worker of the cell for
  a model that does not say, the least any model can hold);
- in float32, or bfloat16 where the model keeps its parameters so (`weight_bytes`).

The memory a worker has is `hardware.device_memory_gb` where it is set (on a GPU its device,
on a CPU the budget `harness.worker.memory_limit` enforces). On CPU workers without one nothing
is enforced, and a worker may take its machine's memory: where every worker of the cell runs
on one machine (one node, nodes sharing a machine or emulated on it) that machine is taken to
be this one, and its memory (or its control group's limit, where less) and swap are shared by the
cell's workers. Elsewhere (a GPU of
unknown memory, CPU nodes of their own) nothing is ruled out.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from harness.config.units import BYTES_PER_GB

_MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class WorkerMemory:
    """The memory one worker of a cell has, and how a refusal names where it comes from."""

    bytes: float
    named: str


def device_memory(device_memory_gb: float) -> WorkerMemory:
    """`hardware.device_memory_gb`: each worker's own."""
    return WorkerMemory(
        device_memory_gb * BYTES_PER_GB, f"hardware.device_memory_gb={device_memory_gb:g}"
    )


def shared_machine_memory(workers: int) -> WorkerMemory | None:
    """A share of this machine's memory and swap for each of `workers` CPU workers that run on
    it with no limit of their own; None where this machine's memory cannot be read."""
    total = machine_memory_bytes()
    if total is None:
        return None
    each = (
        f", {gigabytes(total / workers)} for each of its {workers} workers" if workers > 1 else ""
    )
    limited = " (its control group's memory limit, with the swap)" if _cgroup_limits() else ""
    return WorkerMemory(
        total / workers,
        f"this machine's {gigabytes(total)} of memory and swap{limited}{each} "
        f"(hardware.device_memory_gb=null: a CPU worker has no limit but its machine's)",
    )


@functools.cache  # read once per process, as the machine's memory is
def _cgroup_limits() -> bool:
    """Whether this process's control group holds it to less memory than the machine has."""
    sizes, limit = _meminfo_bytes(), cgroup_memory_limit()
    return sizes is not None and limit is not None and limit < sizes[0]


@functools.cache
def machine_memory_bytes() -> int | None:
    """This machine's memory and swap (MemTotal + SwapTotal), the most its processes can
    hold together, or less where this process's control group is limited to less (a
    container's, a SLURM job's: /proc/meminfo shows the whole host there); None where neither
    /proc/meminfo nor sysconf says."""
    sizes = _meminfo_bytes()
    if sizes is None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return None
    memory, swap = sizes
    limit = cgroup_memory_limit()
    return memory + swap if limit is None else min(memory, limit) + swap


def _meminfo_bytes() -> tuple[int, int] | None:
    """MemTotal and SwapTotal of /proc/meminfo, in bytes; None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        sizes = {}
        for line in _MEMINFO.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "SwapTotal"):
                sizes[key] = int(rest.split()[0]) * 1024  # the kernel writes kB (KiB)
        if "MemTotal" in sizes:
            return sizes["MemTotal"], sizes.get("SwapTotal", 0)
    return None


# Where the kernel shows this process's control groups, and mounts their files.
_SELF_CGROUP = Path("/proc/self/cgroup")
_CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit value; anything this large is none.
_NO_LIMIT_FROM = 1 << 60


def cgroup_memory_limit(self_cgroup: Path = _SELF_CGROUP, root: Path = _CGROUP_ROOT) -> int | None:
    """The memory limit of this process's control group (the least of its own and its
    ancestors', as the kernel applies them), in bytes; None where there is none or it cannot
    be read. cgroup v2: `memory.max` along the unified hierarchy's path; v1: the memory
    controller's `memory.limit_in_bytes`. A container sees its own group as the mount's root,
    so the mount's root is read too where the path does not lie under it."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "" and (root / "cgroup.controllers").exists():  # v2, unified
            limits += _limits_along(root, path, "memory.max")
        elif "memory" in controllers.split(","):  # v1
            limits += _limits_along(root / "memory", path, "memory.limit_in_bytes")
    return min(limits) if limits else None


def _limits_along(mount: Path, path: str, name: str) -> list[int]:
    """The limits `name` sets in the group at `path` under `mount` and in each group above it
    (the mount's root last); "max" and v1's largest value are no limit."""
    limits = []
    group = mount / path.strip("/")
    for folder in [group, *group.parents]:
        if not folder.is_relative_to(mount):
            break
        with contextlib.suppress(OSError, ValueError):
            value = (folder / name).read_text().strip()
            if value != "max" and int(value) < _NO_LIMIT_FROM:
                limits.append(int(value))
    return limits


def least_state_bytes(
    parameters: int, trainable: int, *, state_buffers: int, value_bytes: int, shards: int
) -> float:
    """The fewest bytes a worker holds of a network's weights (all `parameters`), their
    gradients and the optimizer's `state_buffers` (one each per `trainable` weight), at
    `value_bytes` a value, with one copy split over `shards` workers at most."""
    values = parameters + trainable * (1 + state_buffers)
    return values * value_bytes / shards


def gigabytes(size_bytes: float) -> str:
    """A size as the refusal writes it: "24.6 GB", "3,072.0 GB"."""
    return f"{size_bytes / BYTES_PER_GB:,.1f} GB"


def parameter_count(parameters: int) -> str:
    """ "256.0 B", "124.4 M", "11,689"."""
    if parameters >= 1_000_000_000:
        return f"{parameters / 1e9:,.1f} B"
    if parameters >= 1_000_000:
        return f"{parameters / 1e6:.1f} M"
    return f"{parameters:,}"
