"""A selection's cells as an MLPerf results folder, and MLPerf's result summarizer on it:
`python -m harness.sweeps mlperf SELECTION... --out DIR`.

The folder is laid out as `mlperf_logging.result_summarizer` reads one organisation's results
(training usage):

    DIR/systems/<system>.json                         one system description per system
    DIR/results/<system>/<benchmark>/result_<k>.txt   one MLPerf log per repeat, k from 0
    DIR/summary.csv, summary.json,                    the summarizer's output on DIR
    DIR/summary_detailed.csv, summary_detailed.json

- A **system**, in MLPerf's sense what a score belongs to, is the hardware, the distribution model
  and its worker count: `<hardware>-<distribution>-<workers>w` (`local_2cpu-ddp-2w`). Two cells
  of one hardware, model and worker count differing in a model setting that the selection varies
  (batch size, GPipe's micro-batches, PipeDream's stages, ...: `SETTINGS`) are two systems, the
  setting appended (`local_2cpu-ddp-2w-b16`); cells that would still share a system and a
  benchmark get their cell key's first 8 characters appended.
- A **benchmark** is the logs' `submission_benchmark` (network_dataset, `_synthetic` for generated
  images: `harness.records.eventlog.benchmark_name`).
- The **cells** are the selection's cells that ended `ok`, one run per cell (the latest ok run of
  a cell key); a cell's **result files** are its repeats' logs as its MLflow run holds them
  (mllog.txt -> result_0.txt, mllog-<k>.txt -> result_<k-1>.txt).
- The **system description** holds every field MLPerf's system_desc_checker requires, with the
  first cell's recorded values (`system_description`); what distbench does not record says so.

MLPerf's summarizer, run as its own command (`python -m mlperf_logging.result_summarizer DIR
training 6.1.0`), cannot score distbench's benchmarks, for two rules of the installed package:
it runs MLPerf's compliance checker on every result file with the stock ruleset (no option to
name another), which admits only MLPerf's benchmark names and then looks for the named
benchmark's rules file (`training_6.1.0/open_<benchmark>.yaml`): missing, so the command ends
in a FileNotFoundError traceback; and its table has a column per MLPerf benchmark
(`benchmark_meta.get_allowed_benchmarks`), so a score for any other name fails its `assert
column_name in self._column_names`. `summarize` therefore runs the summarizer's own `main()`
with distbench's benchmarks admitted in both places: the checker with `harness.compliance`'s
rules (MLPerf's, the benchmark names admitted) and the benchmark list extended by the folder's
benchmarks. It rejects, too, a log whose run stopped `aborted` (short of `run.target_accuracy`),
as MLPerf's per-benchmark rules reject a run short of its quality target: the summarizer counts
a rejected run as one that did not converge, as it does for MLPerf's benchmarks.

The summarizer's score is the olympic mean of `run_stop - run_start` in minutes: it drops the
best and the worst run whatever their number, so a benchmark needs 3 result files (repeats) or
more for a score. Without `run.target_accuracy`, a run is `run.epochs` epochs (with their
evaluations): the score is then that run's time, not a time to quality.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd
from mlperf_logging import benchmark_meta
from mlperf_logging.compliance_checker import mlp_compliance
from mlperf_logging.compliance_checker.mlp_parser import parse_file
from mlperf_logging.mllog import constants

from harness.config.schema import ConfigError
from harness.distributions.registry import setting_names, specs
from harness.records import compliance
from harness.records.artifacts import artifact_file, artifact_names
from harness.records.compliance import RULESET, USAGE
from harness.records.eventlog import log_file_name
from harness.records.results import RESULT_FILE

SUMMARY = "summary.csv"
# The summarizer's own files beside SUMMARY (it appends to the detailed ones: removed first).
SUMMARY_FILES = ("summary.csv", "summary.json", "summary_detailed.csv", "summary_detailed.json")
# MLPerf's availability (a system description's `status`, as its system_desc_checker admits)
# of a log's submission_status.
AVAILABILITY = {
    constants.ONPREM: "Available on-premise",
    constants.CLOUD: "Available cloud",
    constants.RESEARCH: "Research, Development, or Internal (RDI)",
    "preview": "Preview",
}
NOT_RECORDED = "not recorded by distbench"
# A model setting that splits a system where the selection varies it: (axis, its label).
# A model setting without a short label here is labelled by its name.
_SHORT = {
    "micro_batches": "mb",
    "stages": "s",
    "recompute": "recompute-",
    "batch_division": "division-",
    "bucket_cap_mb": "bucket",
    "fusion_threshold_mb": "fusion",
    "cycle_time_ms": "cycle",
}
SETTINGS = [
    ("batch_size", "b"),
    *((name, _SHORT.get(name, f"{name}-")) for name in setting_names() if name != "balance"),
    ("num_samples", "n"),
    ("epochs", "e"),
    ("seed", "seed"),
]
SYSTEM_OF = ["hardware", "distribution", "workers"]


@dataclass(frozen=True)
class Cell:
    """One cell run as the folder holds it."""

    row: pd.Series  # its row of the cells table (harness.sweeps.table.cells_table)
    result: dict[str, Any]  # its result.json
    logs: list[Path]  # its repeats' logs, in repeat order
    facts: dict[str, Any]  # the first log's init facts (submission_*), by key

    @property
    def benchmark(self) -> str:
        return str(self.facts[constants.SUBMISSION_BENCHMARK])


@dataclass(frozen=True)
class Entry:
    """A system's benchmark in the folder: the cell it holds and its result files."""

    system: str
    benchmark: str
    run_name: str
    run_id: str
    results: int
    aborted: int  # result files whose run stopped `aborted` (short of the target)


@dataclass(frozen=True)
class Folder:
    path: Path
    entries: list[Entry]
    left_out: list[str]  # one line per cell run not written, and why


def check_out(out: Path) -> None:
    """--out is a new or empty directory: the summarizer reads every system and benchmark
    folder in it, so an earlier export's would be scored with this one's."""
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(
            f"--out={out} is invalid: it holds files; allowed: a new or empty directory"
        )


def write_folder(client: Any, table: pd.DataFrame, out: Path) -> Folder:
    """The cells of `table` (a cells table) as an MLPerf results folder in `out`."""
    ok = table[table["status"] == "ok"]
    left_out = [
        f"{row.run_name}: status {row.status}, not scored"
        for row in table[table["status"] != "ok"].itertuples()
    ]
    key = ok["cell_key"].fillna(ok["run_id"])
    latest = ok.assign(_key=key).sort_values("started").drop_duplicates("_key", keep="last")
    if len(latest) < len(ok):
        left_out.append(
            f"{len(ok) - len(latest)} earlier run(s) of a cell set aside (the latest "
            f"ok run of each cell stands for it)"
        )
    entries = []
    with tempfile.TemporaryDirectory(prefix="distbench-mlperf-") as scratch:
        cells = []
        for _, row in latest.iterrows():
            cell = _download(client, row, Path(scratch) / str(row["run_id"]))
            if cell is None:
                left_out.append(f"{row['run_name']}: its MLflow run holds no MLPerf log")
            else:
                cells.append(cell)
        names = system_names([cell.row for cell in cells], [cell.benchmark for cell in cells])
        for name, cell in zip(names, cells):
            entries.append(write_cell(out, name, cell))
    return Folder(out, sorted(entries, key=lambda e: (e.system, e.benchmark)), left_out)


def _download(client: Any, row: pd.Series, scratch: Path) -> Cell | None:
    """The run's result.json and MLPerf logs (one per repeat), from its MLflow artifacts
    (`harness.records.artifacts`: beside the store where it was moved with them)."""
    run = client.get_run(str(row["run_id"]))
    names = artifact_names(client, run)
    logs = []
    for repeat in itertools.count():
        if log_file_name(repeat) not in names:
            break
        logs.append(artifact_file(client, run, log_file_name(repeat), scratch))
    if not logs or RESULT_FILE not in names:
        return None
    result = json.loads(artifact_file(client, run, RESULT_FILE, scratch).read_text())
    return Cell(row=row, result=result, logs=logs, facts=log_facts(logs[0]))


def log_facts(log: Path) -> dict[str, Any]:
    """An MLPerf log's values by key (the first of each key), as MLPerf's parser reads them."""
    lines, _ = parse_file(str(log), ruleset=RULESET)
    facts: dict[str, Any] = {}
    for line in lines:
        facts.setdefault(line.key, line.value["value"])
    return facts


def run_status(log: Path) -> str | None:
    """The status the log's run_stop states (success or aborted); None without a run_stop."""
    lines, _ = parse_file(str(log), ruleset=RULESET)
    stops = [
        line.value["metadata"].get("status") for line in lines if line.key == constants.RUN_STOP
    ]
    return stops[-1] if stops else None


def system_names(rows: Sequence[pd.Series], benchmarks: Sequence[str]) -> list[str]:
    """Each cell's system: hardware-distribution-<workers>w, then the settings (`SETTINGS`)
    that take several values among the cells of that hardware, model and worker count, then,
    where two cells still share a system and a benchmark, their cell keys' first 8 characters."""
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault(tuple(row[axis] for axis in SYSTEM_OF), []).append(index)
    names = [""] * len(rows)
    for (hardware, distribution, workers), members in groups.items():
        varying = [
            (axis, label)
            for axis, label in SETTINGS
            if len({_text(rows[i].get(axis)) for i in members}) > 1
        ]
        for i in members:
            names[i] = "-".join(
                [str(hardware), str(distribution), f"{workers}w"]
                + [f"{label}{_text(rows[i].get(axis))}" for axis, label in varying]
            )
    places = list(zip(names, benchmarks))
    return [
        f"{name}-{str(row['cell_key'] or row['run_id'])[:8]}"
        if places.count((name, benchmark)) > 1
        else name
        for name, benchmark, row in zip(names, benchmarks, rows)
    ]


def _text(value: Any) -> str:
    """A setting as a name shows it: 25.0 as 25, None and NaN as none."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def write_cell(out: Path, system: str, cell: Cell) -> Entry:
    """The cell's logs as `system`'s result files for its benchmark; the system's description,
    unless an earlier cell of the system wrote it."""
    folder = out / "results" / system / cell.benchmark
    folder.mkdir(parents=True, exist_ok=False)
    for index, log in enumerate(cell.logs):
        shutil.copyfile(log, folder / f"result_{index}.txt")
    description = out / "systems" / f"{system}.json"
    if not description.exists():  # the system's first cell describes it
        description.parent.mkdir(parents=True, exist_ok=True)
        description.write_text(json.dumps(system_description(system, cell), indent=2) + "\n")
    aborted = sum(run_status(log) == constants.ABORTED for log in cell.logs)
    return Entry(
        system,
        cell.benchmark,
        str(cell.row["run_name"]),
        str(cell.row["run_id"]),
        len(cell.logs),
        aborted,
    )


def system_description(name: str, cell: Cell) -> dict[str, str]:
    """Every field MLPerf's system_desc_checker requires, from the cell's log (submitter,
    division, availability), its recorded environment and its hardware config; a fact distbench
    does not record reads NOT_RECORDED. CPU sockets are not recorded: host_processors_per_node
    is 1 (the summarizer needs a number), the node's logical CPUs are host_processor_vcpu_count.
    On a CPU device there is no accelerator (0, N/A), as MLPerf's CPU submissions state it."""
    env, config = cell.result["environment"], cell.result["config"]
    hardware, row = config["hardware"], cell.row
    nodes, workers = int(row["nodes"]), int(row["workers"])
    gpu = env.get("device_type") == "cuda"
    spec = specs().get(str(row["distribution"]))  # None: a model no longer installed
    frameworks = "".join(
        f", {library.title()} {env.get(f'{library}_version', '?')}"
        for library in (spec.frameworks if spec is not None else ())
    )
    memory = hardware.get("device_memory_gb")
    bandwidth, latency = (
        hardware.get("inter_node_bandwidth_mbps"),
        hardware.get("inter_node_latency_us"),
    )
    commit = env.get("git_commit", "unknown")
    return {
        "submitter": str(cell.facts[constants.SUBMISSION_ORG]),
        "division": str(cell.facts[constants.SUBMISSION_DIVISION]),
        "status": AVAILABILITY[cell.facts[constants.SUBMISSION_STATUS]],
        "system_name": name,
        "number_of_nodes": str(nodes),
        "host_processors_per_node": "1",
        "host_processor_model_name": env.get("cpu_model", NOT_RECORDED),
        "host_processor_core_count": NOT_RECORDED,
        "host_processor_vcpu_count": env.get("cpu_count", NOT_RECORDED),
        "host_processor_frequency": NOT_RECORDED,
        "host_processor_caches": NOT_RECORDED,
        "host_processor_interconnect": NOT_RECORDED,
        "host_memory_capacity": NOT_RECORDED,
        "host_storage_type": NOT_RECORDED,
        "host_storage_capacity": NOT_RECORDED,
        "host_networking": (
            f"{bandwidth:g} Mbit/s, {latency:g} us between nodes (hardware.inter_node_*)"
            if nodes > 1 and bandwidth and latency
            else "none: one node"
            if nodes == 1
            else NOT_RECORDED
        ),
        "host_networking_topology": NOT_RECORDED if nodes > 1 else "none: one node",
        "host_memory_configuration": NOT_RECORDED,
        "accelerators_per_node": str(-(-workers // nodes) if gpu else 0),
        "accelerator_model_name": env.get("cuda_device_names", "").split(", ")[0] if gpu else "N/A",
        "accelerator_host_interconnect": NOT_RECORDED if gpu else "N/A",
        "accelerator_frequency": NOT_RECORDED if gpu else "N/A",
        "accelerator_on-chip_memories": NOT_RECORDED if gpu else "N/A",
        "accelerator_memory_configuration": NOT_RECORDED if gpu else "N/A",
        "accelerator_memory_capacity": (
            f"{memory:g} GB (hardware.device_memory_gb)"
            if gpu and memory
            else NOT_RECORDED
            if gpu
            else "N/A"
        ),
        "accelerator_interconnect": NOT_RECORDED if gpu else "N/A",
        "accelerator_interconnect_topology": NOT_RECORDED if gpu else "N/A",
        "cooling": NOT_RECORDED,
        "hw_notes": f"hardware={hardware['name']}: {hardware.get('description') or ''} "
        f"Host {env.get('host', NOT_RECORDED)}, device {env.get('device_name', '?')}"
        f"; {workers} worker(s), {hardware.get('cpu_threads')} CPU thread(s) each; "
        f"CPU sockets not recorded (host_processors_per_node 1)",
        "framework": f"PyTorch {env.get('torch_version', '?')}{frameworks}",
        "other_software_stack": ", ".join(
            f"{label} {env[key]}"
            for label, key in (
                ("Python", "python_version"),
                ("torchvision", "torchvision_version"),
                ("CUDA", "cuda_version"),
                ("cuDNN", "cudnn_version"),
                ("NCCL", "nccl_version"),
                ("GPU driver", "gpu_driver_version"),
                ("mlperf-logging", "mlperf_logging_version"),
                ("MLflow", "mlflow_version"),
                ("Hydra", "hydra_version"),
            )
            if env.get(key, "none") != "none"
        ),
        "operating_system": env.get("platform", NOT_RECORDED),
        "sw_notes": f"distbench {env.get('distbench_version', '?')} at {commit}"
        + (" with uncommitted changes" if env.get("git_dirty") == "true" else "")
        + f"; distribution={row['distribution']}, {workers} worker(s) on {nodes} "
        f"node(s); described from cell {row['run_name']} (MLflow run "
        f"{row['run_id']})",
    }


@contextlib.contextmanager
def admitted(benchmarks: Sequence[str]) -> Iterator[None]:
    """MLPerf's summarizer admitting `benchmarks` (see the module docstring): its compliance
    check runs `harness.compliance`'s rules and rejects a run stopped `aborted`; its list of the
    ruleset's benchmarks (a column each) holds `benchmarks` too. Undone on leaving."""
    check = mlp_compliance.main  # the function the summarizer calls on every result file
    allowed = benchmark_meta._ALL_ALLOWED_BENCHMARKS[USAGE]
    # get_allowed_benchmarks looks the ruleset up whole (6.1.0), then shortened (6.1).
    version = RULESET if RULESET in allowed else RULESET.rsplit(".", 1)[0]
    with tempfile.TemporaryDirectory(prefix="distbench-rules-") as folder:
        rules = str(compliance.write_rules(Path(folder)))

        def check_admitted(filename: str, config_file: str, checker: Any) -> tuple:
            # A failed check leaves the checker's module-global queue of rules files filled.
            mlp_compliance.enqueued_configs.clear()
            valid, *rest = check(filename, rules, checker)
            return (valid and run_status(Path(filename)) == constants.SUCCESS, *rest)

        with (
            mock.patch.object(mlp_compliance, "main", check_admitted),
            mock.patch.dict(allowed, {version: [*allowed[version], *benchmarks]}),
        ):
            yield


@dataclass(frozen=True)
class Summary:
    csv: Path  # the summarizer's table: a row per system, a column per benchmark (minutes)
    messages: list[str]  # what it printed besides its headers (runs it dropped, and why)


def summarize(folder: Path) -> Summary:
    """Run MLPerf's result summarizer (its own `main()`, training usage, `RULESET`) on `folder`
    with its benchmarks admitted; the summary it writes (SUMMARY_FILES in `folder`)."""
    from mlperf_logging.result_summarizer import result_summarizer

    csv = folder / SUMMARY
    for name in SUMMARY_FILES:
        (folder / name).unlink(missing_ok=True)
    benchmarks = sorted({path.name for path in (folder / "results").glob("*/*") if path.is_dir()})
    argv = ["mlperf_logging.result_summarizer", str(folder), USAGE, RULESET, "--csv", str(csv)]
    printed = io.StringIO()
    with (
        admitted(benchmarks),
        mock.patch.object(sys, "argv", argv),
        contextlib.redirect_stdout(printed),
    ):
        result_summarizer.main()
    return Summary(
        csv,
        [
            line
            for line in printed.getvalue().splitlines()
            if line and not line.endswith("Scaling Scores:")
        ],
    )


def scores(entries: Sequence[Entry], summary: Path) -> pd.DataFrame:
    """One row per system and benchmark: the summarizer's score (minutes, NaN where it gave
    none) beside what the folder holds."""
    table = pd.read_csv(summary).set_index("system")
    rows = []
    for entry in entries:
        minutes = (
            table.at[entry.system, entry.benchmark] if entry.system in table.index else float("nan")
        )
        rows.append(
            {
                "system": entry.system,
                "benchmark": entry.benchmark,
                "results": entry.results,
                "aborted": entry.aborted,
                "time_to_train_min": minutes,
                "time_to_train_s": minutes * 60,
                "run_name": entry.run_name,
            }
        )
    return pd.DataFrame(rows)


def report(folder: Folder, summary: Summary, selection: str) -> str:
    """What the command prints: the folder, the summarizer's scores, what was left out."""
    systems = len({entry.system for entry in folder.entries})
    files = sum(entry.results for entry in folder.entries)
    lines = [
        f"{folder.path}: {systems} system(s), {len(folder.entries)} system x benchmark "
        f"folder(s), {files} result files, from {selection}"
    ]
    lines += [f"left out: {line}" for line in folder.left_out]
    lines += [f"summarizer: {line}" for line in summary.messages]
    table = scores(folder.entries, summary.csv)
    shown = table[["system", "benchmark", "results", "aborted"]].copy()
    shown["time_to_train_min"] = [
        f"{v:.4f}" if pd.notna(v) else "-" for v in table["time_to_train_min"]
    ]
    shown["seconds"] = [f"{v:.2f}" if pd.notna(v) else "-" for v in table["time_to_train_s"]]
    shown["cell"] = table["run_name"]
    lines.append(
        f"MLPerf's result summarizer ({USAGE} {RULESET}, distbench's benchmarks "
        f"admitted): olympic mean of run_stop - run_start"
    )
    lines.append(shown.to_string(index=False))
    if table["aborted"].any():
        lines.append(
            "aborted: runs that stopped short of run.target_accuracy; the summarizer "
            "says 'Compliance check failed' of each and counts it as a run that did "
            "not converge"
        )
    if table["time_to_train_min"].isna().any():
        lines.append(
            "-: no score; the summarizer's olympic mean drops the best and the worst "
            "run, so it needs 3 result files or more (run.repeats >= 3), and at most "
            "one run that did not converge"
        )
    lines.append(
        f"{summary.csv}: the summarizer's table ({', '.join(SUMMARY_FILES[1:])} beside it)"
    )
    return "\n".join(lines)
