"""`python -m harness` answers --help, shell completion and bad input without loading torch: what a
person waits for at the prompt, and what a TAB of the shell's completion costs. Each command runs in
a fresh interpreter, which then says which heavy libraries it loaded; the wall time is reported, not
asserted (BENCHMARKS.md, "How long commands take, and the test suite", has it measured on a quiet
machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli.preflight import GPU_DRIVER_PATHS

HEAVY = ("torch", "torchvision", "numpy", "mlflow", "matplotlib", "submitit")

# Runs `python -m MODULE ARGS` in this interpreter, then writes its exit status and which of
# HEAVY it loaded to the file named by the first argument (MODULE: DISTBENCH_PROBED_MODULE,
# default harness).
_PROBE = """
import json, os, runpy, sys
module = os.environ.get("DISTBENCH_PROBED_MODULE", "harness")
report, sys.argv = sys.argv[1], [module, *sys.argv[2:]]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    status = 0
except SystemExit as end:
    status = end.code if isinstance(end.code, int) else 1
with open(report, "w") as stream:
    json.dump({"status": status, "loaded": [m for m in HEAVY if m in sys.modules]}, stream)
""".replace("HEAVY", repr(HEAVY))


def _run(
    tmp_path: Path, *args: str, **environment: str
) -> tuple[dict, subprocess.CompletedProcess[str]]:
    report = tmp_path / "report.json"
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(report), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **environment},
    )
    module = environment.get("DISTBENCH_PROBED_MODULE", "harness")
    print(f"python -m {module} {' '.join(args)}: {time.perf_counter() - started:.2f} s")
    return json.loads(report.read_text()), done


@pytest.mark.parametrize("args", [["--help"], ["--shell-completion", "install=bash"]])
def test_help_and_completion_load_no_torch(tmp_path: Path, args: list[str]) -> None:
    outcome, done = _run(tmp_path, *args)
    assert outcome["status"] == 0, done.stderr[-2000:]
    assert outcome["loaded"] == [], f"{' '.join(args)} loaded {outcome['loaded']}"
    assert done.stdout.strip()


def test_a_tab_of_the_shell_completion_loads_no_torch(tmp_path: Path) -> None:
    # What bash's completion function (installed by install=bash) runs at each TAB.
    line = "distbench distribution=ddp hardware="  # the console command bash completes
    outcome, done = _run(tmp_path, "-sc", "query=bash", COMP_LINE=line, COMP_POINT=str(len(line)))
    assert outcome["status"] == 0, done.stderr[-2000:]
    assert "hardware=local_2cpu" in done.stdout.split()
    assert outcome["loaded"] == []


def test_a_completion_query_outside_the_shell_is_bad_input(tmp_path: Path) -> None:
    environment = {key: value for key, value in os.environ.items() if key != "COMP_LINE"}
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(report), "-sc", "query=bash"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )
    assert json.loads(report.read_text())["status"] == 2, done.stderr
    assert "without the COMP_LINE" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["dataset=nope"],  # an unknown option of a group
        ["distribution=ddp", "distribution.bucket_cap_mb=-1"],  # a model's setting out of range
        ["-m", "distribution=sequential,ddp", "run.epochs=0"],  # a sweep's cells, every one checked
        ["distribution=ddp", "hardware.nodes=2"],  # a multi-node cell on this one machine
    ],
)
def test_bad_input_is_refused_without_loading_torch(tmp_path: Path, args: list[str]) -> None:
    outcome, done = _run(tmp_path, *args)
    assert outcome["status"] == 2, done.stdout[-1000:] + done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert outcome["loaded"] == [], f"{' '.join(args)} loaded {outcome['loaded']}"
    assert not (tmp_path / "outputs").exists(), "bad input must not create anything"


def test_the_probe_script_sees_what_a_command_loads(tmp_path: Path) -> None:
    # The check itself: a cell that trains does load torch.
    outcome, done = _run(
        tmp_path,
        "dataset=mnist",
        "network=resnet18",
        "dataset.num_samples=8",
        "distribution.batch_size=8",
        "run.epochs=1",
        "run.progress=false",
        f"run.output_dir={tmp_path / 'outputs'}",
    )
    assert outcome["status"] == 0, done.stderr[-3000:]
    assert "torch" in outcome["loaded"]


# Every command's --help, and what it may load for it: numpy where the command's modules
# compute with it at their top (sweeps' tables are pandas; the analysis' fit), nothing else:
# torch, matplotlib, scipy's optimizer and MLflow wait until the command measures, plots,
# fits or reads a store.
HELP_MAY_LOAD = {
    "harness": (),
    "harness.describe": (),
    "harness.plan": (),
    "harness.probe": (),
    "harness.sync": (),
    "harness.compliance": (),
    "harness.sweeps": ("numpy",),
    "harness.analysis": ("numpy",),
    "harness.recommend": ("numpy",),
}


@pytest.mark.parametrize("module", sorted(HELP_MAY_LOAD))
def test_every_command_answers_help_without_loading_torch(tmp_path: Path, module: str) -> None:
    outcome, done = _run(tmp_path, "--help", DISTBENCH_PROBED_MODULE=module)
    assert outcome["status"] == 0, done.stderr[-2000:]
    assert done.stdout.startswith(("usage:", "distbench")), done.stdout[:500]
    assert done.stderr == ""
    unexpected = set(outcome["loaded"]) - set(HELP_MAY_LOAD[module])
    assert not unexpected, f"{module} --help loaded {sorted(unexpected)}"


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("harness.describe", ["dataset=nope"]),
        ("harness.plan", ["distribution=ddp"]),  # not a pipeline: the command's own check
        ("harness.probe", ["hardware=local_cpu"]),  # one worker: nothing to probe
    ],
)
def test_a_command_of_overrides_refuses_bad_input_without_loading_torch(
    tmp_path: Path, module: str, args: list[str]
) -> None:
    outcome, done = _run(tmp_path, *args, DISTBENCH_PROBED_MODULE=module)
    assert outcome["status"] == 2, done.stdout[-1000:] + done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert outcome["loaded"] == [], f"{module} {' '.join(args)} loaded {outcome['loaded']}"


def test_the_launcher_of_a_multi_worker_pipeline_cell_leaves_torch_to_its_workers(
    tmp_path: Path,
) -> None:
    """A 2-worker cell typed at the prompt, on a machine that never ran it: its launcher checks
    it (a built-in pipeline's layer count is kept with the code), starts its workers and
    records it; only the workers load torch."""
    outcome, done = _run(
        tmp_path,
        "distribution=gpipe",
        "hardware=local_2cpu",
        "dataset=mnist",
        "network=mobilenetv2",
        "dataset.num_samples=16",
        "distribution.batch_size=8",
        "run.epochs=1",
        "run.warmup_batches=0",
        "run.progress=false",
        f"run.output_dir={tmp_path / 'outputs'}",
    )
    assert outcome["status"] == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "starting 2 worker process(es)" in done.stdout
    assert not {"torch", "torchvision"} & set(outcome["loaded"]), outcome["loaded"]


@pytest.mark.skipif(
    any(map(os.path.exists, GPU_DRIVER_PATHS)),
    reason="this machine has a GPU driver: whether torch sees CUDA is torch's",
)
def test_a_dry_run_of_a_gpu_cluster_on_a_machine_without_a_gpu_driver_loads_no_torch(
    tmp_path: Path,
) -> None:
    """Listing a GPU cluster's grid from a laptop or a login node: each CUDA cell is listed as
    unable to run here, without asking torch (3 s) whether it sees a CUDA device."""
    outcome, done = _run(
        tmp_path,
        "hardware=titanrtx_cluster",
        "distribution=ddp",
        "--dry-run",
        f"run.output_dir={tmp_path / 'outputs'}",
    )
    assert outcome["status"] == 0, done.stderr[-2000:]
    assert "torch sees no CUDA device on this machine" in done.stdout
    assert "torch" not in outcome["loaded"], outcome["loaded"]


def test_a_process_that_imported_the_harness_freezes_its_objects_at_exit(tmp_path: Path) -> None:
    """The interpreter's last collection would walk every object torch made (about a second
    of every command's and worker's exit): the harness freezes them in an exit handler. An
    exit handler registered before the harness' import runs after its own (last registered,
    first run) and sees them frozen; the time saved is a benchmark's
    (tests/benchmarks/test_command_latency.py)."""
    code = (
        "import atexit, gc, os\n"
        "atexit.register(lambda: os.write(1, str(gc.get_freeze_count()).encode()))\n"
        "import harness, torch\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 10_000, done.stdout  # torch's objects, frozen
