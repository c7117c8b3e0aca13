"""Ends a worker that stops making progress, after saying where it was stuck.

A hang (a deadlock, a peer that vanished mid-collective, a stuck device) would otherwise hold
its cell, and with it the whole sweep, forever. The training loop calls `beat()` after every
batch; if no beat arrives for `timeout_s`, the watchdog hands the stacks of all threads to
`on_stall` (which records the cell as `timeout`) and ends the process.

`on_stall` runs in a thread of its own and is given `record_s` seconds: the stuck thread may
hold a lock that recording needs (logging's, an open database's), and a watchdog that waited
on it would hang as well. The process ends when `on_stall` returns or its time is up.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType

STALL_EXIT_CODE = 124  # what `timeout(1)` returns, so a shell reads it as a time-out
# How long recording a stalled cell may take (MLflow's store included) before the process ends.
STALL_RECORD_S = 60.0


class ProgressWatchdog:
    def __init__(
        self, timeout_s: float, on_stall: Callable[[str], None], record_s: float = STALL_RECORD_S
    ) -> None:
        self.timeout_s = timeout_s
        self.record_s = record_s
        self._on_stall = on_stall
        self._last_beat = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="progress-watchdog", daemon=True)

    def beat(self) -> None:
        self._last_beat = time.monotonic()

    def __enter__(self) -> ProgressWatchdog:
        self.beat()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(timeout=min(1.0, self.timeout_s / 4)):
            stalled_for = time.monotonic() - self._last_beat
            if stalled_for >= self.timeout_s:
                report = (
                    f"no progress for {stalled_for:.0f} s (run.progress_timeout_s="
                    f"{self.timeout_s:g}); stacks of all threads:\n{all_stacks()}"
                )
                recording = threading.Thread(
                    target=self._record, args=(report,), name="stall-record", daemon=True
                )
                recording.start()
                recording.join(timeout=self.record_s)
                if recording.is_alive():
                    print(
                        f"[distbench] recording the stalled cell took over {self.record_s:g} s;"
                        " ending it unrecorded",
                        file=sys.stderr,
                        flush=True,
                    )
                os._exit(STALL_EXIT_CODE)  # the stuck thread cannot be unwound

    def _record(self, report: str) -> None:
        try:
            self._on_stall(report)
        except BaseException:  # noqa: BLE001 - the process ends anyway; say why nothing was recorded
            traceback.print_exc(file=sys.stderr)


def all_stacks() -> str:
    """Stack traces of every thread of this process, the stuck one included."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        if names.get(ident) in ("progress-watchdog", "stall-record"):
            continue
        parts.append(f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}")
    return "\n".join(parts)
