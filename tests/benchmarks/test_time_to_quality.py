"""Benchmarks (`-m perf`): what training reaches, beside how fast it runs.

1. Time to quality per distribution model (statistical efficiency beside hardware efficiency):
   every model trains the same learnable synthetic workload to the same eval accuracy, 5
   repeats per model (seeds run.seed .. run.seed+4: each repeat its own initial weights and
   data order), and reports the epochs and seconds to the target: median, range, and MLPerf's
   olympic mean (the mean without the best and the worst). Cells run one at a time, each as
   `python -m harness` does.
2. What evaluation costs: the README's smoke cell (`+sweep=smoke`'s settings) with run.eval on
   and off, run alternately (ABBA) as whole `python -m harness` processes; the wall time's
   overhead (target: at most 5 %), and the evaluation's share of an epoch on a larger epoch.

Run: .venv/bin/python -m pytest tests/benchmarks/test_time_to_quality.py -m perf
     --benchmark-enable -s
The figures are printed and attached to the benchmark JSON (extra_info); BENCHMARKS.md, "Time to
quality", keeps them.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from tests.helpers import run_module

pytestmark = pytest.mark.perf

MODELS = ["sequential", "ddp", "horovod", "gpipe", "pipedream"]
REPEATS = 5
TARGET = 0.9
# The learnable workload: synthetic MNIST (a class pattern under the noise, see
# workloads/datasets/synthetic.py), ResNet-18, the global batch 32 for every model (two
# data-parallel workers train 16 each; a pipeline trains the whole 32, GPipe in 4
# micro-batches), SGD as configured by default.
WORKLOAD = [
    "dataset=mnist",
    "network=resnet18",
    "dataset.num_samples=1024",
    "dataset.eval_samples=512",
    "run.epochs=8",
    "run.warmup_batches=2",
    "run.progress=false",
    "hardware=local_2cpu",
    "tracking.enabled=false",
    f"run.target_accuracy={TARGET}",
    f"run.repeats={REPEATS}",
]
PER_MODEL = {
    "sequential": ["distribution.batch_size=32"],
    "ddp": ["distribution.batch_size=16"],
    "horovod": ["distribution.batch_size=16"],
    "gpipe": ["distribution.batch_size=32", "distribution.micro_batches=4"],
    "pipedream": ["distribution.batch_size=32"],
}
SMOKE_CELL = [
    "dataset=mnist",
    "network=resnet18",
    "dataset.num_samples=256",
    "run.epochs=2",
    "run.warmup_batches=1",
    "run.progress=false",
    "tracking.enabled=false",
]


def _cell(output_root: Path, overrides: list[str]) -> tuple[dict, float]:
    """Run one cell as a user does; its result.json and the command's wall time."""
    before = (
        set((output_root / "runs").glob("*/result.json"))
        if (output_root / "runs").exists()
        else set()
    )
    start = time.perf_counter()
    done = run_module(
        "harness",
        [f"run.output_dir={output_root}", *overrides],
        cwd=output_root.parent,
        timeout=3600,
    )
    wall = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = set((output_root / "runs").glob("*/result.json")) - before
    result = json.loads(path.read_text())
    assert result["status"] == "ok", result["error"]
    return result, wall


@pytest.mark.parametrize("model", MODELS)
def test_epochs_and_seconds_to_target(benchmark, tmp_path: Path, model: str) -> None:  # noqa: ANN001
    output_root = tmp_path / "outputs"
    results: list[dict] = []
    benchmark.pedantic(
        lambda: results.append(
            _cell(output_root, [f"distribution={model}", *WORKLOAD, *PER_MODEL[model]])[0]
        ),
        rounds=1,
        iterations=1,
    )
    result = results[0]
    repeats = result["repeats"]
    reached = [r for r in repeats if r["reached_target"]]
    epochs = [r["epochs_to_target"] for r in reached]
    seconds = [r["time_to_target_s"] for r in reached]
    metrics = result["metrics"]
    benchmark.extra_info.update(
        model=model,
        target=TARGET,
        repeats=len(repeats),
        reached=len(reached),
        epochs_to_target=epochs,
        time_to_target_s=seconds,
        seconds_per_epoch=metrics["seconds_per_epoch"],
        final_eval_accuracy=[r["eval_accuracy"] for r in repeats],
        time_to_target_s_olympic_mean=metrics.get("time_to_target_s_olympic_mean"),
        epochs_to_target_olympic_mean=metrics.get("epochs_to_target_olympic_mean"),
    )
    if reached:
        print(
            f"\n[{model}] reached {TARGET} in {len(reached)}/{len(repeats)} repeats; epochs "
            f"median {statistics.median(epochs)} (range {min(epochs)}-{max(epochs)}, olympic "
            f"mean {metrics.get('epochs_to_target_olympic_mean', float('nan')):.2f}); seconds "
            f"median {statistics.median(seconds):.1f} (range {min(seconds):.1f}-"
            f"{max(seconds):.1f}, olympic mean "
            f"{metrics.get('time_to_target_s_olympic_mean', float('nan')):.1f}); "
            f"{metrics['seconds_per_epoch']:.2f} s/epoch; per repeat epochs {epochs}"
        )
    else:
        print(
            f"\n[{model}] did not reach {TARGET} in {result['config']['run']['epochs']} "
            f"epochs in any repeat; final accuracies "
            f"{[round(r['eval_accuracy'], 3) for r in repeats]}"
        )


def test_evaluation_overhead_on_the_smoke_cell(benchmark, tmp_path: Path) -> None:  # noqa: ANN001
    """Whole processes, eval on and off alternately (ABBA), 6 rounds; the warm-up round (the
    synthetic splits generated into the cache) is not counted."""
    output_root = tmp_path / "outputs"
    _cell(output_root, SMOKE_CELL)  # generates both splits into the cache
    walls: dict[bool, list[float]] = {True: [], False: []}
    inside: list[dict] = []

    def measure() -> None:
        for round_number in range(6):
            order = (True, False) if round_number % 2 == 0 else (False, True)
            for evaluate in order:
                result, wall = _cell(output_root, [*SMOKE_CELL, f"run.eval={evaluate}"])
                walls[evaluate].append(wall)
                if evaluate:
                    inside.append(result["metrics"])

    benchmark.pedantic(measure, rounds=1, iterations=1)
    ratios = sorted(on / off for on, off in zip(walls[True], walls[False]))
    eval_share = [m["eval_seconds"] / m["seconds_per_epoch"] for m in inside]
    benchmark.extra_info.update(
        wall_eval_on_s=walls[True],
        wall_eval_off_s=walls[False],
        overhead_median_pct=100 * (statistics.median(ratios) - 1),
        overhead_range_pct=[100 * (ratios[0] - 1), 100 * (ratios[-1] - 1)],
        eval_seconds_per_epoch_share_pct=100 * statistics.median(eval_share),
    )
    print(
        f"\n[smoke cell] wall median {statistics.median(walls[True]):.2f} s with eval, "
        f"{statistics.median(walls[False]):.2f} s without: overhead median "
        f"{100 * (statistics.median(ratios) - 1):+.2f} % (range {100 * (ratios[0] - 1):+.2f}"
        f" .. {100 * (ratios[-1] - 1):+.2f} %); an evaluation takes "
        f"{100 * statistics.median(eval_share):.1f} % of an epoch's time"
    )


def test_evaluation_share_of_a_larger_epoch(benchmark, tmp_path: Path) -> None:  # noqa: ANN001
    """The default split (a tenth of the epoch) against the epoch it follows, on an epoch of
    8192 images, where start-up no longer dilutes it."""
    output_root = tmp_path / "outputs"
    results: list[dict] = []
    benchmark.pedantic(
        lambda: results.append(
            _cell(
                output_root,
                [
                    "dataset=mnist",
                    "network=resnet18",
                    "dataset.num_samples=8192",
                    "run.epochs=2",
                    "run.warmup_batches=2",
                    "run.progress=false",
                    "tracking.enabled=false",
                ],
            )
        ),
        rounds=1,
        iterations=1,
    )
    result, wall = results[0]
    metrics = result["metrics"]
    share = metrics["eval_seconds"] / metrics["seconds_per_epoch"]
    evaluations = metrics["eval_seconds"] * len(result["eval_accuracy"])
    benchmark.extra_info.update(
        eval_seconds=metrics["eval_seconds"],
        seconds_per_epoch=metrics["seconds_per_epoch"],
        eval_share_of_epoch_pct=100 * share,
        eval_share_of_wall_pct=100 * evaluations / wall,
        wall_s=wall,
    )
    print(
        f"\n[8192 images] evaluation {metrics['eval_seconds']:.2f} s "
        f"({metrics['eval_samples']:.0f} images) after an epoch of "
        f"{metrics['seconds_per_epoch']:.2f} s: "
        f"{100 * share:.1f} % of the epoch, {100 * evaluations / wall:.1f} % of the cell's "
        f"{wall:.1f} s wall time"
    )
