"""MLPerf's compliance checker on distbench's event logs:
`python -m harness.compliance <cell dir or mllog file>...`.

The installed mlperf-logging's newest training ruleset (`RULESET`) admits, in the open division
as in the closed one, only MLPerf's own benchmark names (6.1.0: flux1, llama31_8b,
llama2_70b_lora, gpt_oss_20b, deepseekv3_671b, qwen35_397b_grpo, dlrmv4), and for any other
name it looks for that benchmark's rules file, which does not exist: its command
(`python -m mlperf_logging.compliance_checker --usage training --ruleset 6.1.0 FILE`) then ends
in a FileNotFoundError traceback instead of a verdict. distbench's benchmarks (a network on an
image dataset, `harness.records.eventlog.benchmark_name`) are none of MLPerf's, and naming
one of those would be a lie.

So the check runs MLPerf's ruleset with one change, written out by `write_rules` from the
installed package's own files (nothing is copied into distbench): submission_benchmark admits
distbench's benchmark names, and no per-benchmark rules follow (MLPerf has none for them).
Every other rule is MLPerf's, as installed: the required keys and their values, the init/run
ordering, the blocks, epochs and evaluations. MLPerf's own command applies these rules too,
through its `--config` option (`mlperf_command`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from mlperf_logging.compliance_checker import mlp_compliance

from harness.cli import ArgumentParser, command
from harness.config import ConfigError, DatasetName, NetworkName
from harness.records.results import MLLOG_GLOB

USAGE = "training"
RULESET = max((path.name.removeprefix(f"{USAGE}_") for path in
               Path(mlp_compliance.__file__).parent.glob(f"{USAGE}_*.*.*")
               if path.name.removeprefix(f"{USAGE}_").replace(".", "").isdigit()),
              key=lambda version: tuple(int(part) for part in version.split(".")))
BENCHMARK_KEY = "submission_benchmark"
DIVISION_KEY = "submission_division"


def benchmark_names() -> list[str]:
    """The names `harness.records.eventlog.benchmark_name` gives the built-in networks (a user's own
    network or a zoo model adds its own label: `BENCHMARK_CHECK` admits those)."""
    return [f"{network.value}_{dataset.value}{suffix}" for network, dataset, suffix in
            itertools.product(NetworkName, DatasetName, ("", "_synthetic"))]


# The checker evaluates a rule's CHECK as a Python expression over the logged value `v`:
# a distbench name is a network label (letters, digits, '_', '-', '.'), '_', a dataset name.
# (No comprehension: the checker's names are not visible inside one.)
_DATASET_SUFFIXES = tuple(sorted(f"_{dataset.value}" for dataset in DatasetName))
BENCHMARK_CHECK = (" isinstance(v['value'], str) and v['value'].replace('_', '')"
                   ".replace('-', '').replace('.', '').isalnum() and v['value']"
                   f".removesuffix('_synthetic').endswith({_DATASET_SUFFIXES!r}) ")


def write_rules(folder: Path, ruleset: str = RULESET) -> Path:
    """MLPerf's `ruleset` rules admitting distbench's benchmarks, written in `folder`; the path
    of the rules file to check a log with (the checker's `--config`)."""
    source = Path(mlp_compliance.__file__).parent / f"{USAGE}_{ruleset}"
    folder.mkdir(parents=True, exist_ok=True)
    common = _load(source / "common.yaml")
    # The division's rules: the copies in `folder` (the checker takes an absolute path as is).
    _patch(common, DIVISION_KEY, "POST", f"'{USAGE}_{ruleset}/{{}}_common.yaml'",
           f"'{folder}/{{}}_common.yaml'")
    for division in ("open", "closed"):
        rules = _load(source / f"{division}_common.yaml")
        record = _key(rules, BENCHMARK_KEY)
        record["CHECK"] = BENCHMARK_CHECK
        record.pop("POST", None)  # it enqueues the benchmark's own rules: none for distbench's
        _dump(rules, folder / f"{division}_common.yaml")
    _dump(common, folder / "common.yaml")
    return folder / "common.yaml"


def mlperf_command(log: Path, rules: Path, ruleset: str = RULESET) -> list[str]:
    """MLPerf's own checker command on `log` with the rules `write_rules` wrote."""
    return [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", USAGE,
            "--ruleset", ruleset, "--config", str(rules), "--log_output",
            str(rules.parent / "compliance_checker.log"), str(log)]


@dataclass(frozen=True)
class Verdict:
    """The checker's verdict on one log: ok, or the problems it found (its own messages)."""

    path: Path
    ok: bool
    problems: list[str]


def check(log: Path, ruleset: str = RULESET, *, stock: bool = False) -> Verdict:
    """Run MLPerf's checker on `log`: with distbench's benchmarks admitted (`write_rules`), or,
    `stock`, with the installed rules unchanged (a missing per-benchmark rules file is then one
    of the problems, not the traceback it is in MLPerf's command)."""
    checker = mlp_compliance.make_checker(USAGE, ruleset, quiet=False, werror=False)
    # The checker's queue of rules files is a module global that a failed check leaves filled.
    mlp_compliance.enqueued_configs.clear()
    with tempfile.TemporaryDirectory(prefix="distbench-rules-") as folder:
        rules = (f"{USAGE}_{ruleset}/common.yaml" if stock
                 else str(write_rules(Path(folder), ruleset)))
        try:
            ok = checker.check_file(str(log), rules)
        except FileNotFoundError:  # the checker said which rules file it could not find
            ok = False
        finally:
            mlp_compliance.enqueued_configs.clear()
    problems = [*checker.overwritable.values(), *checker.not_overwritable]
    return Verdict(path=Path(log), ok=ok, problems=problems)


def log_files(paths: list[Path]) -> list[Path]:
    """The logs named: a file as it is, a directory's mllog*.txt (a cell's repeats)."""
    files: list[Path] = []
    allowed = f"allowed: an MLPerf log file, or a cell directory holding {MLLOG_GLOB}"
    for path in paths:
        try:
            found = sorted(path.glob(MLLOG_GLOB)) if path.is_dir() else [path]
            readable = bool(found) and all(file.is_file() for file in found)
        except OSError as err:  # e.g. a name longer than the file system allows
            raise ConfigError(f"{_short(path)} is invalid: {err.strerror or err}; "
                              f"{allowed}") from None
        if not readable:
            raise ConfigError(f"{_short(path)} is invalid: {allowed}")
        files += found
    return files


def _short(path: Path, width: int = 120) -> str:
    """`path` as a line can hold it: a very long one cut in the middle."""
    text = str(path)
    return text if len(text) <= width else f"{text[:width // 2]}...{text[-width // 2:]}"


def _rules_dir(path: Path) -> Path:
    """--write-rules DIR checked before anything is written: a directory this user can
    write in (or create), one line otherwise (a file, /proc, a name too long)."""
    from harness.preflight import check_writable_dir

    try:
        check_writable_dir("--write-rules", str(path))
        return path.resolve()
    except OSError as err:
        raise ConfigError(f"--write-rules={_short(path)} is invalid: {err.strerror or err}; "
                          f"allowed: a directory this user can write in") from None


def parser() -> ArgumentParser:
    """The command's arguments: a function of its own so that tests can list them
    (tests/test_fuzz_commands.py fuzzes every flag)."""
    parser = ArgumentParser(prog="python -m harness.compliance", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                        help="an MLPerf log, or a cell directory (every mllog*.txt in it)")
    parser.add_argument("--stock", action="store_true",
                        help=f"the installed ruleset {RULESET} unchanged (it admits only "
                             f"MLPerf's benchmark names)")
    parser.add_argument("--write-rules", type=Path, metavar="DIR",
                        help="write the rules to DIR and print MLPerf's own command that "
                             "checks a log with them")
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


def _load(path: Path) -> list[dict[str, Any]]:
    # BaseLoader, as the checker reads them: every value stays the string it is.
    return yaml.load(path.read_text(), Loader=yaml.BaseLoader)


def _dump(rules: list[dict[str, Any]], path: Path) -> None:
    path.write_text(yaml.safe_dump(rules, sort_keys=False, width=1000))


def _key(rules: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (record,) = [entry["KEY"] for entry in rules if entry.get("KEY", {}).get("NAME") == name]
    return record


def _patch(rules: list[dict[str, Any]], name: str, field: str, old: str, new: str) -> None:
    """Replace `old` in the `field` code of key `name`; a ruleset whose code differs (a newer
    mlperf-logging) fails here instead of checking something else."""
    record = _key(rules, name)
    if old not in record.get(field, ""):
        raise RuntimeError(f"mlperf-logging's {name} {field} no longer reads {old!r}: "
                           f"harness.compliance.write_rules needs updating")
    record[field] = record[field].replace(old, new)


if __name__ == "__main__":
    sys.exit(main())
