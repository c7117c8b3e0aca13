"""What a config can reach beyond Python: job scripts (values are data, never shell code), files
loaded with torch.load (tensors only), and servers (loopback unless told otherwise)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import submitit

from harness.config.schema import ConfigError, DistbenchConfig
from harness.distributions.sequential import SequentialConfig
from harness.system.worker_env import (
    WorkerEnvironment,
    _loopback_if_local,
    interface_of,
    listen_address,
)
from launchers import slurm
from tests.helpers import REPO_ROOT

SOURCE_DIRS = ["harness", "workloads", "launchers", "hydra_plugins", "scripts", "tests"]


@pytest.fixture(autouse=True)
def srun_on_path(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """submitit's SLURM executor refuses to be built where `srun` is not on PATH. These tests
    only generate job scripts (nothing is submitted, and the script's own srun is replaced
    where it runs), so on a machine without SLURM a placeholder `srun` that fails if ever
    called stands in for the check; with SLURM installed the real one is found first."""
    if shutil.which("srun") is not None:
        return
    bin_dir = tmp_path_factory.mktemp("no-slurm-bin")
    placeholder = bin_dir / "srun"
    placeholder.write_text("#!/bin/sh\necho 'placeholder srun: not a SLURM node' >&2\nexit 1\n")
    placeholder.chmod(0o755)
    monkeypatch.setenv("PATH", f"{os.environ['PATH']}{os.pathsep}{bin_dir}")


def _job_script(launcher: dict, folder: Path) -> str:
    """The sbatch script submitit would submit for a sequential cell with these launcher
    settings (generated, not submitted)."""
    cell = DistbenchConfig(distribution=SequentialConfig())
    size = slurm.job_size(cell.hardware, cell.world_size, launcher)
    executor = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
    executor.update_parameters(**slurm.executor_parameters(size, launcher, cell))
    return executor._executor._make_submission_file_text(  # what submit() writes
        f"python -u -m submitit.core._submit {folder}", "uid"
    )


def test_payloads_in_launcher_settings_stay_data_in_the_job_script(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = f"x; touch {marker}"
    launcher = {
        "name": f"distbench-{payload}",
        "partition": payload,
        "comment": f"$(touch {marker})",
        "account": f"`touch {marker}`",
        "srun_args": [f"--x={payload}"],
        "additional_parameters": {"reservation": payload},
        "timeout_min": 5,
    }
    script = _job_script(launcher, tmp_path / "jobs")
    assert f"#SBATCH --partition='{payload}'" in script
    assert f"#SBATCH --job-name='distbench-{payload}'" in script
    assert f"#SBATCH --reservation='{payload}'" in script
    # Run the script itself, with srun replaced by a function that records its arguments.
    (tmp_path / "job.sh").write_text(script)
    ran = subprocess.run(
        ["bash", "-c", 'srun() { printf "%s\\n" "$@" > srun.args; }; export -f srun; bash job.sh'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert not marker.exists()
    assert f"--x={payload}" in (tmp_path / "srun.args").read_text().splitlines()


@pytest.mark.parametrize(
    ("launcher", "fragment"),
    [
        ({"name": "a\ntouch /tmp/pwned"}, "hydra.launcher.name="),
        ({"comment": "ok\rtouch"}, "hydra.launcher.comment="),
        ({"srun_args": ["--ok", "x\ntouch /tmp/pwned"]}, "hydra.launcher.srun_args="),
        (
            {"additional_parameters": {"reservation": "r1\ntouch /tmp/pwned #"}},
            "hydra.launcher.additional_parameters.reservation=",
        ),
        (
            {"additional_parameters": {"x=1\ntouch /tmp/pwned #": "y"}},
            "an sbatch flag name; allowed: letters, digits",
        ),
    ],
)
def test_settings_that_would_become_shell_lines_are_refused(launcher: dict, fragment: str) -> None:
    cell = DistbenchConfig(distribution=SequentialConfig())
    with pytest.raises(ConfigError) as error:
        slurm.job_size(cell.hardware, cell.world_size, {"name": "n", **launcher})
    assert fragment in str(error.value)


def test_setup_lines_are_the_one_shell_code_setting(tmp_path: Path) -> None:
    script = _job_script({"name": "n", "setup": ["module load cuda/12"]}, tmp_path)
    assert "\n# setup\nmodule load cuda/12\n" in script


def test_teardown_lines_are_refused(tmp_path: Path) -> None:
    """submitit writes `teardown` into the job script as shell lines after srun: refused, so
    `setup` stays the one setting that is shell code."""
    marker = tmp_path / "pwned"
    cell = DistbenchConfig(distribution=SequentialConfig())
    with pytest.raises(ConfigError) as error:
        slurm.job_size(
            cell.hardware, cell.world_size, {"name": "n", "teardown": [f"touch {marker}"]}
        )
    assert "hydra.launcher.teardown=" in str(error.value)
    assert "allowed: null" in str(error.value) and "hydra.launcher.setup" in str(error.value)
    # As a user meets it: tests/faults/test_bad_input.py's TEARDOWN row.
    assert not marker.exists()


def _python_sources() -> list[Path]:
    return [path for folder in SOURCE_DIRS for path in (REPO_ROOT / folder).rglob("*.py")]


def test_nothing_from_a_config_is_evaluated_as_code() -> None:
    # `.eval()` (a module's evaluation mode) is not the builtin.
    forbidden = re.compile(r"shell\s*=\s*True|(?<![.\w])(eval|exec)\s*\(|os\.system\(|os\.popen\(")
    this_file = Path(__file__).resolve()
    hits = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for path in _python_sources()
        if path.resolve() != this_file
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if forbidden.search(line)
    ]
    assert hits == []


def test_torch_load_reads_tensors_only() -> None:
    """Every torch.load passes weights_only=True (a pickle can run code while loading)."""
    this_file = Path(__file__).resolve()
    unsafe = []
    for path in _python_sources():
        if path.resolve() == this_file:
            continue
        text = path.read_text()
        for match in re.finditer(r"torch\.load\(", text):
            call = text[match.end() : text.find(")", match.end()) + 1]
            if "weights_only=True" not in call:
                line = text.count("\n", 0, match.start()) + 1
                unsafe.append(f"{path.relative_to(REPO_ROOT)}:{line}")
    assert unsafe == []


def test_servers_listen_on_loopback_by_default() -> None:
    readme = "\n".join(
        path.read_text() for path in [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md")]
    )
    commands = re.findall(r"^.*mlflow (?:ui|server) --.*$", readme, flags=re.MULTILINE)
    assert commands and all("--host 127.0.0.1" in command for command in commands)
    for path in [
        REPO_ROOT / "README.md",
        *(REPO_ROOT / "docs").glob("*.md"),
        *(REPO_ROOT / "scripts").glob("*.sh"),
        *_python_sources(),
    ]:
        if path.resolve() != Path(__file__).resolve():
            assert "0.0.0.0" not in path.read_text(), path
    # A single-node cell's workers meet on loopback, and listen there only
    # (tests/integration/test_listening.py reads what real cells listen on).
    assert WorkerEnvironment(rank=0, local_rank=0, world_size=1).master_addr == "127.0.0.1"
    assert _loopback_if_local("localhost") == "127.0.0.1"
    one_machine = WorkerEnvironment(rank=1, local_rank=1, world_size=2)
    assert listen_address(one_machine) == "127.0.0.1" and interface_of("127.0.0.1") == "lo"
    # Several nodes: this machine's address on the route to another node (the local SLURM
    # cluster's nodes are 127.0.0.1, so loopback again), never every interface.
    two_nodes = WorkerEnvironment(world_size=2, num_nodes=2, hostnames=("here", "127.0.0.1"))
    assert listen_address(two_nodes) == "127.0.0.1"
    # torch's tcp:// rendezvous and Horovod's RendezvousServer.start listen on every interface.
    unbound = re.compile(r"init_method\s*=\s*f?[\"']tcp://|RendezvousServer\(verbose")
    harness_sources = [
        path for path in _python_sources() if path.relative_to(REPO_ROOT).parts[0] != "tests"
    ]
    assert [path for path in harness_sources if unbound.search(path.read_text())] == []
