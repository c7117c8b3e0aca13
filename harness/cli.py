"""How every distbench command answers bad input: ONE line on stderr that names the key and
what is allowed, exit status 2, no traceback; before anything is trained, submitted or written.

Bad input is a `ConfigError` (our validation: `harness.config`, the launchers' sizing, a
command's own checks), or Hydra/OmegaConf rejecting an override (an unknown group option such as
`network=resnet19`, a misspelled key, a wrong type, a malformed override). Any other exception
(a store that cannot be used, a damaged state file, a library's error, a bug) leaves through
`one_door`: one line naming the setting involved, exit status 3, the traceback kept in a file
(DISTBENCH_DEBUG=1 prints it instead). A reader that closed the command's output (`... | head`)
ends it quietly with 141, as SIGPIPE ends a command.

Use it in an entry point in one of two ways:

1. A command that composes its config itself (`harness.compose.compose_config`), e.g.
   `harness.describe`, `harness.plan`, `harness.analysis`, `harness.recommend`::

       from harness.cli import command

       @command
       def main(argv: list[str] | None = None) -> None:
           config = validate(compose_config(sys.argv[1:] if argv is None else argv))
           if impossible(config):  # a check of the command's own
               raise ConfigError("key=value is invalid: <what is allowed>")
           ...

   or, around just the part that reads input, `with exit_on_bad_input(): ...`.

2. A `@hydra.main` program (`python -m harness`): Hydra composes before the decorated function
   runs and prints its own multi-line report, so call it through
   `launchers.hydra_main.run_hydra_main`::

       if __name__ == "__main__":
           run_hydra_main(main)

Raise `ConfigError` with the message form of `harness.config`: "key=value is invalid: allowed".
A wrong flag of a command with flags is the same: build its parser with `ArgumentParser` here.

Exit status 1 means the command ran cells and not every one ended `ok`: the launchers and
`python -m harness` note each cell's record (`note_cell_results`), `run_hydra_main` turns
them into the status, and the sweep's summary table says why each failed cell failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from harness.config import ConfigError, one_line, unknown_key

BAD_INPUT_EXIT_CODE = 2
# Exceptions that mean "the user's input is wrong", never "the program is wrong".
BAD_INPUT_ERRORS: tuple[type[Exception], ...] = (ConfigError, HydraException,
                                                 OmegaConfBaseException)

P = ParamSpec("P")
R = TypeVar("R")


# Where str.splitlines() ends a line: a value typed with one of these (an argument holding a
# newline) would make a message of several lines.
_LINE_BREAKS = {ord(char): char.encode("unicode_escape").decode()
                for char in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def single_line(text: str) -> str:
    """`text` with every line break escaped as Python writes it (`\\n`): a message quoting
    what was typed stays one line, and still shows where the break was."""
    return text.translate(_LINE_BREAKS)


def bad_input_message(err: Exception) -> str:
    """The one line that explains `err` (no newline)."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        # "network/resnet19" -> "network=resnet19", as the user typed it.
        group, _, option = err.missing_cfg_file.rpartition("/")
        return single_line(f"{group}={option}: unknown; choose one of "
                           f"{', '.join(sorted(err.options))}")
    if isinstance(err, ConfigError):
        return " ".join(str(err).split())
    return single_line(_unknown_key(err) or _malformed_override(err) or one_line(err))


def _unknown_key(err: Exception) -> str | None:
    """"dataset.bogus: unknown key; allowed: name, source, ..." for a misspelled key of a
    typed (dataclass) section, else None; another model's distribution setting also says
    which models have it and the per-model form (harness.config.unknown_key)."""
    cause = err.__cause__
    if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return None
    section = getattr(cause, "object_type", None)
    if not (isinstance(section, type) and dataclasses.is_dataclass(section)):
        return None
    return unknown_key(str(cause.full_key), section, _given_value(str(cause.full_key)))


def _given_value(key: str) -> str | None:
    """The value the command line gave `key` (`key=value`, `+key=value`), if it did."""
    for argument in sys.argv[1:]:
        name, equals, value = argument.lstrip("+~").partition("=")
        if equals and name == key:
            return value
    return None


def _malformed_override(err: Exception) -> str | None:
    """"run.epochs=[1: malformed override (...)" naming the command-line argument that Hydra's
    override parser rejected (its own message quotes only the token it stopped at)."""
    if not isinstance(err, OverrideParseException):
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for argument in sys.argv[1:]:
        if argument.startswith("-"):
            continue
        try:
            parser.parse_overrides([argument])
        except HydraException:
            return (f"{argument}: malformed override ({one_line(err)}); allowed: key=value, "
                    f"+key=value, ~key, key=a,b,c with -m")
    return None


def exit_bad_input(err: Exception, context: str = "") -> NoReturn:
    """Print `err` as one line on stderr and exit with status 2."""
    where = f" {context}" if context else ""
    print(f"distbench: invalid config{where}: {bad_input_message(err)}", file=sys.stderr,
          flush=True)
    sys.exit(BAD_INPUT_EXIT_CODE)


@contextlib.contextmanager
def exit_on_bad_input(context: str = "") -> Iterator[None]:
    """Turn bad input raised inside the block into one line on stderr and exit status 2;
    `context` (e.g. "in sweep cell dataset=x") goes after "invalid config"."""
    try:
        yield
    except BAD_INPUT_ERRORS as err:
        exit_bad_input(err, context)


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
        return (f"tracking.uri={uri}: the MLflow store cannot be used ({message}); check that "
                f"it is reachable and is an MLflow store")
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
    line names, or to stderr with DISTBENCH_DEBUG=1. Bad input (exit 2), SystemExit and
    Ctrl-C pass through untouched."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt, GeneratorExit):
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
            print(f"distbench: error: {single_line(failure_line(err))}", file=sys.stderr,
                  flush=True)
            sys.exit(ENVIRONMENT_EXIT_CODE)
        kind = "" if is_store_error(err) else " (a bug?)"
        print(f"distbench: error{kind}: {single_line(failure_line(err))} "
              f"[traceback: {_save_traceback(err)}]", file=sys.stderr, flush=True)
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
    if isinstance(error, KeyboardInterrupt) and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        return signal.SIGINT
    return None


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
    print(f"distbench: {len(failed)} of {len(_cell_statuses)} cell(s) did not end ok: "
          + "; ".join(f"{name}: {status} ({reason})" for name, status, reason in failed[:3])
          + ("; ..." if len(failed) > 3 else ""), file=sys.stderr, flush=True)
    sys.exit(FAILED_CELLS_EXIT_CODE)


def failure_reason(error: object, width: int = 100) -> str:
    """The one line that says why a cell failed: a traceback's last line (the exception),
    else the error's first line; cut to `width` characters."""
    lines = [line.strip() for line in str(error or "").splitlines() if line.strip()]
    if not lines:
        return "no error recorded"
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return line if len(line) <= width else line[:width - 3] + "..."


class ArgumentParser(argparse.ArgumentParser):
    """argparse for distbench's commands: a wrong flag or flag value is bad input like any
    other, one line and exit status 2 (argparse's own report adds the usage lines)."""

    def error(self, message: str) -> NoReturn:
        print(f"distbench: invalid argument: {single_line(message)}; see {self.prog} --help",
              file=sys.stderr, flush=True)
        sys.exit(BAD_INPUT_EXIT_CODE)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        return refuse_dashes_as_value(self, action, arg_strings)


def refuse_dashes_as_value(parser: argparse.ArgumentParser, action: argparse.Action,
                           arg_strings: list[str]) -> Any:
    """argparse's own `_get_values`, but a flag given '--' as its value (`--out=--`) is a
    wrong flag: argparse (Python 3.11) drops the '--' and hands the flag an empty list, which
    no command expects (it crashed as an error of the command)."""
    if arg_strings == ["--"] and action.option_strings and action.nargs in (None, "?"):
        parser.error(f"argument {'/'.join(action.option_strings)}: expected one argument, not "
                     f"'--' (argparse's end of the flags; a file named -- is ./--)")
    return argparse.ArgumentParser._get_values(parser, action, arg_strings)


# What a command of config overrides only says of them in its --help.
OVERRIDES_EPILOG = """\
arguments: config overrides, as `python -m harness` takes them: GROUP=OPTION picks a config of a
group (dataset=cifar10, network=resnet50, hardware=local_2cpu, distribution=<model>), KEY=VALUE
sets a field (distribution.batch_size=64, run.output_dir=outputs); `python -m harness --help`
lists the groups and their options."""


def overrides_parser(prog: str, description: str | None) -> ArgumentParser:
    """The parser of a command whose arguments are config overrides only (harness.describe,
    plan, probe, sync): `--help`, and every other argument left to Hydra (`parse_known_args`),
    which refuses a malformed override in one line as before. Without it, `--help` was refused
    as a malformed override."""
    return ArgumentParser(prog=prog, description=description, epilog=OVERRIDES_EPILOG,
                          usage=f"{prog} [-h] [GROUP=OPTION | KEY=VALUE ...]",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def overrides_of(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> list[str]:
    """The config overrides of a command line (`sys.argv[1:]` when `argv` is None), after its
    parser has taken its flags (and answered --help)."""
    return parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))[1]
