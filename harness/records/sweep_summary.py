"""What a sweep's cells came to (ok, failed, reused, the fastest), from the one list of records
its launcher gathered: the cells it ran and the cells it reused, whose results an earlier run
measured (`launchers.cells.finished_earlier`). The sweep's summary table, the line under it
and its MLflow parent run's summary are all made of that list, so none can name a fastest
cell the table does not show as fastest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.records.results import RunStatus

# Added by the launcher to the record of a cell it did not run because an earlier run of the
# same cell had finished: its record is that run's (its output_dir says where it came from).
REUSED_KEY = "reused"


def mark_reused(result: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an earlier run's record, marked as reused by this sweep."""
    return {**result, REUSED_KEY: True}


def is_reused(result: Mapping[str, Any]) -> bool:
    return bool(result.get(REUSED_KEY))


@dataclass(frozen=True)
class SweepSummary:
    cells_ok: int  # reused cells included: each ended ok in its earlier run
    cells_failed: int  # every other status but interrupted: oom, failed, timeout, diverged
    cells_reused: int
    # (run name, seconds per epoch, reused) of the fastest cell that ended ok
    fastest: tuple[str, float, bool] | None
    # ended by the sweep's own Ctrl-C or SIGTERM, with what they measured kept: not failures
    cells_interrupted: int = 0

    @classmethod
    def of(cls, results: Iterable[Mapping[str, Any]]) -> SweepSummary:
        ok = failed = reused = interrupted = 0
        fastest: tuple[str, float, bool] | None = None
        for result in results:
            reused += is_reused(result)
            if result.get("status") == RunStatus.interrupted.value:
                interrupted += 1
                continue
            if result.get("status") != RunStatus.ok.value:
                failed += 1
                continue
            ok += 1
            seconds = result.get("metrics", {}).get("seconds_per_epoch")
            if seconds is not None and (fastest is None or seconds < fastest[1]):
                fastest = (str(result.get("run_name")), float(seconds), is_reused(result))
        return cls(ok, failed, reused, fastest, interrupted)

    def line(self) -> str:
        """'3 cell(s) ok (1 reused), 0 failed; fastest 'ddp ...' at 5.441 s/epoch (reused)'; a
        sweep ended by Ctrl-C also counts its cell that was running: '..., 0 failed, 1
        interrupted'."""
        reused = f" ({self.cells_reused} reused)" if self.cells_reused else ""
        fastest = ""
        if self.fastest is not None:
            name, seconds, was_reused = self.fastest
            fastest = f"; fastest {name!r} at {seconds:.3f} s/epoch" + (
                " (reused)" if was_reused else ""
            )
        interrupted = f", {self.cells_interrupted} interrupted" if self.cells_interrupted else ""
        return (
            f"{self.cells_ok} cell(s) ok{reused}, {self.cells_failed} failed{interrupted}{fastest}"
        )
