"""Benchmarks (pytest-benchmark; `-m perf`): what the harness itself costs.

1. Harness overhead: an epoch trained by the harness's sequential trainer (phase clocks and
   progress bar on) against a bare hand-written PyTorch loop on the same model, data and
   optimizer, in one process, interleaved round by round so that drift hits both alike.
   Target: under 1 %.
2. Loader headroom: images/s the synthetic loader delivers against images/s training consumes.
   Target: at least 10x, so that data loading never bounds a measurement.

Run: .venv/bin/python -m pytest tests/benchmarks -m perf --benchmark-enable -s
The figures are printed and attached to the benchmark JSON (extra_info); BENCHMARKS.md keeps them.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch import nn

from harness.compose import compose_config
from harness.config import validate
from harness.distributions.sequential import SequentialTrainer
from harness.metrics import PhaseClock
from harness.workload import Workload, build_workload

pytestmark = pytest.mark.perf

ROUNDS = 5


def _workload(*overrides: str) -> Workload:
    return build_workload(validate(compose_config(list(overrides))))


def _bare_epoch(model: nn.Module, workload: Workload, optimizer: torch.optim.Optimizer,
                epoch: int) -> float:
    """The loop a user would write by hand; what the harness must not slow down."""
    criterion = nn.CrossEntropyLoss()
    workload.loader.set_epoch(epoch)
    start = time.perf_counter()
    for images, labels in workload.loader:
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


@pytest.mark.parametrize("network", ["resnet18", "mobilenetv2"])
def test_harness_overhead_against_a_bare_loop(benchmark, network: str) -> None:  # noqa: ANN001
    workload = _workload("dataset=mnist", f"network={network}", "dataset.num_samples=512",
                         "distribution.batch_size=32")
    device = torch.device("cpu")
    trainer = SequentialTrainer(workload, device, PhaseClock(device, enabled=True), progress=True)
    bare_optimizer = workload.make_optimizer(trainer.model.parameters())
    trainer.warm_up(3)

    harness_seconds: list[float] = []
    bare_seconds: list[float] = []

    def one_round() -> None:
        epoch = len(harness_seconds)
        harness_seconds.append(trainer.train_epoch(epoch).seconds)
        bare_seconds.append(_bare_epoch(trainer.model, workload, bare_optimizer, epoch))

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    ratios = [h / b for h, b in zip(harness_seconds, bare_seconds)]
    overhead = statistics.median(ratios) - 1
    benchmark.extra_info.update(
        harness_median_s=statistics.median(harness_seconds),
        bare_median_s=statistics.median(bare_seconds),
        overhead_median_pct=100 * overhead,
        overhead_spread_pct=100 * (max(ratios) - min(ratios)),
    )
    print(f"\n[{network}] harness {statistics.median(harness_seconds):.3f} s/epoch, bare loop "
          f"{statistics.median(bare_seconds):.3f} s/epoch: overhead {100 * overhead:+.2f} % "
          f"(per-round ratios {', '.join(f'{r:.4f}' for r in ratios)})")


@pytest.mark.parametrize(("dataset", "network"), [("mnist", "resnet18"), ("cifar10", "resnet18"),
                                                  ("imagenet", "resnet50")])
def test_loader_outpaces_training(benchmark, dataset: str, network: str) -> None:  # noqa: ANN001
    batches = 4
    workload = _workload(f"dataset={dataset}", f"network={network}",
                         f"dataset.num_samples={batches * (128 if dataset == 'mnist' else 64)}")
    loader = workload.loader

    def read_epoch() -> int:
        loader.set_epoch(0)
        return sum(images.shape[0] for images, _ in loader)

    read_epoch()  # first read pages the cache in: a warm-up, as in training
    benchmark.pedantic(read_epoch, rounds=ROUNDS, iterations=1)
    loader_rate = loader.samples_per_epoch / benchmark.stats.stats.median

    device = torch.device("cpu")
    trainer = SequentialTrainer(workload, device, PhaseClock(device, enabled=False),
                                progress=False)
    trainer.warm_up(1)
    training_rate = statistics.median(
        [m.samples / m.seconds for m in (trainer.train_epoch(e) for e in range(2))])
    benchmark.extra_info.update(loader_images_per_s=loader_rate,
                                training_images_per_s=training_rate,
                                headroom=loader_rate / training_rate)
    print(f"\n[{dataset}/{network}] loader {loader_rate:,.0f} images/s, training "
          f"{training_rate:,.1f} images/s: {loader_rate / training_rate:,.0f}x headroom")
