"""A sequential step time: as a probe timed it (`BatchTiming`), as measured earlier, and which
one predicts a batch size.

Its own module because both sources of measured steps use it: the facts file
(`harness.predict.facts`) and MLflow's sequential cells (`harness.predict.recorded`); and
because the worker that times a step (`harness.worker.step_time`) hands its timing to
prediction, which imports no worker, as this record.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchTiming:
    """Seconds of one training step (forward, backward, optimizer) at one batch size, as a
    probe on one worker timed it (`harness.worker.step_time.measure_batch_seconds`)."""

    batch_size: int
    median_s: float
    std_s: float
    batches: int
    seconds: tuple[float, ...] = ()  # every timed step, for the spread (facts keep IQRs)
    # The reference kernel's milliseconds around the probe (`harness.measure.steadiness`: the
    # machine's speed then); None where it was not timed.
    reference_ms: float | None = None
    # How much the machine's speed changed around the probe (the reference kernel after over
    # before, less 1) where it stayed beyond run.steadiness_threshold however often it was
    # timed again; None: steady. Kept with the step time, and said wherever it is used.
    unsteady_drift: float | None = None


@dataclass(frozen=True)
class StepTime:
    """The sequential step time used at `batch`, and where it comes from."""

    batch: int
    seconds: float  # the median over the probe's batches
    source: str  # "facts file PATH", "MLflow run(s) ID, ... at URI", "probed here (not kept)"
    measured_batch: int  # the batch it was measured at; not `batch`: scaled per sample
    device_name: str | None = None
    # The spread over the probe's batches: first and third quartile (None where unknown, as
    # for MLflow cells, whose epoch time is one number), when and over how many batches.
    low: float | None = None
    high: float | None = None
    probe_batches: int | None = None
    measured_at: str | None = None
    # How fast the machine was when it was measured: the reference kernel's milliseconds
    # (`harness.measure.steadiness`); None where not recorded (facts kept before it was).
    reference_ms: float | None = None
    # Whether that kernel was timed inside measured cells (a step time from sequential cells),
    # as every cell's is, rather than around a probe in the analysing process.
    reference_in_cells: bool = False
    # The batch whose step time this one contradicts though both were timed again
    # (`contradict`); said beside its source.
    contradicts: int | None = None

    @property
    def scaled(self) -> bool:
        return self.measured_batch != self.batch

    def describe(self) -> str:
        where = (
            self.source
            + ("" if self.contradicts is None else contradiction_note(self.batch, self.contradicts))
            + (f", measured {self.measured_at}" if self.measured_at else "")
            + (f" ({self.device_name})" if self.device_name else "")
            + (f", reference kernel {self.reference_ms:.3g} ms" if self.reference_ms else "")
        )
        star = "*" if self.scaled else ""
        spread = (
            f" (IQR {self.low:.4g}-{self.high:.4g}{star} over {self.probe_batches} batches)"
            if self.low is not None and self.high is not None
            else ""
        )
        if self.scaled:
            return (
                f"batch {self.batch}: {self.seconds:.4g} s*{spread}, scaled per sample "
                f"from batch {self.measured_batch} (none measured at {self.batch}), {where}"
            )
        return f"batch {self.batch}: {self.seconds:.4g} s{spread}, {where}"


@dataclass(frozen=True)
class MeasuredStep:
    """A step time measured earlier on the hardware's kind of device; `rank` orders sources,
    lowest first (0 the facts file, 1 MLflow cells of the same hardware, 2 other hardware)."""

    batch: int
    seconds: float
    source: str
    rank: int = 0
    device_name: str | None = None
    low: float | None = None  # quartiles over the probe's batches, where kept
    high: float | None = None
    probe_batches: int | None = None
    measured_at: str | None = None
    reference_ms: float | None = None  # the machine's speed when measured (see StepTime)
    reference_in_cells: bool = False
    probe_asked: int | None = None  # the most batches its probe would have timed, where kept
    contradicts: int | None = None  # see StepTime

    def at(self, batch: int) -> StepTime:
        """This measurement as the step time at `batch`, scaled per sample when another."""
        scale = batch / self.batch

        def scaled(value: float | None) -> float | None:
            return None if value is None else value * scale

        return StepTime(
            batch,
            self.seconds * scale,
            self.source,
            self.batch,
            self.device_name,
            scaled(self.low),
            scaled(self.high),
            self.probe_batches,
            self.measured_at,
            self.reference_ms,
            self.reference_in_cells,
            self.contradicts if scale == 1 else None,
        )


def choose_step_time(measured: Sequence[MeasuredStep], batch: int) -> StepTime | None:
    """The step time at `batch` from earlier measurements, None without any.

    A measurement at `batch` itself wins (the lowest rank: the facts file, whose probe is what
    an analysis' fitted parameters are relative to, before MLflow cells, whose epoch time also
    holds data loading). Otherwise the measured batch nearest by ratio (ties: lower rank, then
    the larger batch), scaled per sample (`seconds * batch / measured batch`) and flagged: a
    device busier at a larger batch makes that an underestimate for smaller batches (a GPU at
    GPipe's micro-batches), so measure the batch for a firm number.
    """
    if not measured:
        return None
    exact = [step for step in measured if step.batch == batch]
    if exact:
        return min(exact, key=lambda step: step.rank).at(batch)
    best = min(
        measured, key=lambda step: (abs(math.log2(step.batch / batch)), step.rank, -step.batch)
    )
    return best.at(batch)


def steps_from_other_machines(
    used: Iterable[tuple[str, StepTime]], machines: Collection[str]
) -> dict[str, list[str]]:
    """The step times in `used` (each with what it is of, "resnet18/mnist on cpu, batch 32")
    measured on a machine not in `machines`, the ones they are to be compared with, by machine
    (`harness.runtime.environment.machine_label`); none where `machines` is empty or a step time's
    machine is not recorded. A step time holds its machine's speed: this VM's hosts, all "AMD EPYC",
    ran 3-5x apart by instruction set
    (docs/benchmarks/2026-12-02-probe-length-slow-and-noisy-hosts.md, "A slower host, and the
    machine a cell ran on recorded (2026-12-02)")."""
    other: dict[str, list[str]] = {}
    for what, step in used:
        if machines and step.device_name and step.device_name not in machines:
            other.setdefault(step.device_name, []).append(what)
    return dict(sorted(other.items()))


def contradict(smaller: StepTime | MeasuredStep, larger: StepTime | MeasuredStep) -> bool:
    """Whether step times of one workload at two batches contradict each other: the larger
    batch's step took less time than the smaller's beyond both spreads (its third quartile
    below the other's first). A step does more work at a larger batch: such a pair means one
    of the two was timed while the machine was disturbed (a probe at batch 1 timed 6.2 ms
    beside batch 2's 1.6 ms, while a reference kernel took 73 ms instead of 17-27 ms), and
    whatever is predicted from them is wrong."""
    return smaller.batch < larger.batch and _highest(larger) < _lowest(smaller)


def _lowest(step: StepTime | MeasuredStep) -> float:
    return step.seconds if step.low is None else min(step.low, step.seconds)


def _highest(step: StepTime | MeasuredStep) -> float:
    return step.seconds if step.high is None else max(step.high, step.seconds)


def contradiction_note(batch: int, other: int) -> str:
    """What a step time at `batch` that contradicts the one at `other` (`contradict`) though
    both were timed again says beside its source, and what would settle it."""
    smaller, larger = sorted((batch, other))
    return (
        f" (contradicts batch {other}: the step at batch {larger} took less time than at "
        f"batch {smaller}, beyond their spread, though both were timed again: time them on a "
        f"quiet machine, --remeasure)"
    )
