"""A fuzzer of the commands: drawn command lines through each command's REAL entry
point (`python -m <module>`, runpy, as tests/faults/test_bad_input.py's table runs its rows).
Each draw is one command and one or two hostile parts on top of a tiny valid command line: a config
override over every field of every group (tests/fuzz/test_config.py's KEYS and VALUES), or any
flag any of the commands' parsers declares, with values of the wrong type, out of range,
non-finite, empty, huge, with path separators, `..`, /proc, absolute paths outside the root,
newlines, NUL and non-ASCII (also bytes that are not UTF-8, as a shell passes them).

Before a draw runs, it is judged in this process with the command's own parser and checks
(compose + validate, as test_fuzz_config does, and what the command checks before it works):
bad input must end with exit status 2, ONE line on stderr starting 'distbench: ', no traceback
and nothing written; valid input is run only where that is cheap and writes nothing
(`python -m harness` with --dry-run, describe, plan, --help, `compliance --write-rules` into the
temporary root) and must exit 0 without a traceback; valid input that would measure or write
outside the root (probe, analysis, recommend, sync, sweeps with a store) is not run (`assume`).
Every draw runs with its working directory, HOME, TMPDIR and DISTBENCH_CACHE_DIR inside a
temporary root; no file may appear outside it (the root's ancestors, the repository, /tmp and
the user's home are listed before and after: a name like ../../escaped lands there).

The whole profile runs in ONE subprocess (a fresh interpreter per draw costs ~4 s of imports
on 2 cores): `python -m tests.fuzz.test_commands ROOT DRAWS` writes ROOT/report.json. The short
profile runs in the suite; the long one is a benchmark (tests/benchmarks/
test_fuzz_commands_long.py, `-m perf`). What the fuzzer found is kept below as `@example`s."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, assume, example, given, settings
from hypothesis import strategies as st

from harness.cli.bad_input import BAD_INPUT_ERRORS, bad_input_message
from harness.commands.compose import CONF_DIR, compose_config
from harness.commands.dryrun import DRY_RUN_FLAG
from harness.config.schema import ConfigError, DistbenchConfig, validate
from tests.fuzz.test_config import BASE, KEYS, VALUES
from tests.helpers import REPO_ROOT
from tests.in_process import refusal_broken, run_in_process

# --- The commands and their flags ---------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """One argument a command's parser declares: `option` ('' for a positional argument),
    whether it takes a value, and the values it chooses from."""

    option: str
    takes_value: bool
    choices: tuple[str, ...] = ()


def _hydra_parser() -> argparse.ArgumentParser:
    """`python -m harness`'s flags: Hydra's parser, and --dry-run (ours: launchers.hydra_main
    takes it off the command line before Hydra's parser sees it)."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.add_argument(DRY_RUN_FLAG, action="store_true")
    return parser


def _analysis_parser() -> argparse.ArgumentParser:
    from harness.analysis.__main__ import parser

    return parser()


def _recommend_parser() -> argparse.ArgumentParser:
    from harness.recommend import parser

    return parser()


def _overrides_parser(module: str) -> Callable[[], argparse.ArgumentParser]:
    """The parser of a command of config overrides only (harness.cli.arguments.overrides_parser)."""

    def parser() -> argparse.ArgumentParser:
        import importlib

        return importlib.import_module(module).parser()

    return parser


def _compliance_parser() -> argparse.ArgumentParser:
    from harness.compliance import parser

    return parser()


def _sweeps_parser(subcommand: str) -> Callable[[], argparse.ArgumentParser]:
    def subparser() -> argparse.ArgumentParser:
        from harness.sweeps.cli import parser

        (commands,) = [
            action for action in parser()._actions if isinstance(action, argparse._SubParsersAction)
        ]
        return commands.choices[subcommand]

    return subparser


@dataclass(frozen=True)
class Command:
    """A command as the fuzzer runs it: `python -m <module> <leading> <overrides> <drawn>`,
    where `leading` is a subcommand and the arguments it needs and `overrides` a tiny valid
    config; `parser` builds the parser whose flags are drawn (None: overrides only)."""

    module: str
    leading: tuple[str, ...] = ()
    overrides: tuple[str, ...] = BASE
    parser: Callable[[], argparse.ArgumentParser] | None = None


COMMANDS: dict[str, Command] = {
    "harness": Command("harness", parser=_hydra_parser),
    "harness.describe": Command("harness.describe", parser=_overrides_parser("harness.describe")),
    # a pipeline, so that valid draws make a plan (the other models are refused by plan)
    "harness.plan": Command(
        "harness.plan",
        overrides=(*BASE, "distribution=gpipe", "hardware=local_2cpu"),
        parser=_overrides_parser("harness.plan"),
    ),
    "harness.probe": Command("harness.probe", parser=_overrides_parser("harness.probe")),
    "harness.analysis": Command("harness.analysis", parser=_analysis_parser),
    "harness.recommend": Command("harness.recommend", parser=_recommend_parser),
    "harness.sync": Command("harness.sync", parser=_overrides_parser("harness.sync")),
    "harness.compliance": Command("harness.compliance", overrides=(), parser=_compliance_parser),
    "harness.sweeps export": Command(
        "harness.sweeps",
        ("export", "sweep-x", "--out", "cells.csv"),
        parser=_sweeps_parser("export"),
    ),
    "harness.sweeps compare": Command(
        "harness.sweeps", ("compare", "sweep-a", "sweep-b"), parser=_sweeps_parser("compare")
    ),
    "harness.sweeps scaling": Command(
        "harness.sweeps",
        ("scaling", "sweep-x", "--out", "plot.png"),
        parser=_sweeps_parser("scaling"),
    ),
    "harness.sweeps mlperf": Command(
        "harness.sweeps",
        ("mlperf", "sweep-x", "--out", "mlperf-results"),
        parser=_sweeps_parser("mlperf"),
    ),
}


def flags_of(command: Command) -> list[Flag]:
    """Every argument `command`'s parser declares (Hydra's overrides, drawn as settings, and
    a subcommand's selector, fixed by `leading`, left out)."""
    if command.parser is None:
        return []
    flags = []
    for action in command.parser()._actions:
        if isinstance(action, argparse._SubParsersAction) or action.dest == "overrides":
            continue
        takes_value = action.nargs != 0
        choices = tuple(str(choice) for choice in action.choices or ())
        flags += [Flag(option, takes_value, choices) for option in action.option_strings] or [
            Flag("", True, choices)
        ]
    return flags


FLAGS: dict[str, list[Flag]] = {label: flags_of(command) for label, command in COMMANDS.items()}

# --- What is drawn --------------------------------------------------------------------------

# Raw argument values (a flag's, a positional's): paths that leave the root, that cannot be
# written or hold a config, numbers out of range, empty and huge; a few valid ones too, so
# that valid flags are run as well.
RAW_SPECIAL = [
    "",
    " ",
    "0",
    "1",
    "5",
    "-1",
    "inf",
    "-inf",
    "nan",
    "1e15",
    "1e308",
    "1099511627776",
    "2**64",
    "abc",
    "a=b",
    "-",
    "--",
    "--help",
    "a_file",
    "new-dir",
    "cells.csv",
    "out.parquet",
    "plot.png",
    "plot.gif",
    "sweep-x",
    "distbench",
    "dataset,network",
    "time",
    "cost",
    "job",
    "hydra",
    "all",
    "config",
    ".",
    "..",
    "../..",
    "../../escaped",
    "../" * 8 + "escaped",
    "/",
    "/proc/x",
    "/proc/self",
    "/dev/null",
    "/tmp/distbench-fuzz-escaped",
    "/distbench-fuzz-escaped/cells.csv",
    "~",
    "~/x",
    "$HOME/x",
    "a/b",
    "a\\b",
    "x" * 300,
    "d/" * 2100,
    "é" * 200,
    "a\nb",
    "\x00",
    "caf\udce9",
    "'a'",
]
_RAW_TEXT = st.text(alphabet=st.sampled_from("ab/.\\\n\x00é中 -_:'\"$=~,\udce9"), max_size=40)
RAW_VALUES = st.one_of(
    st.sampled_from(RAW_SPECIAL),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    _RAW_TEXT,
    st.tuples(
        st.sampled_from(["x", "é", "/", "..", "a/", "../"]),
        st.integers(min_value=1, max_value=5000),
    ).map(lambda pair: pair[0] * pair[1]),
)
SETTING, FLAG = 0, 1  # a draw's parts: settings come first, as a user types them


def _setting(key: tuple[str, str], value: str) -> tuple[int, tuple[str, ...]]:
    extra, name = key
    return SETTING, (*([extra] if extra else []), f"{name}={value}")


def _flag_forms(flag: Flag) -> st.SearchStrategy[tuple[int, tuple[str, ...]]]:
    """`--flag`, `--flag=value`, `--flag value` (a value drawn from its choices or hostile),
    or a positional's value alone."""
    values = st.one_of(st.sampled_from(flag.choices), RAW_VALUES) if flag.choices else RAW_VALUES
    if not flag.option:
        return values.map(lambda value: (FLAG, (value,)))
    bare = st.just((FLAG, (flag.option,)))
    joined = values.map(lambda value: (FLAG, (f"{flag.option}={value}",)))
    if not flag.takes_value:
        return st.one_of(bare, joined)
    return st.one_of(values.map(lambda value: (FLAG, (flag.option, value))), joined, bare)


def _parts(label: str) -> st.SearchStrategy[tuple[int, tuple[str, ...]]]:
    settings_ = st.builds(_setting, st.sampled_from(KEYS), VALUES)
    # A hostile bare argument (what a stray word does to a command), or one of its flags.
    stray = RAW_VALUES.map(lambda value: (FLAG, (value,)))
    return st.one_of(settings_, stray, *map(_flag_forms, FLAGS[label]))


@dataclass(frozen=True)
class Draw:
    """One command line: `command` (a key of COMMANDS) and the drawn arguments that follow its
    tiny valid command line."""

    command: str
    args: tuple[str, ...]

    def argv(self) -> list[str]:
        """The whole command line after `python -m <module>`. An argument ends at its first NUL,
        as a process receives it (execve takes C strings)."""
        command = COMMANDS[self.command]
        return [arg.split("\x00")[0] for arg in (*command.leading, *command.overrides, *self.args)]


@st.composite
def draws(draw: st.DrawFn) -> Draw:
    label = draw(st.sampled_from(sorted(COMMANDS)))
    parts = draw(st.lists(_parts(label), min_size=1, max_size=2))
    return Draw(
        label, tuple(arg for _, args in sorted(parts, key=lambda part: part[0]) for arg in args)
    )


# --- What each command should do with a draw --------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """What a draw must end with: exit `status` (2: bad input, refused in one line and
    writing nothing; 0: valid), why, `extra` arguments it runs with (--dry-run), and where
    a valid run may write (`writes`, under the root)."""

    status: int
    why: str
    extra: tuple[str, ...] = ()
    writes: str | None = None


def _refused(why: str) -> Expect:
    return Expect(2, why)


def _parsed(
    parser: argparse.ArgumentParser, argv: Sequence[str], *, known: bool = False
) -> tuple[argparse.Namespace, list[str]] | int:
    """(flags, the rest) as the command's parser reads `argv`, or its exit status: 0 for
    --help or --version, 2 for a wrong flag."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            if known:
                return parser.parse_known_args(list(argv))
            return parser.parse_args(list(argv)), []
        except SystemExit as exit_:
            return int(exit_.code or 0)


def _composed(overrides: Sequence[str], *, with_hydra: bool = False) -> str | None:
    """The bad-input line when `overrides` do not compose (what --cfg and --help need)."""
    try:
        compose_config(overrides, with_hydra=with_hydra)
    except BAD_INPUT_ERRORS as err:
        return bad_input_message(err)
    return None


def _valid(overrides: Sequence[str], *, with_hydra: bool = False) -> DistbenchConfig | str:
    """The validated config, or the bad-input line that refuses it."""
    try:
        return validate(compose_config(overrides, with_hydra=with_hydra))
    except BAD_INPUT_ERRORS as err:
        return bad_input_message(err)


def _checked(*checks: Callable[[], object]) -> Expect | None:
    """A refusal when one of the command's own checks refuses (in order, as it runs them);
    None when all pass. A check that raises anything else is a finding: the command must
    refuse that input in one line, so it is expected to."""
    for check in checks:
        try:
            check()
        except BAD_INPUT_ERRORS as err:
            return _refused(bad_input_message(err))
        except Exception as err:  # noqa: BLE001 - a check that crashes: bad input unrefused
            return _refused(f"the command's check raised {type(err).__name__}: {err}")
    return None


def _is(test: Callable[[], bool]) -> bool:
    """`test()` of a path; False where the path cannot even be looked at (too long)."""
    try:
        return test()
    except OSError:
        return False


def _names_a_config(flags: argparse.Namespace) -> bool:
    """Whether --config-dir/-path/-name could name configs Hydra would run a cell from (then
    the draw runs with --dry-run, which refuses them). Hydra makes the directories absolute
    as os.path.abspath does, before it looks at them."""
    if flags.config_dir is not None and _is(
        lambda: os.path.isdir(os.path.abspath(flags.config_dir))
    ):
        return True
    if flags.config_path is not None and _is(
        lambda: os.path.isfile(
            os.path.join(os.path.abspath(REPO_ROOT / "harness" / flags.config_path), "config.yaml")
        )
    ):
        return True
    return flags.config_name is not None and _is((CONF_DIR / f"{flags.config_name}.yaml").is_file)


def _too_long(path: str) -> bool:
    """Whether the file system cannot hold `path` (a part over NAME_MAX or the whole over
    PATH_MAX bytes)."""
    raw = path.encode("utf-8", "surrogateescape")
    return len(raw) > 4096 or any(len(part) > 255 for part in raw.split(b"/"))


def _package_missing(flags: argparse.Namespace) -> bool:
    """Whether --cfg TYPE --package KEY names a key the shown config lacks (or holds null):
    Hydra's show_cfg then says "not found"."""
    from omegaconf import OmegaConf

    if flags.package is None or flags.package == "_global_":
        return False
    first = flags.package.split(".")[0]
    if (first == "hydra") != (flags.cfg == "hydra") and flags.cfg != "all":
        return True
    if flags.cfg == "hydra" and flags.package.split(".")[:2] in (
        ["hydra", "help"],
        ["hydra", "hydra_help"],
    ):
        return True
    cfg = compose_config(flags.overrides, with_hydra=True)
    return OmegaConf.select(cfg, flags.package, throw_on_resolution_failure=False) is None


def _hydra_refuses(flags: argparse.Namespace) -> str | None:
    """What Hydra itself refuses of its flags once it runs (hydra._internal.utils._run_hydra,
    hydra.main, Hydra.shell_completion), in its order; None when it takes them."""
    if flags.help:
        return None
    if flags.resolve and flags.cfg is None:
        return "--resolve needs --cfg or --help"
    if flags.hydra_help:
        # Hydra's own help composes no primary config: the app's overrides cannot apply
        return "--hydra-help with the config's overrides" if flags.overrides else None
    commands = (
        flags.run,
        flags.multirun,
        flags.cfg is not None,
        flags.shell_completion,
        flags.info is not None,
    )
    if sum(map(bool, commands)) > 1:
        return "one of --run, --multirun, --cfg, --info, --shell-completion"
    if flags.experimental_rerun is not None:
        return "a rerun needs a run's config.pickle"  # none in the root
    if flags.shell_completion:
        given = dict(arg.partition("=")[::2] for arg in flags.overrides)
        chosen = [key for key in ("install", "uninstall", "query") if key in given]
        if len(chosen) != 1 or given[chosen[0]] not in ("bash", "fish", "zsh"):
            return "shell completion needs install=, uninstall= or query= SHELL"
    return None


def _predict_harness(argv: list[str]) -> Expect | None:
    """`python -m harness` (launchers.hydra_main.check_hydra_main, then Hydra): a valid config
    runs with --dry-run (lists its cells, exit 0); what only shows something (--help, --cfg,
    --info) runs as typed; what Hydra refuses runs without --dry-run."""
    from hydra._internal.utils import get_args_parser

    dry = DRY_RUN_FLAG in argv
    parsed = _parsed(get_args_parser(), [arg for arg in argv if arg != DRY_RUN_FLAG])
    if isinstance(parsed, int):
        return Expect(parsed, "Hydra's parser: --version (0) or a wrong flag (2)")
    flags = parsed[0]
    if any(isinstance(value, list) for name, value in vars(flags).items() if name != "overrides"):
        return _refused("a flag given '--' as its value (argparse hands it an empty list)")
    refused = _hydra_refuses(flags)
    if refused is not None:
        return _refused(refused)
    sources = (flags.config_dir, flags.config_path, flags.config_name)
    if any(
        source and _too_long(looked_up)
        for source, looked_up in (
            (flags.config_dir, os.path.abspath(flags.config_dir or ".")),
            (flags.config_path, str(REPO_ROOT / "harness" / (flags.config_path or ""))),
            (flags.config_name, f"{flags.config_name}.yaml"),
        )
    ):
        return _refused("a config source longer than the file system holds")
    shows = (
        flags.help
        or flags.hydra_help
        or flags.info is not None
        or flags.shell_completion
        or flags.cfg is not None
    )
    if dry and (shows or any(source is not None for source in sources)):
        return _refused(f"{DRY_RUN_FLAG} with a flag that runs no cell or another config")
    if any(source is not None for source in sources):
        if _names_a_config(flags):
            return Expect(2, "another config: refused with --dry-run", (DRY_RUN_FLAG,))
        return _refused("no such config")
    if shows:
        bad = (
            None
            if flags.hydra_help or flags.shell_completion
            else _composed(flags.overrides, with_hydra=True)
        )
        if (
            bad is None
            and flags.cfg is not None
            and not (flags.help or flags.hydra_help)
            and _package_missing(flags)
        ):
            bad = "--package names no key of the config --cfg shows"
        return _refused(bad) if bad else Expect(0, "shows the config or help")
    for cell in _cells(flags.overrides) if flags.multirun else [flags.overrides]:
        config = _valid(cell, with_hydra=True)
        if isinstance(config, str):
            return _refused(config)
    return Expect(0, "valid: its cells listed", () if dry else (DRY_RUN_FLAG,))


def _cells(overrides: Sequence[str]) -> list[list[str]]:
    """A sweep's cells (`-m key=a,b`) as Hydra's basic sweeper makes them; a malformed sweep
    leaves its overrides as they are (composing them refuses them)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except BAD_INPUT_ERRORS:
        return [list(overrides)]
    return [cell for batch in BasicSweeper.split_arguments(parsed, None) for cell in batch]


def _overrides(label: str, argv: list[str]) -> list[str] | Expect:
    """The overrides of a command of overrides only, once its parser has taken --help (exit
    0) or refused a wrong flag (exit 2)."""
    parser = COMMANDS[label].parser
    assert parser is not None
    parsed = _parsed(parser(), argv, known=True)
    if isinstance(parsed, int):
        return Expect(parsed, "its parser: --help (0) or a wrong flag (2)")
    return parsed[1]


def _predict_describe(argv: list[str]) -> Expect | None:
    overrides = _overrides("harness.describe", argv)
    if isinstance(overrides, Expect):
        return overrides
    config = _valid(overrides)
    return _refused(config) if isinstance(config, str) else Expect(0, "valid: described")


def _predict_plan(argv: list[str]) -> Expect | None:
    from harness.distributions.registry import spec_of

    overrides = _overrides("harness.plan", argv)
    if isinstance(overrides, Expect):
        return overrides
    config = _valid(overrides)
    if isinstance(config, str):
        return _refused(config)
    if spec_of(config).stage_planner is None:
        return _refused("not a pipeline")
    return Expect(0, "valid: planned")


def _predict_probe(argv: list[str]) -> Expect | None:
    overrides = _overrides("harness.probe", argv)
    if isinstance(overrides, Expect):
        return overrides
    config = _valid(overrides, with_hydra=True)
    if isinstance(config, str):
        return _refused(config)
    if config.hardware.world_size < 2:
        return _refused("a probe needs 2 or more workers")
    return None  # it would measure the links


def _missing_store(config: DistbenchConfig) -> bool:
    """Whether the config's tracking store is a SQLite file that does not exist (the store
    reading commands refuse it); False for any other store (they would open it)."""
    from harness.records.mlflow_store import tracking_uri

    uri = tracking_uri(config.tracking.uri, config.run.output_dir)
    return uri.startswith("sqlite:///") and not _is(Path(uri.removeprefix("sqlite:///")).exists)


def _predict_analysis(argv: list[str]) -> Expect | None:
    from harness.cli.preflight import check_writable_dir
    from harness.predict.facts.cache import cache_for

    parsed = _parsed(_analysis_parser(), argv, known=True)
    if isinstance(parsed, int):
        return Expect(parsed, "its parser")
    flags, overrides = parsed
    config = _valid(overrides)
    if isinstance(config, str):
        return _refused(config)
    refused = _checked(
        lambda: cache_for(flags.probe_batches, probe_spread=flags.probe_spread),
        lambda: check_writable_dir("run.output_dir", config.run.output_dir),
    )
    if refused is not None:
        return refused
    return _refused("no MLflow store") if _missing_store(config) else None  # would measure


def _predict_recommend(argv: list[str]) -> Expect | None:
    from harness import recommend
    from harness.analysis.calibration import Fitted, choose_fit
    from harness.cli.preflight import check_writable_dir
    from harness.predict.facts.cache import cache_for
    from harness.profiles.hardware import profile_for

    parsed = _parsed(_recommend_parser(), argv, known=True)
    if isinstance(parsed, int):
        return Expect(parsed, "its parser")
    flags, overrides = parsed
    config = _valid(overrides)
    if isinstance(config, str):
        return _refused(config)
    root = Path(config.run.output_dir)
    found: dict[str, Any] = {}

    def fit() -> None:
        path = (
            flags.fit
            if flags.fit is not None
            else choose_fit(root, config.hardware.name, found["checked"].models)
        )
        if path is not None and not path.exists():
            raise ConfigError(f"--fit={path} is invalid: no such file")
        Fitted.load(path, config.hardware.name)

    return _checked(
        lambda: recommend._check_flags(flags, config),
        lambda: cache_for(flags.probe_batches, probe_spread=flags.probe_spread),
        lambda: found.update(checked=recommend.check_candidates(config, overrides)),
        fit,
        lambda: profile_for(config.hardware, root),
        lambda: check_writable_dir("run.output_dir", config.run.output_dir),
    )
    # None: every check passed, it would measure


def _predict_sync(argv: list[str]) -> Expect | None:
    overrides = _overrides("harness.sync", argv)
    if isinstance(overrides, Expect):
        return overrides
    config = _valid(overrides)
    if isinstance(config, str):
        return _refused(config)
    if not _is(Path(config.run.output_dir).expanduser().is_dir):
        return _refused("no output root to sync from")
    return None  # it would look for pending results there and open the store


def _predict_compliance(argv: list[str]) -> Expect | None:
    from harness.compliance import _rules_dir, log_files

    parsed = _parsed(_compliance_parser(), argv)
    if isinstance(parsed, int):
        return Expect(parsed, "its parser")
    flags = parsed[0]
    if flags.write_rules is not None:
        refused = _checked(lambda: _rules_dir(flags.write_rules))
        if refused is not None:
            return refused
        folder = flags.write_rules.resolve()
        root = Path.cwd().parent
        if (
            flags.paths
            or not folder.is_relative_to(root)
            or folder.is_relative_to(root / "capture")
        ):
            return None  # also checks logs, or writes outside the root: valid, not run
        return Expect(0, "writes the rules", writes=str(folder.relative_to(root)))
    if not flags.paths:
        return _refused("nothing to check")
    return _checked(lambda: log_files(flags.paths))  # None: it would check real files


def _predict_sweeps(argv: list[str]) -> Expect | None:
    from harness.sweeps.cli import _check_out, parser, split_overrides
    from harness.sweeps.compare import check_on

    own, overrides = split_overrides(argv)
    parsed = _parsed(parser(), own)
    if isinstance(parsed, int):
        return Expect(parsed, "its parser")
    flags = parsed[0]
    out = getattr(flags, "out", None)
    refused = _checked(
        *([lambda: _check_out(out, flags.command)] if out is not None else []),
        *(
            [lambda: check_on([c for c in flags.on.split(",") if c])]
            if flags.command == "compare"
            else []
        ),
    )
    if refused is not None:
        return refused
    config = _valid(overrides)
    if isinstance(config, str):
        return _refused(config)
    return _refused("no MLflow store") if _missing_store(config) else None  # would read it


PREDICT: dict[str, Callable[[list[str]], Expect | None]] = {
    "harness": _predict_harness,
    "harness.describe": _predict_describe,
    "harness.plan": _predict_plan,
    "harness.probe": _predict_probe,
    "harness.analysis": _predict_analysis,
    "harness.recommend": _predict_recommend,
    "harness.sync": _predict_sync,
    "harness.compliance": _predict_compliance,
    **{label: _predict_sweeps for label in COMMANDS if label.startswith("harness.sweeps ")},
}

# --- Running a draw ---------------------------------------------------------------------------

# Names distbench writes by itself (outputs, stores, indexes, its temporary directories): one
# of them new outside the root is an escape whatever the draw named.
DISTBENCH_NAMES = {
    "outputs",
    "mlflow.db",
    "mlflow.db.lock",
    "mlruns",
    "runs",
    "cells",
    "facts",
    "analysis",
    "probes",
    "hardware_profiles",
    "sweeps",
    "multirun",
    ".hydra",
    "common.yaml",
    "open_common.yaml",
    "closed_common.yaml",
    "mlperf-results",
}


@dataclass(frozen=True)
class Root:
    """The temporary root a profile runs in: `work` is each command's working directory;
    HOME, TMPDIR and DISTBENCH_CACHE_DIR point to `home`, `tmp` and `cache` beside it;
    `capture` holds the commands' stdout and stderr."""

    path: Path

    @property
    def work(self) -> Path:
        return self.path / "work"

    @property
    def capture(self) -> Path:
        return self.path / "capture"

    def environment(self) -> dict[str, str]:
        return {
            "HOME": str(self.path / "home"),
            "TMPDIR": str(self.path / "tmp"),
            "DISTBENCH_CACHE_DIR": str(self.path / "cache"),
            "PYTHONUNBUFFERED": "1",
        }

    def make(self) -> None:
        for name in ("work", "home", "tmp", "cache", "capture"):
            (self.path / name).mkdir(parents=True, exist_ok=True)
        (self.work / "a_file").write_text("not a directory\n")


def _outside(root: Root) -> dict[str, set[str]]:
    """What the directories a drawn path could escape to hold (not recursive): the root's
    ancestors, the repository, /tmp and the user's home."""
    import pwd

    folders = {*root.path.parents, REPO_ROOT, Path("/tmp"), Path(pwd.getpwuid(os.getuid()).pw_dir)}
    seen = {}
    for folder in folders:
        with contextlib.suppress(OSError):
            seen[str(folder)] = set(os.listdir(folder))
    return seen


def _escapes(
    before: dict[str, set[str]], after: dict[str, set[str]], argv: Sequence[str]
) -> tuple[list[str], list[str]]:
    """(escaped, other): new entries outside the root whose name the draw could have made (a
    part of an argument, or a name distbench writes), and the others. Other processes share
    /tmp and the repository (a test run beside this one): their new files are not the draw's."""
    parts = {part for arg in argv for part in re.split(r"[/=,\s'\"\[\]]+", arg) if part}
    escaped, other = [], []
    for folder, names in after.items():
        for name in sorted(names - before.get(folder, names)):
            ours = name in parts or name in DISTBENCH_NAMES
            (escaped if ours else other).append(str(Path(folder) / name))
    return escaped, other


def _remove(root: Path, written: Sequence[str]) -> None:
    """Undo what a run wrote under the root, so that the next draw starts from the same."""
    for name in written:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _broken(expect: Expect, outcome: dict[str, Any]) -> str | None:
    """How the run broke what `expect` says, or None."""
    if expect.status == 2:
        return refusal_broken(outcome)
    if outcome["code"] != expect.status:
        return f"exit status {outcome['code']}, not {expect.status}"
    if "Traceback" in outcome["stderr"]:
        return "printed a traceback"
    allowed = expect.writes  # relative to the root; "." is the root itself
    stray = [
        name
        for name in outcome["written"]
        if allowed is None
        or not (Path(name).is_relative_to(allowed) or Path(allowed).is_relative_to(name))
    ]
    return f"wrote {stray[:5]}" if stray else None


@dataclass
class Report:
    """What a profile ran: draws per command and outcome, and every broken promise."""

    started: float = field(default_factory=time.monotonic)
    runs: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    broken: list[dict[str, Any]] = field(default_factory=list)
    other_new_files: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "draws": sum(self.runs.values()),
            "runs": dict(self.runs),
            "skipped": dict(self.skipped),
            "broken": self.broken,
            "other_new_files": self.other_new_files[:50],
            "seconds": round(time.monotonic() - self.started, 1),
        }


def run_draw(draw: Draw, root: Root, report: Report) -> None:
    """Judge the draw, run it through its command's real entry point (or `assume` it away when
    valid but too costly), and note in `report` any promise it broke."""
    argv = draw.argv()
    with contextlib.chdir(root.work):
        try:
            expect = PREDICT[draw.command](argv)
        except Exception as err:  # noqa: BLE001 - e.g. validate() crashing: still bad input
            expect = _refused(f"judging it raised {type(err).__name__}: {err}")
    if expect is None:
        report.skipped[draw.command] += 1
    assume(expect is not None)
    assert expect is not None
    outside = _outside(root)
    outcome = run_in_process(
        COMMANDS[draw.command].module,
        [*argv, *expect.extra],
        root.work,
        root.capture,
        watched=root.path,
    )
    escaped, other = _escapes(outside, _outside(root), argv)
    _remove(root.path, [name for name in outcome["written"] if not name.startswith("(removed) ")])
    report.runs[f"{draw.command}: exit {expect.status}"] += 1
    report.other_new_files += other
    broken = _broken(expect, outcome) or (
        f"wrote outside the root: {escaped[:5]}" if escaped else None
    )
    if broken is not None:
        report.broken.append(
            {
                "draw": asdict(draw),
                "argv": [*argv, *expect.extra],
                "expected": asdict(expect),
                "broken": broken,
                "stderr": outcome["stderr"][-1500:],
            }
        )


# Found by this fuzzer, kept as regression cases: they run first in every profile.
REGRESSIONS: list[Draw] = [
    # A newline in an argument: the line quoting it was two lines
    # (harness.cli.bad_input.single_line).
    Draw("harness.describe", ("a\nb",)),
    Draw("harness.probe", ("\n~=",)),
    Draw("harness.sweeps mlperf", (" \n~='", " \n~='")),  # argparse's message quotes it
    # A name longer than the file system holds: OSError, exit 3 ("a bug?").
    Draw("harness.recommend", ("--objective", "time", "--fit=" + "." * 1000)),
    Draw("harness.sweeps mlperf", ("--out", "é" * 200)),  # harness.cli.preflight.check_writable_dir
    # ~user of no user: pathlib's RuntimeError, exit 3 (harness.cli.preflight.expand_user).
    Draw("harness.sweeps mlperf", ("--out", "~a$é中")),
    # Hydra's flags it refuses only once it runs (a ValueError, exit 3), and --config-dir=''
    # (the working directory) taken for "not given" by --dry-run (launchers.hydra_main).
    Draw("harness", ("--experimental-rerun", "/proc/x")),
    Draw("harness", ("--experimental-rerun", "")),
    Draw("harness", ("-sc",)),
    Draw("harness", ("--resolve",)),
    Draw("harness", ("-r", "-m")),
    Draw("harness", ("--config-dir=",)),
    # --package of no key: Hydra's "not found", exit 1 (launchers.hydra_main._check_package).
    Draw("harness", ("-p=" + "/" * 300, "--cfg=all")),
    # A config name longer than the file system holds: OSError in Hydra's lookup, exit 3.
    Draw("harness", ("-c", "all", "--config-name", "é" * 200)),
    # `--flag=--`: argparse gives the flag an empty list
    # (harness.cli.arguments.refuse_dashes_as_value).
    Draw("harness.sweeps mlperf", ("--out=--",)),
    # Valid, and misjudged by the fuzzer's first long profile: the rules written into the root
    # itself (`..` of the working directory) are where --write-rules says.
    Draw("harness.compliance", ("--write-rules=..",)),
]


def fuzz(root: Root, draws_: int) -> Report:
    """Run `draws_` derandomized draws (and the regression cases) in this process."""
    report = Report()

    @settings(
        max_examples=draws_,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(draw=draws())
    def property_(draw: Draw) -> None:
        run_draw(draw, root, report)

    for case in REGRESSIONS:
        property_ = example(draw=case)(property_)
    property_()
    return report


def fuzz_in_subprocess(root: Path, draws_: int, timeout_s: float) -> dict[str, Any]:
    """A profile of `draws_` draws in one subprocess, in `root`: its report."""
    place = Root(root)
    place.make()
    env = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.test_commands", str(root), str(draws_)],
        cwd=REPO_ROOT,
        env={**env, **place.environment()},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((root / "report.json").read_text())


def assert_kept_every_promise(report: dict[str, Any]) -> None:
    print(
        f"{report['draws']} command lines run in {report['seconds']} s: {report['runs']}; "
        f"valid but not run: {report['skipped']}"
    )
    assert not report["broken"], "\n".join(
        f"{case['broken']}: python -m {COMMANDS[case['draw']['command']].module} "
        f"{case['argv']!r} (expected {case['expected']['status']}: {case['expected']['why']})"
        f"\n    {case['stderr'][-600:]}"
        for case in report["broken"]
    )


# --- The tests --------------------------------------------------------------------------------

# The suite's profile: derandomized (each run repeats the last); 600 draws and the regression
# cases take ~38 s here, ~50 s with the subprocess's start (2 cores, a test run beside it).
SHORT_DRAWS = 600


def test_drawn_command_lines_are_refused_in_one_line_or_run_as_promised(tmp_path: Path) -> None:
    report = fuzz_in_subprocess(tmp_path, SHORT_DRAWS, timeout_s=600)
    assert report["draws"] >= SHORT_DRAWS // 2
    assert_kept_every_promise(report)


def _declared_options() -> set[str]:
    """Every option string an `add_argument` call under harness/ declares, read from the
    source: a flag added to any command shows up here, fuzzed or not."""
    options = set()
    for path in (REPO_ROOT / "harness").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                options |= {
                    arg.value
                    for arg in node.args
                    if isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and arg.value.startswith("-")
                }
    return options


def test_the_fuzzer_draws_every_flag_of_every_command() -> None:
    """Every flag declared under harness/ (and Hydra's, for `python -m harness`) is drawn, and
    every command (each console script, and harness.compliance) is fuzzed: a new flag or
    command cannot be forgotten."""
    from hydra._internal.utils import get_args_parser

    drawn = {flag.option for flags in FLAGS.values() for flag in flags}
    hydra = {option for action in get_args_parser()._actions for option in action.option_strings}
    assert _declared_options() | hydra | {DRY_RUN_FLAG} <= drawn
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    modules = {target.split(":")[0].removesuffix(".__main__") for target in scripts.values()}
    assert modules | {"harness.compliance"} == {command.module for command in COMMANDS.values()}
    assert set(PREDICT) == set(COMMANDS)


if __name__ == "__main__":  # the subprocess of the tests: python -m tests.fuzz.test_commands ROOT N
    # The libraries the commands load, imported once before the first draw: what a library
    # writes as it is imported is this interpreter's, not a draw's (torch._dynamo, which
    # torchvision imports, makes its cache directory $TMPDIR/torchinductor_<user> then; the
    # first draw to load torchvision was judged to have written it). What a command writes
    # while it runs is still judged.
    import torch  # noqa: F401
    import torchvision  # noqa: F401

    _root = Root(Path(sys.argv[1]))
    _report = fuzz(_root, int(sys.argv[2]))
    (_root.path / "report.json").write_text(json.dumps(_report.to_json(), indent=1))
