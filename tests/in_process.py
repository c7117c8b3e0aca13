"""A command's real entry point (`python -m <module>`) run inside this process, and the promise
bad input must keep (harness.cli): exit status 2, one line on stderr starting 'distbench: ', no
traceback, nothing written. Shared by the bad-input table (tests/faults/test_bad_input.py) and the
command fuzzer (tests/fuzz/test_commands.py): each runs many command lines in ONE subprocess,
since a fresh interpreter per command line costs ~4 s of imports on 2 CPU cores.

Two ways for the tests that are about what a command answers, not about its process, to run it
in the test's own process: `in_process_command` (its `python -m` entry point through
`run_in_process`, file descriptors captured) and `command_here` (its `main(argv)`, under
pytest's `capfd`); both return a `CompletedProcess` as a subprocess would."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

# A refused command line takes well under a second; one that is not refused starts work (a
# cell, a probe), which this bounds.
CASE_TIMEOUT_S = 60


def listing(root: Path, *, leave_out: Sequence[Path] = ()) -> list[str]:
    """Every path under `root` (relative, sorted), but those under `leave_out`."""
    skipped = [str(path.relative_to(root)) for path in leave_out]
    found = (str(path.relative_to(root)) for path in root.rglob("*"))
    return sorted(
        name
        for name in found
        if not any(name == skip or name.startswith(skip + os.sep) for skip in skipped)
    )


def run_in_process(
    command: str,
    argv: Sequence[str],
    work: Path,
    capture: Path,
    env: Sequence[tuple[str, str]] = (),
    *,
    watched: Path | None = None,
    timeout_s: int = CASE_TIMEOUT_S,
) -> dict[str, Any]:
    """Run `python -m <command> <argv>` through runpy in this process, in `work`, its stdout
    and stderr (file descriptors 1 and 2, so C-level output too) in `capture`; `env` changes
    the environment for this run only. The outcome: `code` (the exit status, or "raised" for
    an exception that escaped), `stderr`, `stdout`, and `written`: what appeared under (or
    went from) `watched` (default `work`; `capture` is left out)."""
    import runpy
    import signal

    from hydra.core.global_hydra import GlobalHydra

    import harness.cli.errors

    watched = work if watched is None else watched

    def seen() -> list[str]:
        return listing(watched, leave_out=[capture] if capture.is_relative_to(watched) else [])

    environ, cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    code: object = 0

    def too_long(*_: object) -> None:
        raise TimeoutError(f"not refused within {timeout_s} s")

    before = seen()
    # What a command prints may hold bytes that are not UTF-8 (an argument's, as typed)
    with (
        open(capture / "stderr", "w+", errors="backslashreplace") as err,
        open(capture / "stdout", "w+", errors="backslashreplace") as out,
    ):
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        os.environ.update(dict(env))
        os.chdir(work)
        sys.argv = [command, *argv]
        harness.cli.errors._settings_in_use.clear()  # a fresh process has noted none
        if command != "harness":  # imported by an earlier run: runpy would warn
            sys.modules.pop(command, None)
        sys.modules.pop(f"{command}.__main__", None)  # a package's, likewise
        signal.signal(signal.SIGALRM, too_long)
        signal.alarm(timeout_s)
        try:
            runpy.run_module(command, run_name="__main__", alter_sys=True)
        except SystemExit as exit_:
            code = exit_.code
            if code is not None and not isinstance(code, int):  # sys.exit("message")
                print(code, file=sys.stderr)  # as the interpreter does, with status 1
                code = 1
        except BaseException:  # noqa: BLE001 - a crash is a finding of the caller
            import traceback

            traceback.print_exc()
            code = "raised"
        finally:
            signal.alarm(0)
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[1], 1), os.dup2(saved[2], 2)
            os.chdir(cwd)
            sys.argv = saved_argv
            os.environ.clear(), os.environ.update(environ)
            GlobalHydra.instance().clear()
        err.seek(0), out.seek(0)
        stderr, stdout = err.read(), out.read()
    for fd in saved.values():
        os.close(fd)
    after = seen()
    return {
        "code": 0 if code is None else code,
        "stderr": stderr,
        "stdout": stdout,
        "written": sorted(set(after) - set(before))
        + [f"(removed) {p}" for p in sorted(set(before) - set(after))],
    }


def refusal_broken(outcome: dict[str, Any]) -> str | None:
    """How `outcome` (of run_in_process) breaks the promise for bad input, or None when it kept
    it: exit status 2, one line on stderr starting 'distbench: ', no traceback, nothing
    written."""
    lines = outcome["stderr"].strip().splitlines()
    if outcome["code"] != 2:
        return f"exit status {outcome['code']}, not 2"
    if "Traceback" in outcome["stderr"]:
        return "printed a traceback"
    if len(lines) != 1 or not lines[0].startswith("distbench: "):
        return f"{len(lines)} lines on stderr, not one starting 'distbench: '"
    if outcome["written"]:
        return f"wrote {outcome['written'][:5]}"
    return None


def in_process_command(
    command: str, args: list[str], cwd: Path, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """`python -m command args` in `cwd`, through its real entry point but in this process
    (tests.in_process.run_in_process: exit status, stdout and stderr as a subprocess's), for
    the tests that are not about the process itself: a fresh interpreter costs several
    CPU-seconds of imports. The SIGTERM handler and unraisable hook a command installs
    (harness.cli.signals) are put back afterwards."""
    capture = cwd / f"capture-{command}"
    capture.mkdir(exist_ok=True)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    hook, streams = sys.unraisablehook, (sys.stdout, sys.stderr)
    # sys.stdout and sys.stderr onto file descriptors 1 and 2, which run_in_process captures
    # (pytest's capture puts objects of its own there, which write elsewhere).
    sys.stdout, sys.stderr = (
        io.TextIOWrapper(
            io.FileIO(fd, "w", closefd=False), errors="backslashreplace", write_through=True
        )
        for fd in (1, 2)
    )
    try:
        outcome = run_in_process(command, args, cwd, capture, timeout_s=timeout)
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        sys.stdout, sys.stderr = streams
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        sys.unraisablehook = hook
    return subprocess.CompletedProcess(
        [command, *args], outcome["code"], outcome["stdout"], outcome["stderr"]
    )


def command_here(
    main: Callable[[list[str]], object], argv: list[str], capfd: pytest.CaptureFixture[str]
) -> subprocess.CompletedProcess[str]:
    """A command's `main(argv)` run in this process, as `python -m` runs it: its exit status
    (that of the SystemExit it raised, else 0) and what it wrote to stdout and stderr (file
    descriptors 1 and 2 included). No interpreter to start, no torch, torchvision or MLflow
    to import again: for the tests about what the command answers, not about its process."""
    capfd.readouterr()
    code: object = 0
    try:
        main(argv)
    except SystemExit as exit_:
        code = 0 if exit_.code is None else exit_.code
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["python", "-m", *argv], code, out, err)
