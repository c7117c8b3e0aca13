"""Benchmark (pytest-benchmark; `-m perf`): pipelines against the ideal compute model of their
schedule, on a compute-bound network (VGG-11 on MNIST-sized images, CPU workers, one thread
each, so stages are compute-bound and activations cross localhost).

Ideal models, with T_seq the sequential (one worker, same thread count) time of one
micro-batch/minibatch's forward, backward and update, and W balanced stages:

- GPipe (Eq. 6.1): one batch of #mb micro-batches takes T_seq * #mb * (W + #mb - 1) / (W * #mb):
  the forward wave fills in W - 1 steps and drains, the backward wave likewise, each step a
  micro-batch on a stage (T_seq / W).
- 1F1B (PipeDream, no replication; its counterpart, derived here): with no flush between
  minibatches the pipeline fills and drains once per epoch, not once per batch. Each stage
  spends t_f + t_b = T_seq / W per minibatch; in steady state every stage is busy. The
  first minibatch reaches the last stage after (W - 1) t_f (fill) and the last gradient
  reaches the first stage (W - 1) t_b after the last stage's final backward (drain): each
  stage idles (W - 1)(t_f + t_b) = (W - 1) T_seq / W per epoch, as GPipe's stages idle per
  batch (forward and backward interleaved instead of in two waves). So an epoch of N minibatches
  takes (N + W - 1) * T_seq / W = T_seq * N * (W + N - 1) / (W * N): Eq. 6.1 with #mb = N,
  the epoch's minibatches; its bubble share (W - 1) / (N + W - 1) shrinks with the epoch.
  The ideal ignores what PipeDream adds per minibatch: a weight update per minibatch on every
  stage (counted in T_seq, which updates per minibatch too) and the weight snapshot that
  weight stashing clones per version (not in T_seq: it shows in the ratio).

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


def ideal_seconds(t_seq: float, workers: int, micro_batches: int) -> float:
    """Eq. 6.1 for `micro_batches` units of sequential time `t_seq` each on `workers` stages."""
    return t_seq * micro_batches * (workers + micro_batches - 1) / (workers * micro_batches)


def test_pipelines_against_their_ideal_compute_model(benchmark,  # noqa: ANN001
                                                    tmp_path: Path) -> None:
    figures: dict[str, float] = {}

    def measure() -> None:
        sequential = _cell(tmp_path, "sequential", "distribution=sequential",
                           f"distribution.batch_size={MICRO_BATCH}")
        t_seq = sequential["metrics"]["seconds_per_epoch"] / sequential["metrics"][
            "batches_per_epoch"]
        gpipe = _cell(tmp_path, "gpipe", "distribution=gpipe", "distribution.recompute=never",
                      f"distribution.batch_size={MICRO_BATCH * GPIPE_MICRO_BATCHES}",
                      f"distribution.micro_batches={GPIPE_MICRO_BATCHES}")
        gpipe_batch = gpipe["metrics"]["seconds_per_epoch"] / gpipe["metrics"][
            "batches_per_epoch"]
        pipedream = _cell(tmp_path, "pipedream", "distribution=pipedream",
                          "distribution.stages=1-1", f"distribution.batch_size={MICRO_BATCH}")
        minibatches = int(pipedream["metrics"]["batches_per_epoch"])
        figures.update(
            t_seq_s=t_seq,
            gpipe_batch_s=gpipe_batch,
            gpipe_ideal_s=ideal_seconds(t_seq, WORKERS, GPIPE_MICRO_BATCHES),
            pipedream_epoch_s=pipedream["metrics"]["seconds_per_epoch"],
            pipedream_ideal_s=ideal_seconds(t_seq, WORKERS, minibatches),
            gpipe_bubble_stage0=gpipe["metrics"].get("bubble_stage0", -1),
            gpipe_bubble_stage1=gpipe["metrics"].get("bubble_stage1", -1),
            pipedream_bubble_stage0=pipedream["metrics"].get("bubble_stage0", -1),
            pipedream_bubble_stage1=pipedream["metrics"].get("bubble_stage1", -1),
        )
        figures["gpipe_ratio"] = figures["gpipe_batch_s"] / figures["gpipe_ideal_s"]
        figures["pipedream_ratio"] = figures["pipedream_epoch_s"] / figures["pipedream_ideal_s"]

    benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update(figures)
    print(f"\n[pipeline efficiency] T_seq {figures['t_seq_s'] * 1e3:.1f} ms per {MICRO_BATCH} "
          f"images; GPipe {figures['gpipe_batch_s']:.3f} s/batch vs ideal "
          f"{figures['gpipe_ideal_s']:.3f} (ratio {figures['gpipe_ratio']:.3f}, bubbles "
          f"{figures['gpipe_bubble_stage0']:.2f}/{figures['gpipe_bubble_stage1']:.2f}); "
          f"PipeDream 1F1B {figures['pipedream_epoch_s']:.3f} s/epoch vs ideal "
          f"{figures['pipedream_ideal_s']:.3f} (ratio {figures['pipedream_ratio']:.3f}, bubbles "
          f"{figures['pipedream_bubble_stage0']:.2f}/{figures['pipedream_bubble_stage1']:.2f})")
    assert figures["gpipe_ratio"] > 0 and figures["pipedream_ratio"] > 0
