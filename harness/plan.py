"""`python -m harness.plan distribution=<pipeline model> hardware=... [overrides]`: the stage
plan a pipeline cell would train with, and the profile it came from, as JSON.

How each model plans is its own (`DistributionSpec.stage_planner`, in its module of
`harness.distributions`): GPipe runs one stage per worker, layers per stage from
`distribution.balance` or else balancing the profiled forward+backward time; PipeDream's
replica counts are `distribution.stages` or else PipeDream's planner picks them from the
profile. The profile is taken at the size each stage trains at (the model's step batch: the
micro-batch for GPipe, the batch for PipeDream). Inside a cell only rank 0 profiles and
broadcasts the plan, so every worker follows one plan even though timings differ between
workers.
"""

from __future__ import annotations

import argparse
import json
import sys

from harness.cli.arguments import overrides_of, overrides_parser
from harness.cli.errors import command
from harness.commands.compose import compose_config
from harness.config.schema import ConfigError, validate
from harness.distributions.registry import spec_of, specs


def parser() -> argparse.ArgumentParser:
    return overrides_parser("python -m harness.plan", __doc__)


@command
def main(argv: list[str] | None = None) -> None:
    config = validate(compose_config(overrides_of(parser(), argv)))
    planner = spec_of(config).stage_planner
    if planner is None:
        pipelines = [spec.name for spec in specs().values() if spec.stage_planner is not None]
        raise ConfigError(
            f"distribution={config.distribution.name} is invalid for "
            f"harness.plan: allowed: {', '.join(pipelines)}"
        )
    # Only now: --help and bad input are answered without loading torch.
    import torch

    from harness.distributions.pipeline import profile_network
    from workloads.networks import build_network, to_layer_list

    torch.manual_seed(config.run.seed)
    spec = config.dataset.spec
    layers = to_layer_list(config.network.ref, build_network(config.network.ref, spec))
    if config.hardware.cpu_threads is not None:
        torch.set_num_threads(config.hardware.cpu_threads)
    profile = (
        profile_network(config, layers, torch.device("cpu"))
        if planner.needs_profile(config)
        else None
    )
    try:
        plan = planner.plan(config, len(layers), profile)
    except ValueError as err:  # the partitioner's checks name the key and what is allowed
        raise ConfigError(str(err)) from None
    report: dict[str, object] = {
        "network": config.network.label,
        "dataset": config.dataset.key,
        "distribution": config.distribution.name,
        "workers": config.world_size,
        "num_layers": len(layers),
        "profile_batch_size": config.distribution.step_batch(config),
        **plan.to_dict(),
    }
    if profile is not None:
        costs = profile.compute_ms(planner.updates_per_pass(config))
        report["stage_compute_ms"] = [sum(costs[s.first : s.end]) for s in plan.stages]
        report["profile"] = profile.to_dict()
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
