"""Where a plan's predicted figures come from, and how far that source has been from
measurements nobody here made (`python scripts/published_tables.py`, which writes
`validation.json` beside this module)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

VALIDATION = Path(__file__).with_name("validation.json")


@dataclass(frozen=True)
class SourceError:
    """The data-sheet model's error against published measurements."""

    mape: float  # mean absolute percentage error of step time, as a share
    worst: float
    rows: int
    measured: str  # what it was checked against, and when

    def line(self) -> str:
        return (
            f"source: data sheets (no step timed on this GPU); step-time error "
            f"{self.mape:.0%} mean, {self.worst:.0%} worst over {self.rows} published runs "
            f"({self.measured})"
        )


def data_sheet_error() -> SourceError:
    """The error `scripts/published_tables.py` measured and kept."""
    kept = json.loads(VALIDATION.read_text())
    return SourceError(
        mape=float(kept["mape"]),
        worst=float(kept["worst"]),
        rows=int(kept["rows"]),
        measured=str(kept["measured"]),
    )
