"""Signals that end a command as Ctrl-C does, and are never lost where Python drops them."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any


def end_like_ctrl_c_on_sigterm() -> None:
    """SIGTERM (`kill`, `scancel`, a shutdown) ends this process as Ctrl-C does, through its
    `finally` blocks: a sweep closes its MLflow parent run (KILLED) and its cell's workers,
    which follow the launcher, end themselves; by default the process would just vanish.
    Neither signal is lost where Python drops the exception its handler raises
    (`raise_signals_again_where_dropped`)."""
    signal.signal(signal.SIGTERM, _leave)
    raise_signals_again_where_dropped()


class EndedBySignal(SystemExit):
    """The SystemExit that SIGTERM's handler raises: its code is the shell's status for "ended
    by signal signum" (128 + signum)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _leave(signum: int, frame: object) -> None:
    raise EndedBySignal(signum)


# How long after a signal's exception was dropped it is raised again: a destructor or a fork
# hook is over by then.
RAISE_AGAIN_AFTER_S = 0.01


def raise_signals_again_where_dropped() -> None:
    """Python runs a signal's handler at the next bytecode of the main thread, and where that
    is a destructor, a weakref callback or a fork hook (logging's runs at every fork) the
    exception it raises cannot propagate: Python prints "Exception ignored in ..." and goes
    on. A SIGTERM or Ctrl-C that lands there would be lost, and a sweep asked to end would
    run its cells to the end (measured: a SIGTERM handled in a fork hook or a `__del__` left
    the command running, exit status 0). This hook raises such a signal again, whose handler
    then runs where its exception propagates. Idempotent."""
    if getattr(sys.unraisablehook, "raises_signals_again", False):
        return
    dropped_by = sys.unraisablehook

    def raise_again(unraisable: Any) -> None:
        signum = _signal_of(unraisable.exc_value)
        if signum is None:
            dropped_by(unraisable)
            return
        # Raised again from another thread, a moment later: raised from here (or at once),
        # its handler would run in this hook, where its exception is dropped once more. Where
        # it lands in such a place again, this hook raises it again.
        again = threading.Timer(RAISE_AGAIN_AFTER_S, _signal_main_thread, args=(signum,))
        again.daemon = True
        with contextlib.suppress(RuntimeError):  # at interpreter shutdown: it ends anyway
            again.start()

    raise_again.raises_signals_again = True  # type: ignore[attr-defined]
    sys.unraisablehook = raise_again


def _signal_main_thread(signum: int) -> None:
    """`signum` sent again to the main thread itself, as the first one was: a blocking call
    there (a sleep, a wait for a cell's workers) returns at once to run its handler.
    `_thread.interrupt_main` only schedules the handler for the main thread's next bytecode,
    after such a call has ended by itself (measured: a Ctrl-C dropped in a destructor before a
    2 s sleep ended the command after the sleep, 2.2 s, where this ends it in 0.2 s)."""
    main = threading.main_thread().ident
    if main is not None:
        with contextlib.suppress(OSError):  # the main thread has ended: so does the process
            signal.pthread_kill(main, signum)


def _signal_of(error: BaseException | None) -> int | None:
    """The signal whose handler raised `error` (this module's SIGTERM handler, or Python's
    default SIGINT handler) while it is still that signal's handler; None otherwise."""
    if isinstance(error, EndedBySignal) and signal.getsignal(error.signum) is _leave:
        return error.signum
    if (
        isinstance(error, KeyboardInterrupt)
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        return signal.SIGINT
    return None
