"""A configuration named in a few characters, as the analysis' report and the recommender's
table both show it (`setting_label`): the distribution model's own label
(`harness.distributions.spec.DistributionSpec.label`)."""

from __future__ import annotations

from harness.config.schema import DistbenchConfig
from harness.costs.partition import StagePlan
from harness.distributions.registry import spec_of


def setting_label(config: DistbenchConfig, plan: StagePlan | None = None) -> str:
    """A configuration in a few characters: the model and its main settings (a pipeline
    cell's plan is `plan`, else its configured one): `DistributionSpec.label`."""
    return spec_of(config).label(config, plan)
