"""Benchmark (pytest-benchmark; `-m perf`): pipelines against the ideal compute model of their
schedule, on a compute-bound network (VGG-11 on MNIST-sized images, CPU workers, one thread
each, so stages are compute-bound and activations cross localhost).

Ideal models. From a sequential cell (one worker, same thread count) at the micro-batch
size: t_fb, the seconds of one micro-batch's data, forward and backward, and t_up, one update
of the whole model's weights. W balanced stages.

- GPipe (Eq. 6.1 with T_seq = #mb * t_fb, plus the update): one batch of #mb micro-batches
  takes T_seq * (W + #mb - 1) / (W * #mb) + t_up / W: the forward wave fills in W - 1 steps
  and drains, the backward wave likewise, each step one micro-batch on one stage (t_fb / W);
  then each stage updates its own share of the weights, all at once.
- 1F1B (PipeDream, no replication; its counterpart, derived here): PipeDream updates every
  stage after every minibatch, so take T_seq = t_fb + t_up per minibatch. With no flush
  between minibatches the pipeline fills and drains once per epoch, not once per batch. Each
  stage spends t_f + t_b + t_u = T_seq / W per minibatch; in steady state every stage is
  busy. The first minibatch reaches the last stage after (W - 1) t_f (fill) and the last
  gradient reaches the first stage (W - 1)(t_b + t_u) after the last stage's final backward
  (drain): each stage idles (W - 1) T_seq / W per epoch, as GPipe's stages idle per batch
  (forward and backward interleaved instead of in two waves). So an epoch of N minibatches
  takes (N + W - 1) * T_seq / W = T_seq * N * (W + N - 1) / (W * N): Eq. 6.1 with #mb = N,
  the epoch's minibatches; its bubble share (W - 1) / (N + W - 1) shrinks with the epoch.
  The ideal leaves out what weight stashing adds: a snapshot of the stage's weights cloned
  per weight version; it shows in the ratio.

Each figure is measured by running the cells as a user would (`python -m harness ...`):
seconds per epoch of the pipeline cell against the ideal from a sequential cell at the
micro-batch size. Ratio = measured / ideal; 1.0 is ideal, the target is within 1.10 where
communication is negligible. GPipe runs with `recompute=never` here (the ideal has no
recomputation; `always` adds one more forward per micro-batch).

Run: .venv/bin/python -m pytest tests/benchmarks/test_pipeline_efficiency.py -m perf \\
     --benchmark-enable -s
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_module

pytestmark = pytest.mark.perf

WORKERS = 2
MICRO_BATCH = 8  # images per micro-batch (GPipe) and per minibatch (PipeDream)
GPIPE_MICRO_BATCHES = 8
SAMPLES = 512  # 64 sequential batches, 8 GPipe batches, 64 PipeDream minibatches per epoch
COMMON = ["network=vgg11", "dataset=mnist", "hardware=local_2cpu",
          f"dataset.num_samples={SAMPLES}", "run.epochs=3", "run.warmup_batches=2",
          "run.progress=false", "tracking.enabled=false"]


def _cell(root: Path, name: str, *overrides: str) -> dict:
    output = root / name
    done = run_module("harness", [*COMMON, *overrides, f"run.output_dir={output}"], cwd=root,
                      timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (output / "runs").glob("*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok", result["error"]
    return result


def ideal_seconds(t_unit: float, workers: int, micro_batches: int) -> float:
    """Eq. 6.1 for `micro_batches` units of sequential time `t_unit` each on `workers` stages."""
    return t_unit * micro_batches * (workers + micro_batches - 1) / (workers * micro_batches)


def test_pipelines_against_their_ideal_compute_model(benchmark,  # noqa: ANN001
                                                    tmp_path: Path) -> None:
    figures: dict[str, Any] = {}

    def measure() -> None:
        sequential = _cell(tmp_path, "sequential", "distribution=sequential",
                           f"distribution.batch_size={MICRO_BATCH}")
        batches = sequential["metrics"]["batches_per_epoch"]
        phases = {phase: sequential["metrics"][f"{phase}_seconds_per_epoch"] / batches
                  for phase in ("data", "forward", "backward", "optimizer")}
        t_fb = phases["data"] + phases["forward"] + phases["backward"]
        t_up = phases["optimizer"]
        gpipe = _cell(tmp_path, "gpipe", "distribution=gpipe", "distribution.recompute=never",
                      f"distribution.batch_size={MICRO_BATCH * GPIPE_MICRO_BATCHES}",
                      f"distribution.micro_batches={GPIPE_MICRO_BATCHES}")
        gpipe_batch = gpipe["metrics"]["seconds_per_epoch"] / gpipe["metrics"][
            "batches_per_epoch"]
        pipedream = _cell(tmp_path, "pipedream", "distribution=pipedream",
                          "distribution.stages=1-1", f"distribution.batch_size={MICRO_BATCH}")
        minibatches = int(pipedream["metrics"]["batches_per_epoch"])
        figures.update(
            t_fb_s=t_fb, t_up_s=t_up,
            gpipe_batch_s=gpipe_batch,
            gpipe_ideal_s=ideal_seconds(t_fb, WORKERS, GPIPE_MICRO_BATCHES) + t_up / WORKERS,
            pipedream_epoch_s=pipedream["metrics"]["seconds_per_epoch"],
            pipedream_ideal_s=ideal_seconds(t_fb + t_up, WORKERS, minibatches),
            gpipe_balance=str(gpipe["config"]["distribution"]["balance"]),
            pipedream_balance=str(pipedream["config"]["distribution"]["balance"]),
            gpipe_bubble_stage0=gpipe["metrics"].get("bubble_stage0", -1),
            gpipe_bubble_stage1=gpipe["metrics"].get("bubble_stage1", -1),
            pipedream_bubble_stage0=pipedream["metrics"].get("bubble_stage0", -1),
            pipedream_bubble_stage1=pipedream["metrics"].get("bubble_stage1", -1),
        )
        figures["gpipe_ratio"] = figures["gpipe_batch_s"] / figures["gpipe_ideal_s"]
        figures["pipedream_ratio"] = figures["pipedream_epoch_s"] / figures["pipedream_ideal_s"]

    benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update(figures)
    f = figures
    print(f"\n[pipeline efficiency] t_fb {f['t_fb_s'] * 1e3:.1f} ms per {MICRO_BATCH} images, "
          f"t_up {f['t_up_s'] * 1e3:.1f} ms\n"
          f"  GPipe {f['gpipe_balance']}: {f['gpipe_batch_s']:.3f} s/batch vs ideal "
          f"{f['gpipe_ideal_s']:.3f}: ratio {f['gpipe_ratio']:.3f} (bubbles "
          f"{f['gpipe_bubble_stage0']:.2f}/{f['gpipe_bubble_stage1']:.2f})\n"
          f"  PipeDream 1F1B {f['pipedream_balance']}: {f['pipedream_epoch_s']:.3f} s/epoch vs "
          f"ideal {f['pipedream_ideal_s']:.3f}: ratio {f['pipedream_ratio']:.3f} (bubbles "
          f"{f['pipedream_bubble_stage0']:.2f}/{f['pipedream_bubble_stage1']:.2f})")
    assert figures["gpipe_ratio"] > 0 and figures["pipedream_ratio"] > 0
