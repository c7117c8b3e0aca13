"""`python -m harness.plan distribution=gpipe|pipedream hardware=... [overrides]`: the stage
plan a pipeline cell would train with, and the profile it came from, as JSON.

GPipe runs one stage per worker; the layers per stage are `distribution.balance` or else the
partition that balances the profiled forward+backward time. PipeDream's replica counts are
`distribution.stages` or else PipeDream's planner picks them from the profile. The profile is
taken at the size each stage trains at: the micro-batch for GPipe, the batch for PipeDream.
Inside a cell only rank 0 profiles and broadcasts the plan, so every worker follows one plan
even though timings differ between workers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import torch
from torch import nn

from harness.cli import command
from harness.compose import compose_config
from harness.config import ConfigError, DistbenchConfig, DistributionName, validate
from harness.partition import (
    LinkModel,
    StagePlan,
    balanced_partition,
    check_balance,
    parse_stages,
    plan_pipedream,
)
from harness.profiler import NetworkProfile, profile_layers
from workloads.datasets import dataset_spec
from workloads.networks import build_network, to_layer_list


def profile_batch_size(config: DistbenchConfig) -> int:
    """The batch one stage processes at a time: GPipe's micro-batch, PipeDream's batch."""
    if config.distribution.name is DistributionName.gpipe:
        return config.batch_size // config.micro_batches
    return config.batch_size


def needs_profile(config: DistbenchConfig) -> bool:
    distribution = config.distribution
    if distribution.balance is not None:
        return distribution.name is DistributionName.pipedream and distribution.stages is None
    return True


def profile_network(config: DistbenchConfig, layers: Sequence[nn.Module],
                    device: torch.device) -> NetworkProfile:
    spec = dataset_spec(config.dataset.name.value)
    generator = torch.Generator().manual_seed(config.run.seed)
    sample = torch.randn((profile_batch_size(config), *spec.input_shape), generator=generator)
    return profile_layers(layers, sample.to(device))


def updates_per_pass(config: DistbenchConfig) -> float:
    """Optimizer steps per forward+backward of a stage: GPipe steps once per batch of
    #mb micro-batches, PipeDream after every minibatch."""
    if config.distribution.name is DistributionName.gpipe:
        return 1 / config.micro_batches
    return 1.0


def stage_plan(config: DistbenchConfig, num_layers: int,
               profile: NetworkProfile | None) -> StagePlan:
    """The plan for `config` (see the module docstring); ValueError if it cannot be built."""
    distribution, workers = config.distribution, config.world_size
    if distribution.name is DistributionName.gpipe:
        replicas = [1] * workers
    elif distribution.stages is not None:
        replicas = parse_stages(distribution.stages)
    else:
        assert profile is not None, "PipeDream's planner needs a profile"
        link = LinkModel(config.hardware.intra_node_bandwidth_mbps or LinkModel.bandwidth_mbps)
        planned = plan_pipedream(profile.compute_ms(updates_per_pass(config)),
                                 [layer.parameter_mb for layer in profile.layers],
                                 [layer.activation_mb for layer in profile.layers], workers, link)
        if distribution.balance is None:
            return planned
        replicas = planned.replicas
    if distribution.balance is not None:
        balance = check_balance(distribution.balance, num_layers, len(replicas))
    else:
        assert profile is not None, "balancing stages needs a profile"
        balance = balanced_partition(profile.compute_ms(updates_per_pass(config)), len(replicas))
    return StagePlan.of(balance, replicas)


@command
def main(argv: list[str] | None = None) -> None:
    config = validate(compose_config(sys.argv[1:] if argv is None else argv))
    if not config.distribution.pipeline:
        raise ConfigError(f"distribution={config.distribution.name.value} is invalid for "
                          f"harness.plan: allowed: gpipe, pipedream")
    torch.manual_seed(config.run.seed)
    spec = dataset_spec(config.dataset.name.value)
    layers = to_layer_list(config.network.name.value,
                           build_network(config.network.name.value, spec))
    if config.hardware.cpu_threads is not None:
        torch.set_num_threads(config.hardware.cpu_threads)
    profile = profile_network(config, layers, torch.device("cpu")) \
        if needs_profile(config) else None
    try:
        plan = stage_plan(config, len(layers), profile)
    except ValueError as err:  # the partitioner's checks name the key and what is allowed
        raise ConfigError(str(err)) from None
    report: dict[str, object] = {
        "network": config.network.name.value, "dataset": config.dataset.name.value,
        "distribution": config.distribution.name.value, "workers": config.world_size,
        "num_layers": len(layers), "profile_batch_size": profile_batch_size(config),
        **plan.to_dict(),
    }
    if profile is not None:
        costs = profile.compute_ms(updates_per_pass(config))
        report["stage_compute_ms"] = [sum(costs[s.first:s.end]) for s in plan.stages]
        report["profile"] = profile.to_dict()
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
