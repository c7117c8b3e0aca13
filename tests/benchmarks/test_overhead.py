"""Benchmarks (pytest-benchmark; `-m perf`): what the harness itself costs.

1. Harness overhead: an epoch trained by the harness's sequential trainer (phase clocks and
   progress bar on) against a bare hand-written PyTorch loop on the same model, data and
   optimizer, in one process, interleaved round by round so that drift hits both alike.
   Target: under 1 %.
2. Loader headroom: images/s the synthetic loader delivers against images/s training consumes.
   Target: at least 10x, so that data loading never bounds a measurement.

Run: .venv/bin/python -m pytest tests/benchmarks -m perf --benchmark-enable -s
The figures are printed and attached to the benchmark JSON (extra_info); BENCHMARKS.md, "What the
harness itself adds", keeps them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pytest
import torch
from torch import nn

from harness.commands.compose import compose_config
from harness.config.schema import DistbenchConfig, validate
from harness.distributions.base import TrainingContext
from harness.distributions.loop import BatchLoopTrainer
from harness.measure.metrics import PhaseClock
from harness.runtime.distributed import Peers
from harness.runtime.workload import Workload, build_workload
from harness.system.worker_env import WorkerEnvironment

pytestmark = pytest.mark.perf

ROUNDS = 5  # loader benchmark rounds


def _config(*overrides: str) -> DistbenchConfig:
    return validate(compose_config(list(overrides)))


def _trainer(
    config: DistbenchConfig, workload: Workload, *, phase_timing: bool, progress: bool
) -> BatchLoopTrainer:
    """The harness's own trainer for one CPU worker, as `harness.worker.run.measure` builds it."""
    config.run.progress = progress
    device = torch.device("cpu")
    context = TrainingContext(
        config=config,
        workload=workload,
        device=device,
        clock=PhaseClock(device, enabled=phase_timing),
        peers=Peers(WorkerEnvironment(), backend=None),
        heartbeat=lambda: None,
    )
    return BatchLoopTrainer(context, workload.model)


def _bare_epoch(
    model: nn.Module, workload: Workload, optimizer: torch.optim.Optimizer, epoch: int
) -> float:
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


def _paired_rounds(
    first: Callable[[int], float], second: Callable[[int], float], rounds: int
) -> tuple[list[float], list[float]]:
    """Time `first` and `second` alternately, swapping their order every round (ABBA), so
    that drift and whatever else the machine does hit both alike."""
    a_seconds: list[float] = []
    b_seconds: list[float] = []
    for round_number in range(rounds):
        if round_number % 2 == 0:
            a_seconds.append(first(round_number))
            b_seconds.append(second(round_number))
        else:
            b_seconds.append(second(round_number))
            a_seconds.append(first(round_number))
    return a_seconds, b_seconds


def _report_overhead(
    benchmark,
    label: str,
    harness: list[float],  # noqa: ANN001
    bare: list[float],
    batches: int,
) -> None:
    ratios = sorted(h / b for h, b in zip(harness, bare))
    quartiles = statistics.quantiles(ratios, n=4)
    per_batch_us = 1e6 * (statistics.median(harness) - statistics.median(bare)) / batches
    benchmark.extra_info.update(
        harness_median_s=statistics.median(harness),
        bare_median_s=statistics.median(bare),
        overhead_median_pct=100 * (statistics.median(ratios) - 1),
        overhead_iqr_pct=[100 * (quartiles[0] - 1), 100 * (quartiles[2] - 1)],
        overhead_per_batch_us=per_batch_us,
    )
    print(
        f"\n[{label}] harness {statistics.median(harness):.4f} s/epoch, bare loop "
        f"{statistics.median(bare):.4f} s/epoch over {len(ratios)} paired rounds: overhead "
        f"median {100 * (statistics.median(ratios) - 1):+.2f} % (IQR "
        f"{100 * (quartiles[0] - 1):+.2f} .. {100 * (quartiles[2] - 1):+.2f} %), "
        f"{per_batch_us:+.0f} us per batch"
    )


def _measure_overhead(
    benchmark,
    config: DistbenchConfig,
    workload: Workload,  # noqa: ANN001
    rounds: int,
) -> tuple[list[float], list[float]]:
    trainer = _trainer(config, workload, phase_timing=True, progress=True)
    bare_optimizer = workload.make_optimizer(trainer.model.parameters())
    trainer.warm_up(3)
    _bare_epoch(trainer.model, workload, bare_optimizer, 0)  # warm the bare path too
    results: list[tuple[list[float], list[float]]] = []

    def measure() -> None:
        results.append(
            _paired_rounds(
                lambda epoch: trainer.train_epoch(epoch).seconds,
                lambda epoch: _bare_epoch(trainer.model, workload, bare_optimizer, epoch),
                rounds,
            )
        )

    benchmark.pedantic(measure, rounds=1, iterations=1)
    return results[0]


@pytest.mark.parametrize("network", ["resnet18", "mobilenetv2"])
def test_harness_overhead_against_a_bare_loop(benchmark, network: str) -> None:  # noqa: ANN001
    """A real network: the overhead as a share of the epoch (what the target is about)."""
    config = _config(
        "dataset=mnist",
        f"network={network}",
        "dataset.num_samples=256",
        "distribution.batch_size=32",
    )
    workload = build_workload(config)
    harness, bare = _measure_overhead(benchmark, config, workload, rounds=12)
    _report_overhead(benchmark, f"mnist/{network}", harness, bare, len(workload.loader))


def test_harness_overhead_per_batch_on_a_trivial_model(benchmark) -> None:  # noqa: ANN001
    """A model that costs almost nothing, so the harness's own per-batch cost (phase clocks,
    progress bar, device moves) stands out in microseconds instead of hiding in noise."""
    config = _config("dataset=mnist", "dataset.num_samples=8192", "distribution.batch_size=32")
    workload = build_workload(config)
    workload.model = nn.Sequential(nn.Flatten(1), nn.Linear(28 * 28, 10))
    harness, bare = _measure_overhead(benchmark, config, workload, rounds=20)
    _report_overhead(benchmark, "mnist/linear", harness, bare, len(workload.loader))


@pytest.mark.parametrize(
    ("dataset", "network"),
    [("mnist", "resnet18"), ("cifar10", "resnet18"), ("imagenet", "resnet50")],
)
def test_loader_outpaces_training(benchmark, dataset: str, network: str) -> None:  # noqa: ANN001
    batches = 4
    config = _config(
        f"dataset={dataset}",
        f"network={network}",
        f"dataset.num_samples={batches * (128 if dataset == 'mnist' else 64)}",
    )
    workload = build_workload(config)
    loader = workload.loader

    read_seconds: list[float] = []

    def read_epoch() -> None:
        loader.set_epoch(0)
        start = time.perf_counter()
        for _ in loader:
            pass
        read_seconds.append(time.perf_counter() - start)

    read_epoch()  # first read pages the cache in: a warm-up, as in training
    read_seconds.clear()
    benchmark.pedantic(read_epoch, rounds=ROUNDS, iterations=1)
    loader_rate = loader.samples_per_epoch / statistics.median(read_seconds)

    trainer = _trainer(config, workload, phase_timing=False, progress=False)
    trainer.warm_up(1)
    training_rate = statistics.median(
        [m.samples / m.seconds for m in (trainer.train_epoch(e) for e in range(2))]
    )
    benchmark.extra_info.update(
        loader_images_per_s=loader_rate,
        training_images_per_s=training_rate,
        headroom=loader_rate / training_rate,
    )
    print(
        f"\n[{dataset}/{network}] loader {loader_rate:,.0f} images/s, training "
        f"{training_rate:,.1f} images/s: {loader_rate / training_rate:,.0f}x headroom"
    )
