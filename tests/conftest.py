"""Shared fixtures: every test gets its own output root, MLflow store and dataset cache; the
SLURM tests share the local cluster's fixture."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

SLURM_SCRIPT = REPO_ROOT / "scripts" / "slurm_local.sh"


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path_factory: pytest.TempPathFactory,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep tests off the user's ~/.cache and MLflow settings."""
    cache = tmp_path_factory.getbasetemp() / "dataset-cache"  # shared: generated once per session
    monkeypatch.setenv("DISTBENCH_CACHE_DIR", str(cache))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DISTBENCH_PARENT_RUN_ID", raising=False)


@pytest.fixture
def output_root(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    root.mkdir()
    return root


# Module scope: each SLURM test module starts the 2-node cluster of scripts/slurm_local.sh for
# its tests and stops it after them.
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
