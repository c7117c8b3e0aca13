"""A cell's config checked and resolved once, by the entry point that received it, and passed on.

The typed config is what the measurement reads; the resolved plain data is what the record keeps
(result.json's `config`, MLflow's params) and what the cell's key is hashed from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from harness.config.schema import DistbenchConfig, resolved_container, validate
from harness.records.resume import cell_key


@dataclass(frozen=True)
class CheckedCell:
    config: DistbenchConfig
    resolved: dict[str, Any]  # interpolations resolved, enums as strings, no `hydra` node
    key: str  # harness.records.resume.cell_key of `resolved`


def check_cell(cfg: DictConfig) -> CheckedCell:
    """Validate `cfg` (ConfigError if invalid, before anything is resolved) and resolve it."""
    config = validate(cfg)
    resolved = resolved_container(cfg)
    return CheckedCell(config, resolved, cell_key(resolved))
