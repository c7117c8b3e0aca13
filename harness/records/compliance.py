"""MLPerf's compliance checker's rules for distbench's event logs (`python -m
harness.compliance` runs them; `harness.sweeps.mlperf` writes them beside a results folder).

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

import itertools
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from mlperf_logging.compliance_checker import mlp_compliance

from harness.config.schema import DatasetName
from workloads.networks.sources.builtin import NAMES as BUILTIN_NETWORKS

USAGE = "training"
RULESET = max(
    (
        path.name.removeprefix(f"{USAGE}_")
        for path in Path(mlp_compliance.__file__).parent.glob(f"{USAGE}_*.*.*")
        if path.name.removeprefix(f"{USAGE}_").replace(".", "").isdigit()
    ),
    key=lambda version: tuple(int(part) for part in version.split(".")),
)
BENCHMARK_KEY = "submission_benchmark"
DIVISION_KEY = "submission_division"


def benchmark_names() -> list[str]:
    """The names `harness.records.eventlog.benchmark_name` gives the built-in networks (a user's own
    network or a zoo model adds its own label: `BENCHMARK_CHECK` admits those)."""
    return [
        f"{network}_{dataset.value}{suffix}"
        for network, dataset, suffix in itertools.product(
            BUILTIN_NETWORKS, DatasetName, ("", "_synthetic")
        )
    ]


# The checker evaluates a rule's CHECK as a Python expression over the logged value `v`:
# a distbench name is a network label (letters, digits, '_', '-', '.'), '_', a dataset name.
# (No comprehension: the checker's names are not visible inside one.)
_DATASET_SUFFIXES = tuple(sorted(f"_{dataset.value}" for dataset in DatasetName))
BENCHMARK_CHECK = (
    " isinstance(v['value'], str) and v['value'].replace('_', '')"
    ".replace('-', '').replace('.', '').isalnum() and v['value']"
    f".removesuffix('_synthetic').endswith({_DATASET_SUFFIXES!r}) "
)


def write_rules(folder: Path, ruleset: str = RULESET) -> Path:
    """MLPerf's `ruleset` rules admitting distbench's benchmarks, written in `folder`; the path
    of the rules file to check a log with (the checker's `--config`)."""
    source = Path(mlp_compliance.__file__).parent / f"{USAGE}_{ruleset}"
    folder.mkdir(parents=True, exist_ok=True)
    common = _load(source / "common.yaml")
    # The division's rules: the copies in `folder` (the checker takes an absolute path as is).
    _patch(
        common,
        DIVISION_KEY,
        "POST",
        f"'{USAGE}_{ruleset}/{{}}_common.yaml'",
        f"'{folder}/{{}}_common.yaml'",
    )
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
    return [
        sys.executable,
        "-m",
        "mlperf_logging.compliance_checker",
        "--usage",
        USAGE,
        "--ruleset",
        ruleset,
        "--config",
        str(rules),
        "--log_output",
        str(rules.parent / "compliance_checker.log"),
        str(log),
    ]


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
        rules = (
            f"{USAGE}_{ruleset}/common.yaml" if stock else str(write_rules(Path(folder), ruleset))
        )
        try:
            ok = checker.check_file(str(log), rules)
        except FileNotFoundError:  # the checker said which rules file it could not find
            ok = False
        finally:
            mlp_compliance.enqueued_configs.clear()
    problems = [*checker.overwritable.values(), *checker.not_overwritable]
    return Verdict(path=Path(log), ok=ok, problems=problems)


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
        raise RuntimeError(
            f"mlperf-logging's {name} {field} no longer reads {old!r}: "
            f"harness.records.compliance.write_rules needs updating"
        )
    record[field] = record[field].replace(old, new)
