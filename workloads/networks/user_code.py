"""A user's code (`network=module`), run in its place: while a config is checked.

Checking a config builds the network on the meta device (`workloads.networks.check`), which
runs the user's module: its import, its factory, its forward. That code may do what no model
should while it is being checked, and each would break the promise that bad input ends in one
line with exit status 2:

- exit (`sys.exit(0)` in the module or the factory): the command would end at once, with its
  status, nothing printed or measured. Here it is a refusal that says so;
- wait (a factory that sleeps, or waits on a lock or a server): the check would hang with no
  word. On the meta device a network allocates nothing, so building it takes well under a
  second; past `CHECK_SECONDS` it is refused;
- print (a factory that prints a megabyte): the one-line refusal would drown. What it prints
  while being checked is kept aside and dropped, and named (its first line) where the check
  fails;
- be anything callable: `network.target=os:makedirs` would make a directory when it is
  checked. A target in Python's standard library is refused before anything is called.

In a worker, building the network for real, none of this applies: the code runs as written,
its output in the worker's log.
"""

from __future__ import annotations

import contextlib
import io
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from workloads.networks.ref import NetworkError

# The longest a check may spend importing, building and running a user's network on the meta
# device (the module's docstring).
CHECK_SECONDS = 60.0
# Characters of a user's output kept while it is checked (the rest is counted, not kept).
KEPT_OUTPUT = 10_000


class _OutOfTime(BaseException):
    """Raised in the checking thread when the bound on a user's code has passed (a
    BaseException: the user's own `except Exception` does not swallow it)."""


class _Bounded(io.StringIO):
    """A stream that keeps the first KEPT_OUTPUT characters written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines = 0

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        room = KEPT_OUTPUT - self.tell()
        if room > 0:
            super().write(text[:room])
        return len(text)


def refuse_standard_library(target: str, module_name: str) -> None:
    """NetworkError for a target in Python's standard library (`os:makedirs`,
    `shutil:rmtree`): no network is built there, and calling it to check would act."""
    top = module_name.split(".")[0]
    if top in sys.stdlib_module_names or top == "builtins":
        raise NetworkError(
            f"network.target={target}: {module_name} is Python's standard library, which "
            f"builds no network; name your own factory or nn.Module class "
            f"(mypkg.models:build)"
        )


@contextlib.contextmanager
def run_as_checked(target: str, what: str) -> Iterator[None]:
    """Run a user's code (`what`: "importing it", "calling it", ...) under the rules of the
    module's docstring: an exit or a wait past CHECK_SECONDS becomes a NetworkError, its output
    is kept aside (named in an error raised inside)."""
    output = _Bounded()
    alarm = _start_alarm(CHECK_SECONDS)
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            yield
    except SystemExit as exit_:
        raise NetworkError(
            f"network.target={target}: {what} called sys.exit({exit_.code!r}) while "
            f"distbench checked it{_printed(output)}; a factory returns the model"
        ) from None
    except _OutOfTime:
        raise NetworkError(
            f"network.target={target}: {what} took over {CHECK_SECONDS:.0f} s on the "
            f"meta device, where a network allocates nothing{_printed(output)}; does it "
            f"wait on something (a lock, a server, input)?"
        ) from None
    except NetworkError as err:
        raise NetworkError(f"{err}{_printed(output)}") from None
    except Exception as err:  # noqa: BLE001 - the user's code may raise anything
        printed = _printed(output)
        if printed:
            err.add_note(printed.removeprefix("; "))
        raise
    finally:
        alarm()


def _printed(output: _Bounded) -> str:
    """Where a check fails: what the user's code printed meanwhile, in a few words."""
    text = output.getvalue().strip()
    if not text:
        return ""
    first = text.splitlines()[0][:120]
    return f"; it printed {max(output.lines, 1):,} line(s), the first: {first!r}"


def _start_alarm(seconds: float) -> Callable[[], None]:
    """Raise _OutOfTime in this thread after `seconds`; returns what cancels it. A timer thread
    sends SIGALRM to this thread (a signal, not a flag: it interrupts a sleep or a wait), whose
    handler is ours meanwhile; an alarm someone else set (pytest-timeout's) still reaches
    theirs. Only the main thread receives signals: elsewhere no bound is set."""
    main = threading.main_thread()
    if threading.current_thread() is not main or main.ident is None:
        return lambda: None
    fired, active = threading.Event(), threading.Event()
    active.set()

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        if not fired.is_set():
            if callable(previous):
                previous(signum, frame)
        elif active.is_set():
            raise _OutOfTime

    def fire() -> None:
        fired.set()
        signal.pthread_kill(main.ident, signal.SIGALRM)  # type: ignore[arg-type]

    previous = signal.signal(signal.SIGALRM, on_alarm)
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()

    def cancel() -> None:
        active.clear()  # from here an alarm of ours that arrives late is dropped
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGALRM, previous)

    return cancel
