"""How distbench shows progress: a bar on a terminal, plain lines anywhere else.

A progress bar redraws one line in place (carriage returns, cursor moves): a terminal shows it
as one line, a log file keeps every frame as garbage. So the choice is made here, from where
progress goes (stderr), and every place that shows progress asks here (`steps`, `track`,
`say`) instead of checking for a terminal itself.

- On a terminal, a task with steps is a tqdm bar.
- Elsewhere (a file, a pipe), it is plain lines: none for a task done within `first_line_s`
  (a second by default), then one with the steps done so far, again every `every_s` (5 s: no
  silent wait longer), and, for a task that showed a line, one with its last count when it
  ends, so that the log never stops at "24/480 (5%)" for a task that went on to finish; the
  caller's own line (the epoch's time, "generated ...") says how it ended.

A local cell's workers write to files that the launcher relays to its own terminal
(`launchers.local.Rank0Terminal`): the launcher hands them its own choice in `PROGRESS_ENV`,
so that rank 0 draws a bar exactly when the launcher's terminal can show it.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Protocol, TextIO, TypeVar

from tqdm import tqdm

PROGRESS_ENV = "DISTBENCH_PROGRESS"  # set by a launcher for its cell's workers
BARS, LINES = "bars", "lines"
FIRST_LINE_S = 1.0  # a task shorter than this prints no line
EVERY_S = 5.0  # then a line this often
T = TypeVar("T")
log = logging.getLogger(__name__)


class Progress(Protocol):
    """What the callers use of a bar: both tqdm and `_Lines` are one."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...


def mode(stream: TextIO | None = None) -> str:
    """BARS or LINES for progress written to `stream` (stderr): what the launcher handed this
    worker, else whether the stream is a terminal."""
    handed = os.environ.get(PROGRESS_ENV)
    if handed in (BARS, LINES):
        return handed
    return BARS if _is_terminal(stream or sys.stderr) else LINES


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def steps(
    total: int,
    desc: str,
    unit: str,
    *,
    enabled: bool = True,
    leave: bool = False,
    mininterval: float = 0.1,
    first_line_s: float = FIRST_LINE_S,
    every_s: float = EVERY_S,
) -> tqdm | _Lines:
    """Progress over `total` steps of `unit`, named `desc`: a bar or lines (module docstring);
    nothing when not `enabled`. Use it as a context manager, `update()` after each step."""
    if mode() == BARS:
        return tqdm(
            total=total,
            desc=desc,
            unit=unit,
            disable=not enabled,
            leave=leave,
            mininterval=mininterval,
            file=sys.stderr,
        )
    return _Lines(total, desc, unit, enabled=enabled, first_line_s=first_line_s, every_s=every_s)


def track(
    items: Iterable[T],
    total: int,
    desc: str,
    unit: str,
    *,
    enabled: bool = True,
    leave: bool = False,
) -> Iterator[T]:
    """`items`, with progress over them (`steps`)."""
    with steps(total, desc, unit, enabled=enabled, leave=leave) as shown:
        for item in items:
            yield item
            shown.update()


def say(text: str, logger: logging.Logger | None = None) -> None:
    """A line that says which phase starts (workers starting, layers profiled): on the
    process's log where it logs at INFO (a cell, a sweep), else on stderr (a command that
    prints its result on stdout, as `harness.plan` does)."""
    logger = logger or log
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(text)
    else:
        print(text, file=sys.stderr, flush=True)


class _Lines:
    """Progress as plain lines (`steps` in a file)."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str,
        *,
        enabled: bool,
        first_line_s: float,
        every_s: float,
    ) -> None:
        self.total, self.desc, self.unit, self.enabled = total, desc, unit, enabled
        self.n = 0
        self._every_s = every_s
        self._next_line = time.monotonic() + first_line_s
        self._shown: int | None = None  # the count the last line said; None: no line yet

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        # A task ended by an error (a refused cell of a dry run: its one line is printed
        # already) shows no last count: the error's line stays the last.
        if kind is None:
            self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if self.enabled and now >= self._next_line:
            self._next_line = now + self._every_s
            self._say()

    def _say(self) -> None:
        percent = f" ({100 * self.n // self.total}%)" if self.total else ""
        say(f"{self.desc}: {self.n}/{self.total} {self.unit}{percent}")
        self._shown = self.n

    def close(self) -> None:
        """Nothing to clear: the lines stay. A task that showed a line shows its last count
        (the line it left would otherwise say it stopped there); the caller says how it
        ended. Closing twice (a context and then the caller) says it once."""
        if self.enabled and self._shown is not None and self._shown != self.n:
            self._say()
