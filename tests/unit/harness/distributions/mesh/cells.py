"""A plan cell of llama_tiny on four CPU workers, validated once per set of overrides: what the
mesh model's unit tests price."""

from __future__ import annotations

import functools

from harness.commands.compose import compose_config
from harness.config.schema import DistbenchConfig, validate


@functools.cache
def plan_cell(*overrides: str) -> DistbenchConfig:
    return validate(
        compose_config(
            [
                "distribution=mesh",
                "hardware=local_4cpu",
                "network=llama_tiny",
                "dataset=tokens",
                *overrides,
            ]
        )
    )
