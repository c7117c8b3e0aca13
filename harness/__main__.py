"""`python -m harness [overrides]`: measure one grid cell; `+sweep=NAME` measures a grid."""

from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from harness.config import ConfigError, register_configs
from harness.run import run_cell

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    try:
        return run_cell(cfg)
    except ConfigError as err:
        print(f"distbench: invalid config: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
