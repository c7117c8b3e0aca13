"""Whether the machine held still while a cell was measured.

A cell's seconds per epoch mean something only if nothing else changed the machine's speed while
it ran: another job on the cores, a host that throttles or steals time from this VM. Two
witnesses, both recorded with every cell:

- a fixed reference kernel (the same matrix products, on one thread of the cell's device),
  timed by all the cell's workers together (after a barrier) before their trainers are built
  and after the trainers finished (`Trainer.finish`), so that nothing the cell runs beside its
  training (Horovod's background thread) is timed with it: a machine that slowed down or sped
  up during the cell shows as a drift between the two. One thread,
  because the kernel must measure the machine, not OpenMP: on this 2-core VM the same products
  on two threads took 42-184 ms from one trial to the next on an idle machine, on one thread
  17.1-17.2 ms;
- a memory-bound reference kernel (streaming additions over arrays far larger than the caches),
  timed with it: the matrix products run from the caches and do not see a host whose memory
  bandwidth others take. Over four quiet minutes here
  (docs/benchmarks/2026-11-30-one-cell-counts-once.md, "One cell counts once; the recommender judged
  with its ties; a memory-bound witness (2026-11-30)") the products held within 26.3-27.1 ms while
  the streaming kernel went from 28 to 39 ms in episodes of a few seconds, and a MobileNetV2 step
  (memory-bound: depthwise convolutions) from 425 to 573 ms with it (correlation 0.72 with the
  streaming kernel, 0.48 with the products; ResNet-18's steps moved 2 %). The workers time it one at
  a time (`harness.worker.run.machine_speed`): two streams at once share the bandwidth. It is
  recorded, not judged: a snapshot of a fraction of a second, before and after, moved by up to 18 %
  around cells whose own epochs held within 4 % (the episodes last seconds, a cell minutes), so that
  a threshold of 10 % on it flagged 4 of a calibration's first 9 cells (the same report); a
  disturbance that lasts is in the epochs' spread;
- the spread of the cell's own epochs (their coefficient of variation within each repeat): a
  disturbance that came and went between the two timings shows there.

A cell whose drift or epoch spread exceeds `run.steadiness_threshold` is recorded ok but
*unsteady* (metric `steady` = 0, with the reason): the sweep's table marks it, MLflow tags it,
the analysis can leave it out of a fit, and a re-run with `hydra.launcher.remeasure_unsteady=
true` measures it again. pyperf warns about unstable benchmarks the same way; here the noise is
also set against the predictions (`harness.analysis` reports the noise floor beside every
error).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# The reference kernel, per device type: (matrix size, products). On a CPU 24 products of two
# 384 x 384 float32 matrices, about 17 ms on one core of this VM (AVX-512). On a GPU the same
# work is half a millisecond of launches and clock ramps (measured on an H200: 0.4-0.8 ms,
# "drifting" by -37 % to +82 % over quiet cells), so it gets 8 products of 4096 x 4096 matrices,
# tens of milliseconds. Each is timed REFERENCE_TRIALS times after one untimed trial, the median
# kept (one trial caught by a timer tick or a page fault does not move it).
_KERNEL = {"cpu": (384, 24), "cuda": (4096, 8)}
REFERENCE_TRIALS = 5


def reference_seconds(device: object = "cpu") -> float:
    """Median seconds of the reference kernel on `device`, on one CPU thread (restored after)."""
    import torch

    size, products = _KERNEL.get(torch.device(device).type, _KERNEL["cpu"])  # type: ignore[call-overload]
    left = torch.ones(size, size, device=device)  # type: ignore[call-overload]
    right = torch.full((size, size), 0.5, device=device)  # type: ignore[call-overload]
    return _median_trial_seconds(device, lambda: torch.mm(left, right), products)


# The memory-bound kernel, per device type: (elements of each of its three float32 arrays,
# additions per trial). On a CPU three 64 MB arrays (past any cache of this VM's), four
# additions: about 29 ms here. On a GPU 256 MB arrays and 32 additions, a few milliseconds at
# an H200's bandwidth (not yet measured on one).
_MEMORY_KERNEL = {"cpu": (16 * 2**20, 4), "cuda": (64 * 2**20, 32)}


def memory_reference_seconds(device: object = "cpu") -> float:
    """Median seconds of the memory-bound reference kernel on `device` (one CPU thread,
    restored after): `out = a + b` over arrays far larger than the caches (the untimed first
    trial also faults them in)."""
    import torch

    elements, additions = _MEMORY_KERNEL.get(torch.device(device).type, _MEMORY_KERNEL["cpu"])  # type: ignore[call-overload]
    left = torch.ones(elements, device=device)  # type: ignore[call-overload]
    right = torch.full((elements,), 0.5, device=device)  # type: ignore[call-overload]
    out = torch.empty(elements, device=device)  # type: ignore[call-overload]
    return _median_trial_seconds(device, lambda: torch.add(left, right, out=out), additions)


def _median_trial_seconds(device: object, operation: Callable[[], object], repeats: int) -> float:
    """Median seconds of `repeats` runs of `operation`, over REFERENCE_TRIALS trials after one
    untimed trial (which warms the allocator and caches), on one CPU thread (restored after)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trials = []
        for trial in range(REFERENCE_TRIALS + 1):
            _synchronize(device)
            started = time.perf_counter()
            for _ in range(repeats):
                operation()
            _synchronize(device)
            if trial:
                trials.append(time.perf_counter() - started)
        return statistics.median(trials)
    finally:
        torch.set_num_threads(threads)


def _synchronize(device: object) -> None:
    import torch

    if torch.device(device).type == "cuda":  # type: ignore[call-overload]
        torch.cuda.synchronize(device)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Steadiness:
    """How steady the machine was during one cell."""

    # Per worker: the reference kernel's seconds before the first timed epoch and after the last.
    reference_before: Sequence[float]
    reference_after: Sequence[float]
    # The epochs' seconds of each repeat (the cell's, i.e. its slowest worker's).
    repeat_epochs: Sequence[Sequence[float]]
    threshold: float
    # Per worker: the memory-bound kernel's seconds before and after (empty: not timed; 0: not
    # timed by that worker, whose memory limit left no room for its arrays).
    memory_before: Sequence[float] = ()
    memory_after: Sequence[float] = ()

    @property
    def drift(self) -> float:
        """The largest relative change of the reference kernel over the cell, on any worker
        (+0.25: 25 % slower after the cell than before)."""
        return _largest_change(self.reference_before, self.reference_after)

    @property
    def memory_drift(self) -> float:
        """The same of the memory-bound kernel (0 where it was not timed): recorded, not judged
        (the module's docstring)."""
        return _largest_change(self.memory_before, self.memory_after)

    @property
    def epoch_cv(self) -> float | None:
        """The largest coefficient of variation of the epochs within a repeat; None when no
        repeat has two epochs."""
        spreads = [
            statistics.stdev(epochs) / statistics.fmean(epochs)
            for epochs in self.repeat_epochs
            if len(epochs) >= 2 and min(epochs) > 0
        ]
        return max(spreads, default=None)

    @property
    def reasons(self) -> list[str]:
        """Why the cell counts as unsteady (empty: steady)."""
        reasons = []
        if abs(self.drift) > self.threshold:
            direction = "slower" if self.drift > 0 else "faster"
            reasons.append(
                f"the reference kernel ran {abs(self.drift):.0%} {direction} after "
                f"the cell than before it"
            )
        cv = self.epoch_cv
        if cv is not None and cv > self.threshold:
            reasons.append(f"its epochs varied by {cv:.0%} (coefficient of variation)")
        return reasons

    @property
    def steady(self) -> bool:
        return not self.reasons

    def _memory_timed(self) -> bool:
        """Whether every worker timed the memory-bound kernel before and after the cell."""
        timed = [*self.memory_before, *self.memory_after]
        return bool(self.memory_before and self.memory_after) and min(timed) > 0

    def metrics(self) -> dict[str, float]:
        measured = {
            "steady": float(self.steady),
            "reference_kernel_ms_before": 1e3 * max(self.reference_before, default=0.0),
            "reference_kernel_ms_after": 1e3 * max(self.reference_after, default=0.0),
            "reference_kernel_drift": self.drift,
        }
        if self._memory_timed():
            measured.update(
                {
                    "memory_kernel_ms_before": 1e3 * max(self.memory_before),
                    "memory_kernel_ms_after": 1e3 * max(self.memory_after),
                    "memory_kernel_drift": self.memory_drift,
                }
            )
        if self.epoch_cv is not None:
            measured["epoch_cv"] = self.epoch_cv
        return measured

    def text(self) -> str:
        """One line for the record: 'steady (...)' or 'unsteady: why; why'."""
        cv = self.epoch_cv
        figures = (
            f"reference kernel {self.drift:+.1%} over the cell"
            + (
                f", memory-bound kernel {self.memory_drift:+.1%} (not judged)"
                if self._memory_timed()
                else ""
            )
            + (f", epochs cv {cv:.1%}" if cv is not None else "")
            + f"; threshold {self.threshold:.0%}"
        )
        if self.steady:
            return f"steady ({figures})"
        return f"unsteady: {'; '.join(self.reasons)} ({figures})"


def _largest_change(before: Sequence[float], after: Sequence[float]) -> float:
    changes = [end / start - 1 for start, end in zip(before, after) if start > 0 and end > 0]
    return max(changes, key=abs, default=0.0)


def machine_speed_ms(metrics: Mapping[str, float]) -> float | None:
    """How fast the machine was while a cell ran: the reference kernel's milliseconds, the
    mean of its timing before the cell and after it (each the slowest worker's); None for a
    cell recorded without them. A step time measured when the kernel took 14 ms predicts a cell
    whose kernel took 17.5 ms about 25 % short (`harness.predict.facts.speed.at_machine_speed`)."""
    before = metrics.get("reference_kernel_ms_before", 0.0)
    after = metrics.get("reference_kernel_ms_after", 0.0)
    if not (before > 0 and after > 0):
        return None
    return (before + after) / 2


UNSTEADY_MARK = "~"
UNSTEADY_FOOTNOTE = (
    "~: measured while the machine was unsteady (run.steadiness_threshold); "
    "hydra.launcher.remeasure_unsteady=true measures such cells again"
)


def unsteady_note(metrics: Mapping[str, float], steadiness_text: str | None) -> str:
    """What a cell's one-line summary adds when it was measured on an unsteady machine (empty
    when steady): why, and how to measure it again. `steadiness_text`: `Steadiness.text()` as
    the cell recorded it (its environment's `steadiness`)."""
    if metrics.get("steady", 1.0) != 0.0:
        return ""
    text = (steadiness_text or "").removeprefix("unsteady: ")
    why = text.partition(" (reference kernel")[0] or "the machine's speed changed over the cell"
    return (
        f"; UNSTEADY ({UNSTEADY_MARK} in tables): {why}; measure it again on a quiet machine "
        f"(a sweep: hydra.launcher.remeasure_unsteady=true)"
    )


def is_unsteady(metrics: dict[str, float]) -> bool:
    """A result measured while the machine was unsteady (a result recorded before steadiness
    was measured counts as steady: nothing says otherwise)."""
    return metrics.get("steady", 1.0) == 0.0
