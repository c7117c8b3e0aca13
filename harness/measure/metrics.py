"""Measuring time and memory honestly: synchronised devices, per-phase clocks, robust summaries.

A GPU runs asynchronously from the Python thread, so a clock read without synchronising the
device measures how fast work was queued, not how fast it ran. Every timer here synchronises
the device before reading the clock (a no-op on the CPU).
"""

from __future__ import annotations

import contextlib
import math
import resource
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from harness.config.units import BYTES_PER_MB
from harness.measure.spread import student_t_975

# `comm_wait`: time a data-parallel worker is blocked on gradient communication after its own
# compute is done (the part of the allreduces that did not overlap the backward pass).
PHASES = ("data", "forward", "backward", "comm_wait", "optimizer")


def synchronize(device: torch.device) -> None:
    """Wait until every kernel queued on `device` has finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# The one way distbench times work (the training loop, the sequential probe, the layer
# profiler, the hardware probe): wall-clock marks taken once the device is idle. A GPU runs
# what the host queues asynchronously, so an unsynchronised clock would time the queueing.
def device_time(device: torch.device) -> float:
    """`time.perf_counter()` once every kernel queued on `device` has finished."""
    synchronize(device)
    return time.perf_counter()


def median_seconds(
    operation: Callable[[], object], device: torch.device, *, warmup: int, repeats: int
) -> float:
    """Median seconds of `operation()` over `repeats` calls, after `warmup` untimed ones."""
    seconds = []
    for call in range(warmup + repeats):
        start = device_time(device)
        operation()
        if call >= warmup:
            seconds.append(device_time(device) - start)
    return statistics.median(seconds)


class PhaseClock:
    """Accumulates wall-clock seconds per training phase (data, forward, backward, optimizer).

    `enabled=False` turns every phase into a no-op, so the only clock left is the epoch clock.
    """

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.device = device
        self.enabled = enabled
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        yield
        synchronize(self.device)
        self.seconds[name] += time.perf_counter() - start

    def transfer(self, source: str, target: str, seconds: float) -> None:
        """Re-attribute `seconds` already charged to phase `source` to phase `target` (for a
        wait measured inside another phase, e.g. DDP's allreduce wait inside backward)."""
        if not self.enabled:
            return
        seconds = min(max(seconds, 0.0), self.seconds[source])
        self.seconds[source] -= seconds
        self.seconds[target] += seconds

    def reset(self) -> dict[str, float]:
        """Return the accumulated seconds per phase and start from zero."""
        totals = {name: self.seconds.get(name, 0.0) for name in PHASES if self.enabled}
        self.seconds = defaultdict(float)
        return totals


@dataclass(frozen=True)
class Summary:
    """Location and spread of repeated measurements."""

    mean: float
    median: float
    std: float  # sample standard deviation; 0 for a single value
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            raise ValueError("cannot summarise an empty sequence of measurements")
        return cls(
            mean=statistics.fmean(values),
            median=statistics.median(values),
            std=statistics.stdev(values) if len(values) > 1 else 0.0,
            min=min(values),
            max=max(values),
            n=len(values),
        )


@dataclass(frozen=True)
class RepeatStatistics:
    """A cell's repeats (independent measurements of seconds per epoch): their mean, spread,
    Student-t 95 % confidence interval of the mean and MLPerf's trimmed mean."""

    mean: float
    std: float  # sample standard deviation over the repeats; 0 for one repeat
    ci95_low: float | None  # None for one repeat: one value gives no interval
    ci95_high: float | None
    # With 5 or more repeats, the mean without the fastest and the slowest (MLPerf's rule for
    # scoring a benchmark from several runs); None below that.
    trimmed_mean: float | None
    n: int

    TRIM_FROM: ClassVar[int] = 5  # repeats needed before the extremes are dropped

    @classmethod
    def of(cls, values: Sequence[float]) -> RepeatStatistics:
        if not values:
            raise ValueError("cannot summarise an empty sequence of repeats")
        n, mean = len(values), statistics.fmean(values)
        std = statistics.stdev(values) if n > 1 else 0.0
        low = high = trimmed = None
        if n > 1:
            half_width = student_t_975(n - 1) * std / math.sqrt(n)
            low, high = mean - half_width, mean + half_width
        if n >= cls.TRIM_FROM:
            trimmed = statistics.fmean(sorted(values)[1:-1])
        return cls(mean=mean, std=std, ci95_low=low, ci95_high=high, trimmed_mean=trimmed, n=n)


class PeakMemory:
    """Peak memory of this worker since `reset()`: the device's peak where there is a device,
    else the process's peak resident set size (RSS); work run `left_out()` is no part of it.

    Linux lets a process reset its own RSS high-water mark (writing 5 to /proc/self/clear_refs),
    so the CPU peak covers the measured work, not whatever ran earlier in the process. Where that
    is not allowed, the peak since process start is reported and `kind` says so.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kind = "cuda_max_allocated" if device.type == "cuda" else "process_peak_rss"
        self._before_left_out = 0.0  # the peak measured before the last `left_out()` block

    def reset(self) -> None:
        self._before_left_out = 0.0
        self._reset_high_water_mark()

    @contextlib.contextmanager
    def left_out(self) -> Iterator[None]:
        """What runs inside is no part of the peak: the peak so far is kept, the block's own
        is forgotten. For the steadiness check's reference kernel, which on CUDA holds three
        4096 x 4096 float32 matrices (192 MB, measured on an H200): more than a small cell's
        whole training step, so it was the peak such a cell recorded."""
        self._before_left_out = self.peak_mb()
        try:
            yield
        finally:
            self._reset_high_water_mark()

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            now = torch.cuda.max_memory_allocated(self.device) / BYTES_PER_MB
        else:
            now = _process_peak_rss_bytes() / BYTES_PER_MB
        return max(now, self._before_left_out)

    def _reset_high_water_mark(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.kind = "process_peak_rss_since_start"


def _process_peak_rss_bytes() -> int:
    """VmHWM from /proc/self/status (resettable), else getrusage's ru_maxrss (KiB on Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
