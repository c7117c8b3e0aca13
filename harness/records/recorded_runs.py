"""The read side of distbench's MLflow store: what a recorded run holds, typed. The write side
is `harness.records.tracking` (cell runs) and `harness.records.sweep_runs` (sweep parent
runs); all open the store one way, `harness.records.mlflow_store.open_store` (checked,
bounded in its waits). The analysis' grid (`harness.analysis.grid`), the recorded step
times of the predictions (`harness.predict.recorded`) and the sweeps' tables
(`harness.sweeps.table`) read runs through here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from harness.config.schema import ConfigError, DistbenchConfig
from harness.distributions.registry import config_from_record
from harness.records.artifacts import artifact_file


def recorded_config(client: Any, run: Any, scratch: Path) -> DistbenchConfig:
    """The resolved config a run recorded (its `config.yaml` artifact: the config as the cell
    resolved it, its stage plan included, not the flattened params, whose values MLflow keeps
    as strings), read beside the store or downloaded into `scratch`
    (`harness.records.artifacts`), typed against today's schema."""
    run_id = run.info.run_id
    return config_file(
        artifact_file(client, run, "config.yaml", scratch / run_id),
        f"run {run_id}: its config.yaml",
    )


def config_file(path: Path, what: str | None = None) -> DistbenchConfig:
    """A resolved config saved as YAML (a run's `config.yaml`, a cell handed to a command),
    typed against today's schema; ConfigError naming `what` (else the file) if it is not a
    mapping."""
    data = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{what or path} is not a mapping")
    return config_from_record({str(key): value for key, value in data.items()})
