"""Every other exception: one line naming the setting involved, exit status 3.

`one_door` is where any exception that is not bad input leaves a command (a store that cannot
be used, a damaged state file, a library's error, a bug): one line, exit status 3, the
traceback kept in a file (DISTBENCH_DEBUG=1 prints it instead); Ctrl-C leaves it in one line
with status 130. A reader that closed the
command's output (`... | head`) ends it quietly with 141, as SIGPIPE ends a command. `command`
is the decorator every entry point's `main` wears: both doors around it."""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from harness.cli.bad_input import (
    BAD_INPUT_ERRORS,
    P,
    R,
    exit_bad_input,
    exit_on_bad_input,
    single_line,
)
from harness.cli.cell_results import failure_reason


def command(function: Callable[P, R]) -> Callable[P, R]:
    """Decorator for a command's `main`: bad input anywhere in it exits as described above;
    any other exception leaves through `one_door`."""

    @functools.wraps(function)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        with one_door(), exit_on_bad_input():
            return function(*args, **kwargs)
        raise AssertionError("unreachable")  # for type checkers: the block returns or exits

    return guarded


# Exit status when a command could not do its work for a reason that is not the user's input
# nor a cell's outcome: a store that cannot be reached or read, a corrupt state file, the file
# system refusing a write, or a bug. Distinct from 1 (cells failed) so a script can tell
# "re-run later / repair the store" from "the benchmark measured a failure".
ENVIRONMENT_EXIT_CODE = 3
# Set to 1 to get the traceback on stderr as well (a developer's switch); HYDRA_FULL_ERROR=1,
# Hydra's own switch, does the same.
DEBUG_ENV = "DISTBENCH_DEBUG"
# Modules whose exceptions mean "the tracking store failed", named by `tracking.uri`.
_STORE_MODULES = ("mlflow", "sqlalchemy", "sqlite3", "requests", "urllib3", "alembic")
# Settings a command is using, noted as it resolves them (note_setting), so that a library's
# error can be blamed on the setting it came from: "tracking.uri" -> the resolved URI.
_settings_in_use: dict[str, str] = {}


class StateError(Exception):
    """A file or store the command reads is unusable: its message is the one line (which file,
    what is wrong, how to recover)."""


def note_setting(key: str, value: str) -> None:
    """Note that this command uses `key` = `value` (e.g. the resolved `tracking.uri`)."""
    _settings_in_use[key] = value


def is_store_error(err: BaseException) -> bool:
    """Whether `err` (or an exception it was raised from) comes from the tracking store's
    libraries."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__module__.split(".")[0] in _STORE_MODULES:
            return True
        current = current.__cause__ or current.__context__
    return False


def failure_line(err: BaseException) -> str:
    """The one line (no newline) that says what went wrong, naming the setting involved."""
    if isinstance(err, StateError):
        return " ".join(str(err).split())
    message = failure_reason(f"{type(err).__name__}: {err}".rstrip(": "), width=200)
    if is_store_error(err):
        uri = _settings_in_use.get("tracking.uri", "(unresolved)")
        return (
            f"tracking.uri={uri}: the MLflow store cannot be used ({message}); check that "
            f"it is reachable and is an MLflow store"
        )
    where = "; ".join(f"{k}={v}" for k, v in _settings_in_use.items())
    return message + (f" (settings: {where})" if where else "")


def _save_traceback(err: BaseException) -> str:
    """Write `err`'s traceback to a file under the temporary directory; its path, or a note
    that it could not be written (the file system may be what failed)."""
    import tempfile
    import time
    import traceback

    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    try:
        folder = Path(tempfile.gettempdir()) / "distbench-errors"
        folder.mkdir(parents=True, exist_ok=True)
        script = Path(sys.argv[0])
        name = script.parent.name if script.stem == "__main__" else script.stem
        path = folder / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
        path.write_text(text)
        return str(path)
    except OSError as write_err:
        return f"not saved ({write_err.strerror}); set {DEBUG_ENV}=1 to print it"


@contextlib.contextmanager
def one_door() -> Iterator[None]:
    """Every exception that escapes a command (ours or a library's) leaves as ONE line on
    stderr and exit status 3 (ENVIRONMENT_EXIT_CODE); the full traceback goes to a file the
    line names, or to stderr with DISTBENCH_DEBUG=1. Bad input (exit 2) and SystemExit pass
    through untouched; Ctrl-C (KeyboardInterrupt) that reaches here, after every `finally` on
    its way ran, ends the command with one line and the shell's status for SIGINT (130),
    instead of a traceback."""
    try:
        yield
    except KeyboardInterrupt:
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        print(
            "distbench: interrupted by SIGINT (Ctrl-C): ended; what it had measured and kept "
            "(facts files, results, MLflow runs) stays",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(128 + signal.SIGINT)
    except (SystemExit, GeneratorExit):
        raise
    except BAD_INPUT_ERRORS as err:
        exit_bad_input(err)
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        # `... | head` read what it wanted and closed the pipe: no error of ours. End as a
        # command killed by SIGPIPE does, saying nothing; stdout goes to /dev/null so that the
        # interpreter's last flush does not fail again on the way out.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except Exception as err:  # noqa: BLE001 - the door: every other exception ends here
        if os.environ.get(DEBUG_ENV) == "1" or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise  # asked for: the traceback as Python prints it
        if isinstance(err, StateError):  # the line says all there is: no traceback to keep
            print(
                f"distbench: error: {single_line(failure_line(err))}", file=sys.stderr, flush=True
            )
            sys.exit(ENVIRONMENT_EXIT_CODE)
        kind = "" if is_store_error(err) else " (a bug?)"
        print(
            f"distbench: error{kind}: {single_line(failure_line(err))} "
            f"[traceback: {_save_traceback(err)}]",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(ENVIRONMENT_EXIT_CODE)


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (a write to it would fail with
    EPIPE), as opposed to a broken pipe elsewhere (a socket: an error to report)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no stdout, or not a file
        return False
