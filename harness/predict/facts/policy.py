"""What a command allows the facts cache to do: how long a probe times, whether it may time here,
where the facts file and the MLflow store are, which kept facts it may reuse and which it may
measure again. Frozen: a command decides it once, from its flags; `FactsPolicy` checks the
flags a user types (`--probe-batches`, `--probe-spread`) as config keys are checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.config.schema import ConfigError, DistbenchConfig
from harness.measure.timing_rule import STEADY_SPREAD
from harness.predict.facts.store import facts_path


@dataclass(frozen=True)
class FactsPolicy:
    """The rules of one analysis, recommendation or dry run for gathering facts."""

    # The sequential probe's timed batches, at most (`--probe-batches`); a kept step time
    # counts only where its probe was asked for at least this many.
    probe_batches: int = 5
    # Fewer once the timed batches' interquartile range is within this share of their median
    # (`harness.measure.timing_rule.ProbeLength`; 0: always `probe_batches`).
    probe_spread: float = STEADY_SPREAD
    # False: never time a step here, take step times from earlier measurements (facts file,
    # MLflow) even where this machine has the device; absent devices are never probed.
    probe: bool = True
    # Where facts/<hardware>.json is; None: each config's run.output_dir.
    facts_root: Path | None = None
    # The MLflow store whose sequential cells give step times; None: each config's own
    # (`tracking.uri`, else run.output_dir's). An analysis names the store it reads: its cells'
    # recorded configs name the store they were measured into, which may have moved since.
    tracking_uri: str | None = None
    # Memory facts: what autograd saves per layer and a worker's runtime share; False
    # measures and reads neither (the memory model then falls back to layer outputs and no
    # runtime share).
    measure_memory: bool = True
    # True: a step time, layer profile or runtime share the facts file holds for this
    # machine's device is used as it is (the recommender, unless `--remeasure`); False: what
    # is needed is measured here again (and replaces the file's). Step times from another
    # device never count: this one's may differ.
    reuse: bool = False
    # Batches whose kept step time is not reused even with `reuse`: timed here again (the
    # recommender's, where two kept step times contradict each other: `steps.contradicting`).
    remeasure_batches: frozenset[int] = frozenset()
    # True: a pipeline whose planner asks for it (`StagePlanner.timed_in_place`) has its stages
    # timed in place where the facts file holds none (`python -m harness.stage_timing`, seconds
    # a plan: the analysis); False: only kept timings are used (the recommender, whose many
    # candidate plans would each take a short training run).
    time_in_place: bool = False
    # True: a step time at a batch the grid's own one-worker cells ran at comes from those
    # cells (MLflow), before the facts file and the probe: a network's step measured minutes
    # from its other cells, as long as they ran, rather than a probe's few batches at another
    # time (`harness.analysis` judges the models that way too, beside the probe's judgement).
    steps_from_cells: bool = False

    def __post_init__(self) -> None:
        """Refuse a probe length a user typed that no probe can run, in one line naming the
        flag (`ConfigError`: exit status 2, before anything is measured)."""
        if self.probe_batches < 1:
            raise ConfigError(f"--probe-batches={self.probe_batches} is invalid: must be 1 or more")
        if not 0 <= self.probe_spread < 1:  # also refuses NaN
            raise ConfigError(
                f"--probe-spread={self.probe_spread} is invalid: allowed 0 (time every "
                f"batch of --probe-batches) up to, not including, 1"
            )

    def facts_file(self, config: DistbenchConfig) -> Path:
        """The facts file of `config`'s hardware under `facts_root`, else its run.output_dir."""
        root = self.facts_root if self.facts_root is not None else Path(config.run.output_dir)
        return facts_path(root, config.hardware.name)
