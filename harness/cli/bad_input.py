"""Bad input: ONE line on stderr that names the key and what is allowed, exit status 2.

Raise `ConfigError` with the message form of `harness.config.schema`: "key=value is
invalid: allowed"; Hydra's and OmegaConf's own refusals (an unknown group option, a
misspelled key, a malformed override) are turned into the same one line here."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from typing import NoReturn, ParamSpec, TypeVar

from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from harness.config.schema import ConfigError, one_line, unknown_key

BAD_INPUT_EXIT_CODE = 2
# Exceptions that mean "the user's input is wrong", never "the program is wrong".
BAD_INPUT_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    HydraException,
    OmegaConfBaseException,
)

P = ParamSpec("P")
R = TypeVar("R")


# Where str.splitlines() ends a line: a value typed with one of these (an argument holding a
# newline) would make a message of several lines.
_LINE_BREAKS = {
    ord(char): char.encode("unicode_escape").decode()
    for char in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
}


def single_line(text: str) -> str:
    """`text` with every line break escaped as Python writes it (`\\n`): a message quoting
    what was typed stays one line, and still shows where the break was."""
    return text.translate(_LINE_BREAKS)


def bad_input_message(err: Exception) -> str:
    """The one line that explains `err` (no newline)."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        # "network/resnet19" -> "network=resnet19", as the user typed it.
        group, _, option = err.missing_cfg_file.rpartition("/")
        return single_line(
            f"{group}={option}: unknown; choose one of {', '.join(sorted(err.options))}"
        )
    if isinstance(err, ConfigError):
        return " ".join(str(err).split())
    return single_line(_unknown_key(err) or _malformed_override(err) or one_line(err))


def _unknown_key(err: Exception) -> str | None:
    """ "dataset.bogus: unknown key; allowed: name, source, ..." for a misspelled key of a
    typed (dataclass) section, else None; another model's distribution setting also says
    which models have it and the per-model form (harness.config.schema.unknown_key)."""
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
    """ "run.epochs=[1: malformed override (...)" naming the command-line argument that Hydra's
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
            return (
                f"{argument}: malformed override ({one_line(err)}); allowed: key=value, "
                f"+key=value, ~key, key=a,b,c with -m"
            )
    return None


def exit_bad_input(err: Exception, context: str = "") -> NoReturn:
    """Print `err` as one line on stderr and exit with status 2."""
    where = f" {context}" if context else ""
    print(
        f"distbench: invalid config{where}: {bad_input_message(err)}", file=sys.stderr, flush=True
    )
    sys.exit(BAD_INPUT_EXIT_CODE)


@contextlib.contextmanager
def exit_on_bad_input(context: str = "") -> Iterator[None]:
    """Turn bad input raised inside the block into one line on stderr and exit status 2;
    `context` (e.g. "in sweep cell dataset=x") goes after "invalid config"."""
    try:
        yield
    except BAD_INPUT_ERRORS as err:
        exit_bad_input(err, context)
