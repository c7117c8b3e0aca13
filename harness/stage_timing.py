"""`python -m harness.stage_timing CELL_CONFIG OUT`: time a pipeline cell's stages in place.

A pipeline's stage does not run as fast as its layers' share of one sequential step says: in its own
process, holding only its own weights, with its own recomputation, a stage's forward and backward
came out up to 23 % slower or 12 % faster than those shares (GPipe on the emulated calibration:
docs/benchmarks/2026-11-29-gpipe-stages-in-place.md, "Where GPipe's stages spend their time,
measured in place (2026-11-29)"). So the analysis times them as the pipeline runs them: this command
trains the cell `CELL_CONFIG` (a resolved config, YAML) for a few batches on this machine, every
stage a worker process of its own (the cell's workers on one node, each with the cell's threads; no
link shaped, nothing recorded in MLflow), and writes what each stage spent per micro-batch in each
phase (`<phase>_seconds_per_epoch_stage<k>` of the cell's record) to OUT (JSON,
`harness.profiles.stages.InPlaceStages`). The links between the stages are the models' business;
only the compute is taken from here.

The analysis runs it in a process of its own (`harness.worker.measurements`), which keeps the
launchers out of the prediction's and the worker's imports; it is not a command a user needs to
type.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from dataclasses import replace
from pathlib import Path

from harness.cli.bad_input import exit_on_bad_input
from harness.cli.errors import command
from harness.config.schema import DistbenchConfig
from harness.measure.steadiness import machine_speed_ms
from harness.profiles.stages import InPlaceStages, StageSeconds
from harness.records.recorded_runs import config_file

# Batches timed after the warm-up: each batch runs every micro-batch through every stage.
TIMED_BATCHES = 3
WARMUP_BATCHES = 1
TIMEOUT_MIN = 15


def in_place_config(config: DistbenchConfig, output_dir: Path) -> DistbenchConfig:
    """The cell, shortened, on this machine: its workers on one node, no link to shape, a few
    batches of one epoch, nothing evaluated or recorded beyond its result."""
    batch = config.batch_size
    hardware = replace(
        config.hardware, nodes=1, workers_per_node=config.world_size, link=None, one_host=False
    )
    run = replace(
        config.run,
        epochs=1,
        repeats=1,
        warmup_batches=WARMUP_BATCHES,
        eval=False,
        progress=False,
        target_accuracy=None,
        output_dir=str(output_dir),
    )
    dataset = replace(config.dataset, num_samples=batch * (WARMUP_BATCHES + TIMED_BATCHES))
    return replace(
        config,
        hardware=hardware,
        run=run,
        dataset=dataset,
        tracking=replace(config.tracking, enabled=False),
    )


def stages_from_metrics(metrics: dict[str, float], stages: int) -> InPlaceStages:
    """Each stage's phases per micro-batch, from a pipeline cell's record."""
    batches = metrics["batches_per_epoch"]
    micro_batches = metrics.get("micro_batches", 1.0)

    def per(phase: str, stage: int, units: float) -> float:
        return metrics.get(f"{phase}_seconds_per_epoch_stage{stage}", 0.0) / units

    timed = tuple(
        StageSeconds(
            per("forward", k, batches * micro_batches),
            per("backward", k, batches * micro_batches),
            per("optimizer", k, batches),
        )
        for k in range(stages)
    )
    reference = machine_speed_ms(metrics)
    return InPlaceStages(timed, reference, dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))


def time_stages(config: DistbenchConfig, output_dir: Path) -> InPlaceStages:
    """Train `config` in place (`in_place_config`) and read its stages' phases."""
    from omegaconf import OmegaConf

    from launchers.local import run_local_cell

    short = in_place_config(config, output_dir)
    outcome = run_local_cell(
        OmegaConf.structured(short), output_dir, workers=short.world_size, timeout_min=TIMEOUT_MIN
    )
    if outcome.get("status") != "ok":
        raise RuntimeError(
            f"the stages of {config.run_name} could not be timed in place: "
            f"{outcome.get('status')}: {outcome.get('error')}"
        )
    plan_stages = len(outcome["config"]["distribution"].get("balance") or [])
    return stages_from_metrics(outcome["metrics"], plan_stages or short.world_size)


def parser() -> argparse.ArgumentParser:
    described = argparse.ArgumentParser(
        prog="python -m harness.stage_timing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    described.add_argument("cell_config", type=Path, help="the cell's resolved config (YAML)")
    described.add_argument("out", type=Path, help="where the stages' seconds go (JSON)")
    return described


@command
def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    with exit_on_bad_input():
        config = config_file(args.cell_config)
    timed = time_stages(config, args.out.parent / f"{args.out.stem}-cell")
    args.out.write_text(json.dumps(timed.to_json(), indent=1))


if __name__ == "__main__":
    main()
