"""A multi-node cell through a real SLURM cluster: two slurmd "nodes" on this machine
(scripts/slurm_local.sh), launched with Hydra's submitit SLURM launcher."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

SLURM_SCRIPT = REPO_ROOT / "scripts" / "slurm_local.sh"


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[None]:
    installed = shutil.which("slurmctld") is not None
    if not installed and (os.geteuid() != 0 or shutil.which("apt-get") is None):
        pytest.skip("SLURM is not installed and this machine cannot install it (needs root "
                    "and apt-get)")
    started = subprocess.run(["bash", str(SLURM_SCRIPT), "start"], capture_output=True,
                             text=True, timeout=600)
    assert started.returncode == 0, started.stdout + started.stderr
    yield
    subprocess.run(["bash", str(SLURM_SCRIPT), "stop"], capture_output=True, timeout=60)


def test_a_two_node_ddp_cell_runs_through_slurm(slurm_cluster: None, output_root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness", "-m", "distribution=ddp",
         "hardware=slurm_local_2nodes", "hydra/launcher=submitit_slurm",
         "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1",
         "hydra.launcher.timeout_min=10", "network=mobilenetv2", "dataset.num_samples=64",
         "distribution.batch_size=8", "run.epochs=2", "run.warmup_batches=1",
         "run.progress=false", f"run.output_dir={output_root}"],
        cwd=output_root.parent, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (output_root / "sweeps").rglob("result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok", result["error"]
    assert result["metrics"]["world_size"] == 2
    assert result["metrics"]["replicas_in_sync"] == 1.0
    assert result["environment"]["slurm_nodelist"] == "node[1-2]"
