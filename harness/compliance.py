"""MLPerf's compliance checker on distbench's event logs:
`python -m harness.compliance <cell dir or mllog file>...`.

The rules it checks with, and why they differ from MLPerf's stock ruleset in one key:
`harness.records.compliance`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from harness.cli.arguments import ArgumentParser
from harness.cli.errors import command
from harness.config.schema import ConfigError
from harness.records.compliance import RULESET, check, mlperf_command, write_rules
from harness.records.results import MLLOG_GLOB


def log_files(paths: list[Path]) -> list[Path]:
    """The logs named: a file as it is, a directory's mllog*.txt (a cell's repeats)."""
    files: list[Path] = []
    allowed = f"allowed: an MLPerf log file, or a cell directory holding {MLLOG_GLOB}"
    for path in paths:
        try:
            found = sorted(path.glob(MLLOG_GLOB)) if path.is_dir() else [path]
            readable = bool(found) and all(file.is_file() for file in found)
        except OSError as err:  # e.g. a name longer than the file system allows
            raise ConfigError(
                f"{_short(path)} is invalid: {err.strerror or err}; {allowed}"
            ) from None
        if not readable:
            raise ConfigError(f"{_short(path)} is invalid: {allowed}")
        files += found
    return files


def _short(path: Path, width: int = 120) -> str:
    """`path` as a line can hold it: a very long one cut in the middle."""
    text = str(path)
    return text if len(text) <= width else f"{text[: width // 2]}...{text[-width // 2 :]}"


def _rules_dir(path: Path) -> Path:
    """--write-rules DIR checked before anything is written: a directory this user can
    write in (or create), one line otherwise (a file, /proc, a name too long)."""
    from harness.cli.preflight import check_writable_dir

    try:
        check_writable_dir("--write-rules", str(path))
        return path.resolve()
    except OSError as err:
        raise ConfigError(
            f"--write-rules={_short(path)} is invalid: {err.strerror or err}; "
            f"allowed: a directory this user can write in"
        ) from None


def parser() -> ArgumentParser:
    """The command's arguments: a function of its own so that tests can list them
    (tests/fuzz/test_commands.py fuzzes every flag)."""
    parser = ArgumentParser(
        prog="python -m harness.compliance", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="an MLPerf log, or a cell directory (every mllog*.txt in it)",
    )
    parser.add_argument(
        "--stock",
        action="store_true",
        help=f"the installed ruleset {RULESET} unchanged (it admits only MLPerf's benchmark names)",
    )
    parser.add_argument(
        "--write-rules",
        type=Path,
        metavar="DIR",
        help="write the rules to DIR and print MLPerf's own command that checks a log with them",
    )
    return parser


@command
def main(argv: list[str] | None = None) -> int:
    arguments = parser()
    args = arguments.parse_args(argv)
    if args.write_rules is not None:
        rules = write_rules(_rules_dir(args.write_rules))
        print(" ".join(mlperf_command(Path("FILE"), rules)).replace(sys.executable, "python"))
    elif not args.paths:
        arguments.error("name a log or a cell directory (PATH), or --write-rules DIR")
    failed = 0
    for log in log_files(args.paths):
        with _quiet_checker():
            verdict = check(log, stock=args.stock)
        print(f"{log}: {'SUCCESS' if verdict.ok else 'FAILED'}")
        for problem in verdict.problems:
            print("  " + problem.replace("\n", "\n  "))
        failed += not verdict.ok
    return 1 if failed else 0


@contextlib.contextmanager
def _quiet_checker() -> Iterator[None]:
    """The checker logs its messages on the root logger too: printed once, by main."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


if __name__ == "__main__":
    sys.exit(main())
