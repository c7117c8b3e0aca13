"""Evaluation of the trained network on the held-out split, after an epoch and outside its time.

MLPerf times training to a quality target and evaluates between epochs; the evaluation is part
of the time to target (`run_stop - run_start`) but not of an epoch's seconds. Every worker of a
cell evaluates a disjoint shard of the split (every `world_size`-th sample from its rank, the
last batch partial, so each sample is evaluated exactly once) with the whole network
(`Trainer.evaluation_model`: a pipeline worker gathers the other stages' weights first), and
the workers add up their sums, so every worker ends with the same accuracy and decides alike
whether the target is reached.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from harness.measure.metrics import synchronize
from harness.runtime.distributed import Peers
from workloads.datasets.loader import fetch_batch
from workloads.task import correct_predictions, prediction_count, task_loss

# Share of an epoch's samples evaluated when dataset.eval_samples is null: forward passes
# only, so about 1/30 of an epoch's compute, which keeps evaluation under 5 % of a cell's wall
# time (measured: BENCHMARKS.md, "Time to quality").
DEFAULT_EVAL_SHARE = 0.1


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of the network on the held-out split, summed over every worker."""

    # Mean cross entropy per prediction (an image's label, or a token position: then it is
    # the log perplexity, and exp(loss) the perplexity).
    loss: float
    accuracy: float  # share of predictions whose top-1 is the target, 0..1
    samples: int  # samples evaluated (all workers together)
    seconds: float  # wall time of the evaluation on this worker, gathering the weights included


def default_eval_samples(train_samples: int, split_size: int) -> int:
    """`dataset.eval_samples` when null: a tenth of the epoch, at most the split. No floor of
    a whole batch: on a tiny epoch (the smoke sweep's 256 images at batch 128) a batch would be
    half the epoch, and the last batch of an evaluation may be partial anyway."""
    return min(split_size, max(1, math.ceil(DEFAULT_EVAL_SHARE * train_samples)))


def evaluate(
    model: nn.Module,
    dataset: Dataset,
    *,
    batch_size: int,
    peers: Peers,
    device: torch.device,
    heartbeat: Callable[[], None] = lambda: None,
    started: float | None = None,
) -> Evaluation:
    """Evaluate `model` on this worker's shard of `dataset` and sum over every worker.

    `started` is when the evaluation began (before the weights were gathered), so that its
    seconds include that; the model is left in training mode.
    """
    started = time.perf_counter() if started is None else started
    loss_sum, correct, predictions, count = 0.0, 0, 0, 0
    model.eval()
    try:
        with torch.no_grad():
            for images, labels in _shard_batches(dataset, batch_size, peers):
                images, labels = images.to(device), labels.to(device)
                logits = model(images)
                loss_sum += float(task_loss(logits, labels, reduction="sum"))
                correct += correct_predictions(logits, labels)
                predictions += prediction_count(labels)
                count += len(labels)
                heartbeat()
    finally:
        model.train()
    synchronize(device)
    totals = np.sum(peers.all_gather((loss_sum, correct, predictions, count)), axis=0)
    predicted = max(int(totals[2]), 1)
    return Evaluation(
        loss=float(totals[0]) / predicted,
        accuracy=float(totals[1]) / predicted,
        samples=int(totals[3]),
        seconds=time.perf_counter() - started,
    )


def _shard_batches(
    dataset: Dataset, batch_size: int, peers: Peers
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This worker's samples of `dataset` in order, `batch_size` at a time (the last partial)."""
    indices = np.arange(len(dataset))[peers.env.rank :: peers.env.world_size]  # type: ignore[arg-type]
    for start in range(0, len(indices), batch_size):
        yield fetch_batch(dataset, indices[start : start + batch_size].tolist())
