"""Docs that cannot go stale: every command of README.md and docs/*.md runs here or is marked
illustrative, and the facts the docs print (cell counts, model lists, batch sizes, config
excerpts) are the code's.

What a command is: in a ```bash block, every line that is not a comment (a line ending in `\\`
continues on the next); in any other block but yaml/python, every line after a `$ ` prompt, or,
in a block without prompts, every line that starts with a program (`python`, `.venv/bin/...`,
`distbench`, `pip`, `bash`, `mlflow`); in the prose, a code span `python -m harness...` with an
override and no placeholder. The lines after a prompted command, up to the next prompt, are its
documented output.

What "runs here" means, per kind of command (all in this process, in an empty working directory
and with an empty $HOME, so that `outputs/` is a fresh one; nothing trains, so no size needs
shrinking):

- `python -m harness ...` (or `distbench ...`) that trains: its `--dry-run`
  (`launchers.hydra_main.check_hydra_main`), which composes and validates every cell exactly as
  the real command does before its first cell, and lists them. That is where a doc command goes
  stale (a renamed key, group, option or sweep; a cell that no longer validates); training
  itself is the other tests' (test_run, test_sweeps, test_distributed, ...). The command is
  checked as written: tiny sizes appended would not make composing cheaper and could make a
  valid command invalid (a batch larger than a tiny dataset). A command that names no cluster (a
  SLURM launcher or CUDA hardware) must be able to run every cell on this machine. A sweep of
  more than MAX_COMPOSED cells (MAX_LISTED for a dry run the doc shows) is counted through
  Hydra's basic sweeper (`_sweep_cells`) and only its first and last cell composed and
  validated: composing takes ~0.1 CPU-s a cell (the thesis grid's 480: ~50 s), and
  test_dry_run composes the flagship's 60 cells and a slice of the grid.
  When the doc shows an error after the command, the command is checked as it runs, without
  `--dry-run`, and must print that line and exit with status 2.
- `--help`, `--info`, `--cfg`, `-sc` (which run nothing): Hydra's real main.
- `harness.describe`, `harness.sync`, `harness.compliance --write-rules`: the real command.
- `harness.recommend --plans` and `--predict` (priced from data sheets, nothing measured or
  written): the real command.
- `harness.probe`, `.plan`, `.analysis`, `.recommend`, `.sweeps`: parsed by the command's own
  argument parser, its config composed and validated, and the command's own checks that need no
  measurement and no MLflow store; running them measures for minutes or needs a store of
  measured sweeps (their own tests: test_probe, test_analysis, test_recommend_*, test_sweeps).
  Optional arguments of a synopsis (`[--objective cost]`) are left out.
- `echo $?` checks the previous command's exit status against the documented one; `cd DIR`
  and `source .venv/bin/activate` are steps of a compound line (`&&`, `eval "$(...)"`).

Anything else (set-up, pip, SLURM scripts, servers, the test suite itself, commands with
elided parts) carries a visible mark: `<!-- illustrative: why -->` on the line before its code
block, or `# illustrative: why` after the command; it is not run. An unmarked command that this
module cannot run fails `test_every_doc_command_runs_here_or_is_marked_illustrative`, so a new
doc command cannot go unchecked.

The documented output is checked where this module produces it: an error line exactly; a dry
run's header, rows (every column but the predicted s/epoch) and notes; the cell names in a
training command's tables and log lines against its dry run's; `N cells` in a command's comment;
Hydra's search path and base config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import re
import shlex
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from harness.cli.bad_input import exit_on_bad_input
from harness.commands.compose import CONF_DIR, CONFIG_MODULE, compose_config
from harness.config.batch_sizes import default_batch_size
from harness.config.schema import ConfigError, validate
from harness.distributions.gpipe import TABLE_3_3
from harness.distributions.registry import register_configs, spec_of, specs
from tests.helpers import REPO_ROOT
from tests.integration.test_dry_run import Listing

ROOT = REPO_ROOT
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MARK = "illustrative:"
# Cells a sweep may have for every one to be composed here (~0.1 s each): a dry run the doc
# shows is composed whole, a training command's sweep only when it is small (its table's
# names are checked against it).
MAX_LISTED, MAX_COMPOSED = 64, 4

FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
MARK_BEFORE = re.compile(r"<!--\s*illustrative:\s*(.+?)\s*-->")
PROGRAM = re.compile(r"^(\.venv/bin/|python|distbench|pip |bash |mlflow )")
NOT_SHELL = {"yaml", "yml", "python", "py", "json", "toml", "ini"}
ERROR_PREFIX = "distbench: invalid"
INLINE = re.compile(r"`((?:\.venv/bin/)?python -m harness[^`]*)`")
PLACEHOLDER = re.compile(r"\.\.\.|<|\[|\b[A-Z][A-Z_]*\b")


# --- the docs' commands ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of its first line after the fence
    lang: str
    lines: tuple[str, ...]
    mark: str | None  # why it is illustrative, from a comment on the line before its fence


@dataclasses.dataclass(frozen=True)
class DocCommand:
    path: Path
    line: int
    text: str  # as typed: no prompt, no trailing comment, continuation lines joined
    comment: str
    output: tuple[str, ...]
    mark: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found, number = [], 0
    while number < len(lines):
        opened = FENCE.match(lines[number])
        if opened is None:
            number += 1
            continue
        end = next(
            j for j in range(number + 1, len(lines)) if lines[j].strip().startswith(opened.group(1))
        )
        before = next((line for line in reversed(lines[:number]) if line.strip()), "")
        mark = MARK_BEFORE.search(before)
        found.append(
            Block(
                path,
                number + 2,
                opened.group(2).lower(),
                tuple(lines[number + 1 : end]),
                mark.group(1) if mark else None,
            )
        )
        number = end + 1
    return found


def split_comment(text: str) -> tuple[str, str]:
    """(the command, its trailing `# comment`), a `#` in quotes or inside a word not counting."""
    quote = ""
    for index, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or text[index - 1].isspace()):
            return text[:index].strip(), text[index + 1 :].strip()
    return text.strip(), ""


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """(line number, text) with continuation lines (ending in a backslash) joined."""
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for offset, line in enumerate(block.lines):
        if pending is not None:
            line = pending[1] + " " + line.strip()
        start = pending[0] if pending is not None else block.line + offset
        pending = None
        if line.rstrip().endswith("\\"):
            pending = (start, line.rstrip()[:-1].rstrip())
        else:
            joined.append((start, line))
    if pending is not None:
        joined.append(pending)
    return joined


def block_commands(block: Block) -> list[DocCommand]:
    if block.lang in NOT_SHELL:
        return []
    lines = logical_lines(block)
    prompted = any(text.lstrip().startswith("$ ") for _, text in lines)
    shell = block.lang in ("bash", "sh", "shell", "console")
    found: list[tuple[int, str, list[str]]] = []
    for number, text in lines:
        stripped = text.strip()
        if prompted:
            is_command = stripped.startswith("$ ")
            stripped = stripped[2:]
        elif shell:
            is_command = bool(stripped) and not stripped.startswith("#")
        else:
            is_command = PROGRAM.match(stripped) is not None
        if is_command:
            found.append((number, stripped, []))
        elif found and prompted:
            found[-1][2].append(text.rstrip())
    commands = []
    for number, text, output in found:
        command, comment = split_comment(text)
        own = comment.split(MARK, 1)[1].strip() if MARK in comment else None
        commands.append(
            DocCommand(block.path, number, command, comment, tuple(output), own or block.mark)
        )
    return commands


def inline_commands(path: Path) -> list[DocCommand]:
    """`python -m harness...` code spans of the prose that are whole commands (an override,
    no placeholder)."""
    lines = path.read_text().splitlines()
    inside, prose = False, []
    for line in lines:
        if FENCE.match(line):
            inside = not inside
        prose.append("" if inside or FENCE.match(line) else line)
    text = "\n".join(prose)
    found = []
    for span in INLINE.finditer(text):
        command = " ".join(span.group(1).split())
        if "=" not in command or PLACEHOLDER.search(command):
            continue
        after = text[span.end() : span.end() + 200]
        mark = MARK_BEFORE.match(after.lstrip())
        found.append(
            DocCommand(
                path,
                text[: span.start()].count("\n") + 1,
                command,
                "",
                (),
                mark.group(1) if mark else None,
            )
        )
    return found


def doc_commands() -> list[DocCommand]:
    return [
        command
        for path in DOCS
        for found in ([c for b in blocks(path) for c in block_commands(b)], inline_commands(path))
        for command in found
    ]


COMMANDS = doc_commands()


# --- running them ------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    status: int
    out: str
    err: str
    cells: int | None = None  # cells a harness command runs
    listing: Listing | None = None  # its dry run, where every cell was composed
    ran: bool = True  # the command itself ran (not only its arguments and config checked)

    @property
    def first_error(self) -> str:
        lines = self.err.strip().splitlines()
        return lines[0] if lines else ""


def call(function: Callable[[], object], argv0: str, args: Sequence[str]) -> Outcome:
    """`function()` as the command `argv0 args` (sys.argv), its stdout, stderr and exit status."""
    out, err = io.StringIO(), io.StringIO()
    saved, on_sigterm = sys.argv, signal.getsignal(signal.SIGTERM)  # `distbench` sets its own
    sys.argv = [argv0, *args]
    status = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            returned = function()
        status = returned if isinstance(returned, int) else 0
    except SystemExit as ended:
        status = ended.code if isinstance(ended.code, int) else 1
    finally:
        sys.argv = saved
        signal.signal(signal.SIGTERM, on_sigterm)
    return Outcome(status, out.getvalue(), err.getvalue())


def bad_input_exits(function: Callable[[], object]) -> Callable[[], object]:
    def guarded() -> object:
        with exit_on_bad_input():
            return function()

    return guarded


HYDRA_ONLY = {
    "--help",
    "-h",
    "--hydra-help",
    "--info",
    "-i",
    "--cfg",
    "-c",
    "--shell-completion",
    "-sc",
}


def sweep_cells(args: Sequence[str]) -> tuple[Any, Any, list[list[str]] | None]:
    """(Hydra, the master config, every cell's overrides) as `python -m harness args` lists
    them; None for a single run."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from launchers.hydra_main import _sweep_cells

    parsed = get_args_parser().parse_args([arg for arg in args if arg != "--dry-run"])
    register_configs()
    hydra = GlobalHydra.instance().hydra
    assert hydra is not None
    mode = hydra.get_mode(config_name="config", overrides=parsed.overrides)
    if not (parsed.multirun or mode == RunMode.MULTIRUN):
        return hydra, None, None
    master, jobs = _sweep_cells(hydra, parsed.overrides)
    return hydra, master, jobs


@contextlib.contextmanager
def hydra_context() -> Iterator[None]:
    from hydra import initialize_config_module

    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        yield


def may_sweep(args: Sequence[str]) -> bool:
    """Whether `python -m harness args` may be a sweep: `-m`, or an override that may set
    `hydra.mode=MULTIRUN` (only conf/sweep/'s files do). A single run is composed once, by
    its dry run."""
    return any(
        arg in ("-m", "--multirun") or "sweep" in arg or arg.startswith(("hydra", "+hydra"))
        for arg in args
    )


@functools.cache
def harness_dry_run(argv0: str, args: tuple[str, ...]) -> Outcome:
    """The cells of `argv0 args`, composed and validated (listed, up to a limit)."""
    from launchers import cells
    from launchers.hydra_main import check_hydra_main

    with hydra_context():
        # Counting the cells composes the command's config once more: only a sweep needs it.
        hydra, master, jobs = sweep_cells(args) if may_sweep(args) else (None, None, None)
        limit = MAX_LISTED if "--dry-run" in args else MAX_COMPOSED
        if jobs is not None and len(jobs) > limit:

            def first_and_last() -> None:
                for number in (0, len(jobs) - 1):
                    validate(cells.cell_config(hydra.config_loader, master, jobs[number], number))

            outcome = call(bad_input_exits(first_and_last), argv0, args)
            outcome.cells, outcome.ran = len(jobs), False
            return outcome
    listed = [*args, "--dry-run"] if "--dry-run" not in args else list(args)
    outcome = call(lambda: check_hydra_main(listed), argv0, args)
    outcome.ran = False
    if outcome.status == 0:
        outcome.listing = Listing.parse(outcome.out)
        outcome.cells = len(outcome.listing.rows)
    return outcome


def run_harness(argv0: str, args: Sequence[str], wants_error: bool) -> Outcome:
    from harness.__main__ import cli
    from launchers.config_files import config_files_read_once
    from launchers.hydra_main import check_hydra_main

    if HYDRA_ONLY & set(args):
        return call(cli, argv0, args)
    # As the command checks its cells (launchers.hydra_main.run_hydra_main): each config file
    # read once for all of its compositions.
    with config_files_read_once():
        if wants_error:  # as the command runs: checked before anything starts
            return call(bad_input_exits(lambda: check_hydra_main(list(args))), argv0, args)
        return harness_dry_run(argv0, tuple(args))


def checked_config(overrides: Sequence[str]) -> Any:
    return validate(compose_config(list(overrides)))


def run_plan(args: Sequence[str]) -> None:
    config = checked_config(args)
    if spec_of(config).stage_planner is None:
        raise ConfigError(f"distribution={config.distribution.name} has no stage plan")


def run_probe(args: Sequence[str]) -> None:
    config = validate(compose_config(list(args), with_hydra=True))
    if config.hardware.world_size < 2:
        raise ConfigError(f"hardware={config.hardware.name}: one worker, nothing to probe")


def run_analysis(args: Sequence[str]) -> None:
    from harness.commands.facts_options import command_parser

    _, overrides = command_parser("python -m harness.analysis", None).parse_known_args(args)
    checked_config(overrides)


def run_recommend(args: Sequence[str]) -> None:
    from harness import recommend

    flags, overrides = recommend.parse_args(args)
    if flags.plans or flags.predict:  # priced from data sheets in a second: the real command
        from harness.commands.plans import predict_one, rank_plans

        recommend._check_plan_flags(flags)
        with contextlib.redirect_stdout(io.StringIO()):
            if flags.predict:
                predict_one(overrides)
            else:
                rank_plans(overrides, flags.top, flags.json)
        return
    # as the command validates it: what fits is its answer, not bad input
    config = validate(compose_config(list(overrides)), weights_must_fit=False)
    recommend._check_flags(flags, config)
    recommend.check_candidates(config, overrides)  # every candidate, before any probe


def run_sweeps(args: Sequence[str]) -> None:
    from harness.sweeps import cli

    own, overrides = cli.split_overrides(args)
    options = cli.parser().parse_args(own)
    if getattr(options, "out", None) is not None:
        cli._check_out(options.out, options.command)
    if options.command == "compare":
        cli.check_on([column for column in options.on.split(",") if column])
    checked_config(overrides)


def run_compliance(args: Sequence[str]) -> object:
    from harness import compliance

    return compliance.main(list(args))


def run_describe(args: Sequence[str]) -> None:
    from harness import describe

    describe.main(list(args))


def run_sync(args: Sequence[str]) -> object:
    from harness import sync

    return sync.main(list(args))


# module -> what runs it here (bad input: one line, exit status 2, as the command does)
HELPERS: dict[str, Callable[[Sequence[str]], object]] = {
    "harness.describe": run_describe,
    "harness.plan": run_plan,
    "harness.probe": run_probe,
    "harness.analysis": run_analysis,
    "harness.recommend": run_recommend,
    "harness.sweeps": run_sweeps,
    "harness.sync": run_sync,
    "harness.compliance": run_compliance,
}


RUN_FOR_REAL = {"harness.describe", "harness.sync", "harness.compliance"}


@functools.cache
def helper_checked(name: str, args: tuple[str, ...]) -> Outcome:
    """What HELPERS[name] answers for `args` (not run for real: its arguments parsed, its
    configs composed and checked, which depends on nothing but them). Several docs show the
    same command (a recommendation's composes every candidate, seconds): checked once."""
    outcome = call(bad_input_exits(lambda: HELPERS[name](args)), f"python -m {name}", args)
    outcome.ran = False
    return outcome


def program(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(module or program, its arguments): `python -m harness.x` and `distbench-x` alike."""
    name = Path(argv[0]).name
    if name.startswith("python") and len(argv) > 2 and argv[1] == "-m":
        return argv[2], list(argv[3:])
    if name == "distbench" or name.startswith("distbench-"):
        return "harness" + name[len("distbench") :].replace("-", "."), list(argv[1:])
    return name, list(argv[1:])


def without_optional(text: str) -> str:
    """A synopsis' command without its optional `[...]` arguments."""
    return re.sub(r"\s*\[[^\]=]*(?:=[^\]]*)?\]", "", text) if " [" in text else text


def parts(text: str, home: Path) -> list[list[str]]:
    """The simple commands of a line (`a && b`; `eval "$(c)"` is c), $HOME etc. expanded."""
    for name, value in (("HOME", home), ("PWD", Path.cwd()), ("TMPDIR", home / "tmp")):
        text = text.replace(f"${name}", str(value)).replace(f"${{{name}}}", str(value))
    words = shlex.split(without_optional(text))
    found: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            found.append([])
        else:
            found[-1].append(word)
    expanded = []
    for simple in found:
        if simple[:1] == ["eval"] and simple[1].startswith("$(") and simple[1].endswith(")"):
            simple = shlex.split(simple[1][2:-1])
        expanded.append(simple)
    return expanded


class NotRunHere(Exception):
    """A command this module has no way to run."""


def run_simple(argv: Sequence[str], wants_error: bool, previous: Outcome | None) -> Outcome:
    name, args = program(argv)
    if name == "harness":
        argv0 = "distbench" if Path(argv[0]).name == "distbench" else "harness/__main__.py"
        return run_harness(argv0, args, wants_error)
    if name in RUN_FOR_REAL:
        helper = HELPERS[name]
        return call(bad_input_exits(lambda: helper(args)), f"python -m {name}", args)
    if name in HELPERS:
        return helper_checked(name, tuple(args))
    if name == "echo" and args == ["$?"]:
        assert previous is not None, "echo $? with no command before it"
        return Outcome(0, f"{previous.status}\n", "")
    if name == "cd" or (name == "source" and args == [".venv/bin/activate"]):
        return Outcome(0, "", "")
    raise NotRunHere(shlex.join(argv))


def run_line(command: DocCommand, home: Path, previous: Outcome | None) -> Outcome:
    wants_error = bool(command.output) and command.output[0].startswith(ERROR_PREFIX)
    outcome = None
    for simple in parts(command.text, home):
        outcome = run_simple(simple, wants_error, previous)
        if outcome.status != 0:
            break
    assert outcome is not None
    return outcome


def runnable(command: DocCommand) -> bool:
    """Whether this module can run the command: programs it knows, no elided or placeholder
    argument (`...`, `<TAB>`), a compliance check only where it needs no measured cell."""
    try:
        simple = parts(command.text, Path("/home"))
    except ValueError:  # unbalanced quotes: not a shell command
        return False
    known = {"harness", *HELPERS, "echo", "cd", "source"}
    for argv in simple:
        name, args = program(argv)
        if name not in known or any(arg == "..." or re.search(r"<.*>", arg) for arg in args):
            return False
        if name == "harness.compliance" and "--write-rules" not in args:
            return False  # a cell's logs: test_mllog checks them
    return True


# --- what the docs say the output is -----------------------------------------------------------

ROW = re.compile(r"^\s*(\d+)\s+(\S.*?)\s{2,}(ok|failed|oom|timeout)\s")
LOG_CELL = re.compile(r" - (\S.*?): [\d.]+ s/epoch")
FASTEST = re.compile(r"fastest '(.+?)'")
SUMMARY = re.compile(r"(\d+) cell\(s\) ok, (\d+) failed")
CELLS_COMMENT = re.compile(r"(\d+) cells")
FIT_NOTES = ("s/epoch predicted", "predicted training time")


def check_dry_run_output(command: DocCommand, outcome: Outcome) -> None:
    assert outcome.listing is not None, "a dry run lists its cells"
    shown = [line for line in command.output if line.strip() != "..."]
    if not shown:
        return
    documented = Listing.parse("\n".join(shown))
    assert documented.header == outcome.listing.header
    for row in documented.rows:
        actual = outcome.listing.rows[int(row["#"])]
        assert {k: v for k, v in row.items() if k != "s/epoch"} == {
            k: v for k, v in actual.items() if k in row and k != "s/epoch"
        }, row["#"]
    # Predictions need an analysis of the hardware, which the doc's machine had.
    predicted = FIT_NOTES + (("no prediction",) if "s/epoch" in shown[1] else ())
    assert [note for note in documented.notes if not note.startswith(predicted)] == [
        note for note in outcome.listing.notes if not note.startswith(predicted)
    ]


def check_cell_names(command: DocCommand, outcome: Outcome) -> None:
    """The run names a training command's output shows are its cells' (from its dry run)."""
    if outcome.listing is None:
        return
    names = [row["cell"] for row in outcome.listing.rows]
    for line in command.output:
        if (row := ROW.match(line)) is not None:
            assert names[int(row.group(1))] == row.group(2), line
        for pattern in (LOG_CELL, FASTEST):
            if (named := pattern.search(line)) is not None:
                assert named.group(1) in names, line
        if (summary := SUMMARY.search(line)) is not None:
            assert int(summary.group(1)) + int(summary.group(2)) == len(names), line


def check_output(command: DocCommand, outcome: Outcome) -> None:
    output = [line for line in command.output if line.strip()]
    if (counted := CELLS_COMMENT.search(command.comment)) is not None:
        assert outcome.cells == int(counted.group(1)), f"the command runs {outcome.cells} cells"
    if output and output[0].startswith(ERROR_PREFIX) and (outcome.ran or outcome.status):
        assert outcome.status == 2, outcome.out[-2000:] + outcome.err[-2000:]
        assert outcome.first_error == output[0]
        return
    assert outcome.status == 0, outcome.err[-3000:]
    if "--dry-run" in command.text.split():
        check_dry_run_output(command, outcome)
    elif outcome.listing is not None:
        check_cell_names(command, outcome)
        assert "can run" not in outcome.listing.rows[0] or elsewhere(command), (
            "the command names no cluster, and some of its cells cannot run here: "
            + " ".join(outcome.listing.notes)
        )
    elif output and outcome.ran:  # a command that ran: the lines it printed, in order
        printed = {
            line.rstrip()
            for line in (outcome.err + outcome.out).replace(str(Path.cwd()), "$PWD").splitlines()
        }
        for line in output:
            assert "..." in line or line.rstrip() in printed, line


def elsewhere(command: DocCommand) -> bool:
    """Whether the command is meant for a cluster (SLURM, or GPUs this machine may lack)."""
    return bool(
        re.search(
            r"hydra/launcher=(?!submitit_local|serial_local)|hardware=("
            r"titanrtx|h100)|\+sweep=(imagenet_resnet|thesis_grid)",
            command.text,
        )
    )


# --- the tests ---------------------------------------------------------------------------------

RUN = [c for c in COMMANDS if c.mark is None and runnable(c)]


def test_every_doc_command_runs_here_or_is_marked_illustrative() -> None:
    unmarked = [f"{c.where}: {c.text}" for c in COMMANDS if c.mark is None and not runnable(c)]
    assert not unmarked, (
        "doc commands that no test runs; run them in tests/meta/test_docs.py or "
        f"mark them `<!-- {MARK} why -->`:\n" + "\n".join(unmarked)
    )
    assert len(RUN) > 50  # the parser still finds the docs' commands


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty $HOME holding the launcher configs the docs write under ~/."""
    root = tmp_path_factory.mktemp("home")
    for path in DOCS:
        for block in blocks(path):
            first = block.lines[0] if block.lines else ""
            if block.lang in ("yaml", "yml") and first.startswith("# ~/"):
                target = root / first[4:].split(",")[0].split()[0]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text("\n".join(block.lines) + "\n")
    return root


@pytest.fixture
def in_empty_dir(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
    return work


PREVIOUS: dict[tuple[Path, int], Outcome] = {}  # a block's last outcome, for `echo $?`


@pytest.mark.parametrize("command", RUN, ids=[c.where for c in RUN])
def test_doc_command(command: DocCommand, in_empty_dir: Path, home: Path) -> None:
    previous = next(
        (
            PREVIOUS[key]
            for key in sorted(PREVIOUS, reverse=True)
            if key[0] == command.path and key[1] < command.line
        ),
        None,
    )
    outcome = run_line(command, home, previous)
    PREVIOUS[(command.path, command.line)] = outcome
    check_output(command, outcome)


# --- facts the docs print ----------------------------------------------------------------------


def cell_count(*args: str) -> int:
    with hydra_context():
        _, _, jobs = sweep_cells(args)
    assert jobs is not None
    return len(jobs)


@dataclasses.dataclass(frozen=True)
class Fact:
    path: str
    pattern: str  # one group: the number the doc prints
    expected: Callable[[], int]


FLAGSHIP = ("+sweep=imagenet_resnet",)
CELL_FACTS = (
    Fact("README.md", r"`\+sweep=imagenet_resnet` \((\d+) cells", lambda: cell_count(*FLAGSHIP)),
    Fact(
        "README.md",
        r"`\+sweep=thesis_grid` \((\d+) cells",
        lambda: cell_count("+sweep=thesis_grid"),
    ),
    Fact(
        "docs/sweeps.md",
        r"That is (\d+) cells per network",
        lambda: cell_count(*FLAGSHIP, "network=resnet18"),
    ),
    Fact("docs/sweeps.md", r"cells per network, (\d+) in all", lambda: cell_count(*FLAGSHIP)),
    Fact(
        "docs/sweeps.md",
        r"is the same (\d+) cells for every dataset",
        lambda: cell_count(*FLAGSHIP, "network=resnet18"),
    ),
    Fact("docs/sweeps.md", r"MobileNetV2\): (\d+) cells", lambda: cell_count("+sweep=thesis_grid")),
    Fact("docs/sweeps.md", r"its (\d+) ImageNet x ResNet cells", lambda: cell_count(*FLAGSHIP)),
    Fact(
        "docs/sweeps.md",
        r"runs that workload's (\d+) cells",
        lambda: cell_count("+sweep=thesis_grid", "dataset=highres", "network=resnet152"),
    ),
    Fact("docs/sweeps.md", r"the same (\d+) cells list without", lambda: cell_count(*FLAGSHIP)),
    Fact("docs/sweeps.md", r"lists its (\d+) cells", lambda: cell_count("+sweep=thesis_grid")),
    Fact(
        "docs/performance-models.md",
        r"for a fifth, (\d+) cells",
        lambda: cell_count("+sweep=calibrate_local", "network=resnet50"),
    ),
    Fact(
        "docs/performance-models.md",
        r"every model \((\d+) cells",
        lambda: cell_count("+sweep=calibrate_local_lm"),
    ),
)


@pytest.mark.parametrize("fact", CELL_FACTS, ids=[f"{f.path}:{f.pattern}" for f in CELL_FACTS])
def test_numbers_the_docs_print_are_the_code(fact: Fact) -> None:
    found = re.findall(fact.pattern, (ROOT / fact.path).read_text().replace("\n", " "))
    assert found, f"{fact.path} no longer says {fact.pattern!r}: update this fact"
    assert {int(number) for number in found} == {fact.expected()}


def model_options() -> list[str]:
    """The distribution models a user can choose: conf/distribution/*.yaml."""
    return sorted(path.stem for path in (CONF_DIR / "distribution").glob("*.yaml"))


def test_the_docs_list_every_distribution_model() -> None:
    readme = (ROOT / "README.md").read_text()
    (models,) = re.findall(r"^- Distribution models: (.*?)\n(?=- )", readme, re.M | re.S)
    assert set(specs()) <= set(re.findall(r"`(\w+)`", models))
    completions = []  # what <TAB> offers: the rest of the line, else the next line
    for path in DOCS:
        lines = path.read_text().splitlines()
        completions += [
            line.split("<TAB>", 1)[1] or lines[number + 1]
            for number, line in enumerate(lines)
            if "distbench distribution=<TAB>" in line
        ]
    assert len(completions) >= 2
    for offered in completions:
        assert re.findall(r"distribution=(\w+)", offered) == model_options()
    config = (ROOT / "docs" / "config.md").read_text()
    (row,) = [line for line in config.splitlines() if line.startswith("| `distribution` |")]
    assert set(re.findall(r"`(\w+)`", row.split("|")[2])) == set(model_options())


def test_the_flagship_table_is_conf_sweep_scaling() -> None:
    """docs/sweeps.md's model-by-workers table holds every option of conf/sweep/scaling/."""
    layouts: dict[str, set[str]] = {}
    for path in (CONF_DIR / "sweep" / "scaling").glob("*.yaml"):
        option = OmegaConf.load(path)
        (model,) = [
            entry["override /distribution"]
            for entry in option.defaults
            if "override /distribution" in entry
        ]
        nodes, per_node = option.hardware.nodes, option.hardware.workers_per_node
        shown = "1" if model == "sequential" else f"{nodes * per_node} ({nodes}x{per_node})"
        layouts.setdefault(model, set()).add(shown)
    sweeps = (ROOT / "docs" / "sweeps.md").read_text()
    table = sweeps.split("| model | workers", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    documented: dict[str, set[str]] = {}
    for line in table:
        models, workers = line.strip("|").split("|")[:2]
        shown = {
            re.sub(r"\s+", " ", w.strip())
            for w in re.split(r",(?![^(]*\))", workers.split(":")[0].split(" (the")[0])
        }
        for model in models.split(","):
            documented[model.strip()] = shown
    assert documented == layouts


def test_the_default_batch_sizes_the_docs_print_are_table_3_3() -> None:
    """docs/config.md's rows of `distribution.batch_size` and `.micro_batches` give Table 3.3's
    defaults per dataset (mnist, cifar10, imagenet, highres) as the code has them."""
    rows = {
        line.split("|")[1].strip(): line
        for line in (ROOT / "docs" / "config.md").read_text().splitlines()
        if line.startswith("| `distribution.")
    }
    datasets = ("mnist", "cifar10", "imagenet", "highres")
    per_worker = ", ".join(f"{d} {default_batch_size(d)}" for d in datasets)
    pipeline = ", ".join(str(TABLE_3_3[d].batch_size) for d in datasets)
    micro = ", ".join(str(TABLE_3_3[d].micro_batches) for d in datasets)
    assert f"per worker ({per_worker};" in rows["`distribution.batch_size`"]
    assert f"whole pipeline batch ({pipeline};" in rows["`distribution.batch_size`"]
    assert f"({micro};" in rows["`distribution.micro_batches`"]


def test_config_excerpts_are_the_files() -> None:
    """A yaml block headed `# conf/...yaml` shows what that file holds."""
    checked = 0
    for path in DOCS:
        for block in blocks(path):
            first = block.lines[0] if block.lines else ""
            if block.lang not in ("yaml", "yml") or not first.startswith("# conf/"):
                continue
            shown = yaml.safe_load("\n".join(block.lines))
            actual = yaml.safe_load((ROOT / first[2:].split()[0]).read_text())
            assert contains(actual, shown), f"{path.name}:{block.line}"
            checked += 1
    assert checked >= 2


def contains(actual: object, shown: object) -> bool:
    if isinstance(shown, dict):
        return isinstance(actual, dict) and all(
            key in actual and contains(actual[key], value) for key, value in shown.items()
        )
    return actual == shown


def test_python_snippets_import_what_they_name() -> None:
    checked = 0
    for path in DOCS:
        for block in blocks(path):
            if block.lang not in ("python", "py"):
                continue
            source = "\n".join(block.lines)
            compile(source, f"{path.name}:{block.line}", "exec")
            for module, names in re.findall(r"^from ([\w.]+) import (.+)$", source, re.M):
                imported = __import__(module, fromlist=["_"])
                for name in names.split(","):
                    assert hasattr(imported, name.strip()), f"{path.name}: {module}.{name}"
            checked += 1
    assert checked >= 2
