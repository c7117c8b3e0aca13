"""Shared fixtures: every test gets its own output root, MLflow store and dataset cache."""

from __future__ import annotations

from pathlib import Path

import pytest


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
