"""What a distribution model is, in one place (in the spirit of torchtitan's `TrainSpec`).

Each model is one package of `harness.distributions` (or of a package of the user's that
registers it: `harness.distributions.plugins`) whose `__init__` ends with `SPEC =
DistributionSpec(...)`, plus its config file `conf/distribution/<name>.yaml`; the registry
(`harness.distributions.registry`) finds every such package, so adding a model touches no
other file. The cell's config, the performance model, the recommender, the stage planner and
the reports ask the spec, never the model's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from harness.config.schema import DistbenchConfig, DistributionConfig
from harness.costs.memory import WorkerMemory
from harness.costs.partition import StagePlan
from harness.costs.terms import CellFacts, EpochTerms, FreeParameter
from harness.profiles.collectives import Collective
from harness.profiles.hardware import HardwareProfile
from harness.profiles.network import NetworkProfile

if TYPE_CHECKING:  # the trainer's types: a spec names its trainer, and imports it never
    from harness.distributions.base import Trainer, TrainerFactory, TrainingContext

# (nodes, workers per node) the recommender tries, fewest first
WorkerCounts = Sequence[tuple[int, int]]


def trainer_in(module: str, function: str) -> TrainerFactory:
    """The trainer factory `module.function`, imported when a worker first builds its trainer:
    the spec, and everything that predicts, plans or checks a cell from it, never loads a
    trainer (nor torch). A model's package names its own: `trainer_in(f"{__name__}.trainer",
    "ddp_trainer")`."""

    def build(context: TrainingContext) -> Trainer:
        factory: TrainerFactory = getattr(importlib.import_module(module), function)
        return factory(context)

    return build


def no_overrides(candidate: DistbenchConfig, plan: StagePlan | None) -> list[str]:
    """A model with no settings of its own to pin in a recommended command."""
    return []


@dataclass(frozen=True)
class StagePlanner:
    """How a pipeline model splits the network into stages (`harness.plan` shows it)."""

    # (cell, layer count, profile or None) -> the stages' layers and replicas; ValueError
    # (naming the key) if the cell's settings cannot be planned
    plan: Callable[[DistbenchConfig, int, NetworkProfile | None], StagePlan]
    # whether `plan` needs a layer profile of the network for this cell's settings
    needs_profile: Callable[[DistbenchConfig], bool]
    # optimizer steps per forward+backward of a stage (a profile's update cost is scaled by it)
    updates_per_pass: Callable[[DistbenchConfig], float] = field(default=lambda cell: 1.0)
    # whether an analysis times the plan's stages in place for the predictions
    # (`harness.stage_timing`; `CellFacts.stages_in_place`): where the layers' shares of one
    # sequential step miss how a stage runs in a process of its own
    timed_in_place: bool = False


@dataclass(frozen=True)
class DistributionSpec:
    """One distribution model: how it trains, how it is configured, predicted and offered."""

    name: str  # `distribution=<name>`: the config file, and `distribution.name`
    title: str  # how a person names it ("GPipe")
    # the typed settings: a subclass of DistributionConfig, the Hydra schema of its config file
    settings: type[DistributionConfig]
    trainer: TrainerFactory  # builds one worker's trainer
    # the cell's epoch split by physical cause (`harness.costs.terms`); the profile is None
    # only for a one-worker cell
    epoch_terms: Callable[[DistbenchConfig, CellFacts, HardwareProfile | None], EpochTerms]
    # every worker's predicted peak memory, term by term
    memory_per_worker: Callable[[DistbenchConfig, CellFacts], list[WorkerMemory]]
    # the configurations of this model the recommender ranks, for a cell asked about
    # (its batch size, dataset, hardware) over the worker counts to try
    candidates: Callable[[DistbenchConfig, WorkerCounts], Iterator[DistbenchConfig]]
    # a configuration in a few characters (reports, tables): the model and its main settings,
    # the plan where one was made
    label: Callable[[DistbenchConfig, StagePlan | None], str]
    # the overrides that pin a candidate's own settings and plan in a recommended command
    pinned_overrides: Callable[[DistbenchConfig, StagePlan | None], list[str]] = no_overrides
    stage_planner: StagePlanner | None = None  # pipelines only
    # Whether predicting a cell of this model needs each layer's share of a step measured (a
    # layer profile), beyond a stage planner's needs: a model that splits layers between
    # workers otherwise (a plan's stages and tensor-parallel blocks) weighs them by it.
    profiles_layers: Callable[[DistbenchConfig], bool] = field(default=lambda cell: False)
    # The one-worker model every speedup is measured against, whose training step the
    # predictions' probe times and whose recorded cells give step times (exactly one model).
    baseline: bool = False
    # Libraries beyond PyTorch the model trains with, as the recorded environment names their
    # versions (`<library>_version`): an MLPerf system description lists them.
    frameworks: tuple[str, ...] = ()
    # Free parameters of terms of the model's own (`EpochTerms.model_terms`), fitted per
    # hardware beside the shared contention and communication (Horovod's background thread).
    free_parameters: tuple[FreeParameter, ...] = ()
    # The transfers between workers its time terms read from a hardware profile, which
    # `python -m harness.probe` measures (it measures the union of every registered model's,
    # `registry.probed_collectives`): point-to-point links, allreduce, an allreduce beside
    # compute, all-gather, reduce-scatter (`harness.profiles.collectives.Collective`). Empty
    # for a model that never communicates (the one-worker baseline).
    probed_collectives: tuple[Collective, ...] = ()

    def __post_init__(self) -> None:
        unknown = [c for c in self.probed_collectives if not isinstance(c, Collective)]
        if unknown:
            raise TypeError(
                f"the spec {self.name!r} declares probed_collectives {unknown}; allowed: "
                f"{', '.join(f'Collective.{c.name}' for c in Collective)}"
            )
        own_name = self.settings.__dataclass_fields__["name"].default
        if own_name != self.name:
            raise TypeError(
                f"{self.settings.__name__}.name defaults to {own_name!r}, but the "
                f"spec is named {self.name!r}"
            )


def candidate_settings(
    asked: DistbenchConfig, settings: type[DistributionConfig], **values: object
) -> DistributionConfig:
    """A candidate's settings: the asked cell's batch size and backend, the asked cell's own
    settings where it is of this model (else the model's defaults), then `values`."""
    name = settings.__dataclass_fields__["name"].default
    own = asked.distribution.own_settings_raw() if asked.distribution.name == name else {}
    return settings(
        **{
            **own,
            "name": name,
            "batch_size": asked.distribution.batch_size,
            "backend": asked.distribution.backend,
            **values,
        }
    )


def candidate(
    asked: DistbenchConfig, settings: DistributionConfig, nodes: int, per_node: int
) -> DistbenchConfig:
    """The asked cell with another model's `settings` on `nodes` x `per_node` workers."""
    hardware = replace(asked.hardware, nodes=nodes, workers_per_node=per_node)
    return replace(asked, distribution=settings, hardware=hardware)


def at_every_count(
    settings: type[DistributionConfig],
) -> Callable[[DistbenchConfig, WorkerCounts], Iterator[DistbenchConfig]]:
    """`DistributionSpec.candidates` of a data-parallel model the recommender offers with one
    setting each (the asked cell's own, else the defaults) at every worker count."""

    def candidates(asked: DistbenchConfig, counts: WorkerCounts) -> Iterator[DistbenchConfig]:
        for nodes, per_node in counts:
            yield candidate(asked, candidate_settings(asked, settings), nodes, per_node)

    return candidates


def workers_label(name: str) -> Callable[[DistbenchConfig, StagePlan | None], str]:
    """`DistributionSpec.label` of a model whose label is its name and worker count."""

    def label(config: DistbenchConfig, plan: StagePlan | None) -> str:
        return f"{name} x{config.world_size}"

    return label
