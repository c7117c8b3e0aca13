"""Exit status 1: the command ran cells and not every one ended `ok`.

The launchers and `python -m harness` note each cell's record (`note_cell_results`),
`launchers.hydra_main.run_hydra_main` turns them into the status, and the sweep's summary
table says why each failed cell failed."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

R = TypeVar("R")

# (run name, status, one-line reason) of every cell this process ran or launched: a sweep's
# launcher runs inside hydra.main, which returns nothing, so the outcome travels here.
_cell_statuses: list[tuple[str, str, str]] = []
FAILED_CELLS_EXIT_CODE = 1


def forget_cell_results() -> None:
    """Start a command's count of cells afresh (`launchers.hydra_main.run_hydra_main`)."""
    del _cell_statuses[:]


def note_cell_results(results: Sequence[Mapping[str, Any]]) -> None:
    """Record the outcome of cells (their result.json records) for the exit status."""
    for result in results:
        status, reason = str(result.get("status")), failure_reason(result.get("error"))
        if result.get("storage_error"):  # measured, but its directory refused the record
            status = f"{status}, recorded only in MLflow run {result.get('mlflow_run_id')}"
            reason = str(result["storage_error"])
        _cell_statuses.append((str(result.get("run_name", "?")), status, reason))


def noted(result: R) -> R:
    """`result` (a cell's record), noted for the exit status."""
    if isinstance(result, Mapping):
        note_cell_results([result])
    return result


def exit_on_failed_cells() -> None:
    """Exit with status 1, naming them on stderr, when any noted cell did not end `ok`."""
    failed = [cell for cell in _cell_statuses if cell[1] != "ok"]  # or not in its directory
    if not failed:
        return
    print(
        f"distbench: {len(failed)} of {len(_cell_statuses)} cell(s) did not end ok: "
        + "; ".join(f"{name}: {status} ({reason})" for name, status, reason in failed[:3])
        + ("; ..." if len(failed) > 3 else ""),
        file=sys.stderr,
        flush=True,
    )
    sys.exit(FAILED_CELLS_EXIT_CODE)


def failure_reason(error: object, width: int = 100) -> str:
    """The one line that says why a cell failed: a traceback's last line (the exception),
    else the error's first line; cut to `width` characters."""
    lines = [line.strip() for line in str(error or "").splitlines() if line.strip()]
    if not lines:
        return "no error recorded"
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return line if len(line) <= width else line[: width - 3] + "..."
