"""How many times a measurement runs what it times: warm-up runs, then timed ones, fewer of
each once they say enough (`ProbeLength`). The sequential probe (`harness.worker.step_time`)
times training steps by it, the layer profile (`harness.measure.profiler`) each layer's forward and
backward; `--probe-spread` of `harness.recommend` and `harness.analysis` sets how steady is
steady enough."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# How long a measurement warms up and times (measured here, docs/benchmarks/2026-11-29-dry-run.md,
# "The dry run on every core, a probe that stops once steady (2026-11-29)": on a fresh process the
# first step of ResNet-50, VGG-11, ResNet-18 and MobileNetV2 took 10-60 % longer than the later
# ones, the second was within their spread): warming up stops after the first step once the warm-up
# has taken WARMUP_SECONDS; timing stops after STEADY_BATCHES once their quartiles lie within
# `spread` of their median. A 5-second step is then timed 4 times, not 9.
WARMUP_SECONDS = 1.0
STEADY_BATCHES = 3
STEADY_SPREAD = 0.02


@dataclass(frozen=True)
class ProbeLength:
    """How many runs a measurement makes: at most `warmup_batches` untimed (fewer once they
    took WARMUP_SECONDS, at least one), then at most `probe_batches` timed (fewer, at least
    STEADY_BATCHES, once their interquartile range is within `spread` of their median; 0:
    always `probe_batches`)."""

    warmup_batches: int
    probe_batches: int
    spread: float = 0.0

    def warmup_count(self, seconds: Sequence[float]) -> int | None:
        """How many of the first `seconds` are warm-up; None while still warming up."""
        if self.warmup_batches == 0:
            return 0
        elapsed = 0.0
        for count, step in enumerate(seconds[: self.warmup_batches], start=1):
            elapsed += step
            if count == self.warmup_batches or elapsed >= WARMUP_SECONDS:
                return count
        return None

    def timed(self, seconds: Sequence[float]) -> list[float]:
        warmup = self.warmup_count(seconds)
        return [] if warmup is None else list(seconds[warmup:])

    def enough(self, seconds: Sequence[float]) -> bool:
        """Whether the steps timed so far (`seconds`, warm-up included) are enough."""
        timed = self.timed(seconds)
        if len(timed) >= self.probe_batches:
            return True
        if self.spread <= 0 or len(timed) < STEADY_BATCHES:
            return False
        first, _, third = statistics.quantiles(timed, n=4, method="inclusive")
        return third - first <= self.spread * statistics.median(timed)
