"""Argument parsing of distbench's commands: a wrong flag is bad input like any other."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from harness.cli.bad_input import BAD_INPUT_EXIT_CODE, single_line


class ArgumentParser(argparse.ArgumentParser):
    """argparse for distbench's commands: a wrong flag or flag value is bad input like any
    other, one line and exit status 2 (argparse's own report adds the usage lines)."""

    def error(self, message: str) -> NoReturn:
        print(
            f"distbench: invalid argument: {single_line(message)}; see {self.prog} --help",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(BAD_INPUT_EXIT_CODE)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        return refuse_dashes_as_value(self, action, arg_strings)


def refuse_dashes_as_value(
    parser: argparse.ArgumentParser, action: argparse.Action, arg_strings: list[str]
) -> Any:
    """argparse's own `_get_values`, but a flag given '--' as its value (`--out=--`) is a
    wrong flag: argparse (Python 3.11) drops the '--' and hands the flag an empty list, which
    no command expects (it crashed as an error of the command)."""
    if arg_strings == ["--"] and action.option_strings and action.nargs in (None, "?"):
        parser.error(
            f"argument {'/'.join(action.option_strings)}: expected one argument, not "
            f"'--' (argparse's end of the flags; a file named -- is ./--)"
        )
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
    return ArgumentParser(
        prog=prog,
        description=description,
        epilog=OVERRIDES_EPILOG,
        usage=f"{prog} [-h] [GROUP=OPTION | KEY=VALUE ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def overrides_of(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> list[str]:
    """The config overrides of a command line (`sys.argv[1:]` when `argv` is None), after its
    parser has taken its flags (and answered --help)."""
    return parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))[1]
