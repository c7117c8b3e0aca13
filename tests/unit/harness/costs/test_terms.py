"""Terms of the time models beyond the thesis' equations, each against values computed by hand:
GPipe's schedule over uneven stages with recomputation, the allreduces that cannot hide on
CPU workers sharing cores (each message with its latency), and the free parameters' form."""

from __future__ import annotations

import pytest

from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.costs.terms import (
    CellFacts,
    EpochTerms,
    LayerFacts,
    allreduce_seconds,
    communication_overlaps,
)
from harness.distributions.ddp import ddp_buckets
from harness.distributions.gpipe import Recompute, recompute_share
from harness.distributions.gpipe import equations as gpipe
from harness.distributions.horovod import BACKGROUND as HOROVOD_BACKGROUND
from harness.distributions.horovod import horovod_allreduces
from harness.predict.cell import epoch_terms
from harness.predict.parameters import RAW
from harness.profiles.hardware import AllreduceCost, Cost, HardwareProfile, Link


def test_gpipe_schedule_takes_the_slowest_stage_and_recomputes_forwards() -> None:
    stages = [
        gpipe.StageWork(forward_s=1.0, backward_s=2.0, update_s=0.5),
        gpipe.StageWork(forward_s=2.0, backward_s=3.0, update_s=0.2),
    ]
    # 4 micro-batches. Forward: 1 + 2 + 3 x max(1, 2) = 9. Backward with recomputation, per
    # stage (1 + 2, 2 + 3): 3 + 5 + 3 x 5 = 23. One update, both stages at once: 0.5.
    assert gpipe.schedule_seconds(stages, 4, recomputed=1.0) == pytest.approx(32.5)
    # Without recomputation the backward is (2, 3): 5 + 3 x 3 = 14.
    assert gpipe.schedule_seconds(stages, 4, recomputed=0.0) == pytest.approx(23.5)


def test_gpipe_schedule_with_equal_stages_is_eq_6_1() -> None:
    # 2 equal stages of a micro-batch step t = 6 s (forward 2, backward 4 in all), #mb = 4:
    # Eq. 6.1 with T_seq = 4 t = 24: 24 (2 + 4 - 1) / (2 x 4) = 15.
    stages = [gpipe.StageWork(1.0, 2.0, 0.0), gpipe.StageWork(1.0, 2.0, 0.0)]
    assert (
        gpipe.schedule_seconds(stages, 4, recomputed=0.0)
        == pytest.approx(24.0 * (2 + 4 - 1) / (2 * 4))
        == pytest.approx(15.0)
    )


def test_recompute_share_per_policy() -> None:
    assert recompute_share(Recompute.always, 4) == 1.0
    assert recompute_share(Recompute.except_last, 4) == 0.75
    assert recompute_share(Recompute.never, 4) == 0.0


def test_allreduce_messages_of_ddp_and_horovod() -> None:
    # DDP: a 1 MB first bucket, then 25 MB buckets: 44.7 MB -> 1 + ceil(43.7 / 25) = 3.
    assert ddp_buckets(44.7, 25.0) == 3
    assert ddp_buckets(0.5, 25.0) == 1
    # Horovod: a 0.35 s backward spans 350 cycles of 1 ms, more than the 62 tensors: one
    # allreduce per tensor. A 10 ms backward spans 10 cycles: 10 fused allreduces.
    assert horovod_allreduces(44.7, 62, 64.0, 1.0, 0.35) == 62
    assert horovod_allreduces(44.7, 62, 64.0, 1.0, 0.01) == 10
    # A gradient larger than the fusion threshold needs at least G / th buffers.
    assert horovod_allreduces(200.0, 62, 64.0, 1.0, 0.001) == 4


def _profile(*, measured_allreduce: bool) -> HardwareProfile:
    link = Link(0, 1, True, Cost(50e-6, 2000e6))
    allreduce = [AllreduceCost(2, Cost(100e-6, 1000e6))] if measured_allreduce else []
    return HardwareProfile("pair", "probe", 2, 1, [link], allreduce)


def test_allreduce_seconds_pays_a_latency_per_message() -> None:
    # The probe's allreduce among 2 workers: 3 messages x 100 us + 10 MB / 1000 MB/s.
    assert allreduce_seconds(_profile(measured_allreduce=True), 2, 10.0, 3) == pytest.approx(
        3e-4 + 0.01
    )
    # Without a measured allreduce, the ring over the link: per message of 10/3 MB,
    # 2 (W - 1) (50 us + (10/3) / 2 MB / 2000 MB/s).
    per_message = 2 * (50e-6 + (10 / 3) / 2 / 2000)
    assert allreduce_seconds(_profile(measured_allreduce=False), 2, 10.0, 3) == pytest.approx(
        3 * per_message
    )
    assert allreduce_seconds(_profile(measured_allreduce=True), 1, 10.0, 3) == 0.0


def _facts(step_seconds: float = 0.5) -> CellFacts:
    layers = [
        LayerFacts(
            weights_mb=5.0,
            activation_mb_per_sample=0.1,
            compute_share=0.5,
            forward_share=1 / 6,
            backward_share=1 / 3,
            update_share=0.0,
        )
    ] * 2
    return CellFacts(
        weights_mb=10.0,
        gradient_mb=10.0,
        input_mb_per_sample=0.01,
        layers=layers,
        step_seconds=step_seconds,
        step_batch=32,
        gradient_tensors=20,
    )


def test_ddp_on_cpu_workers_exposes_every_bucket_and_on_gpus_only_the_last() -> None:
    cpu = validate(
        compose_config(
            [
                "distribution=ddp",
                "hardware=local_2cpu",
                "distribution.batch_size=32",
                "dataset.num_samples=640",
            ]
        )
    )
    assert not communication_overlaps(cpu)
    terms = epoch_terms(cpu, _facts(), _profile(measured_allreduce=True))
    # 640 images, 2 workers x 32: 10 steps of 0.5 s; each step allreduces 10 MB in
    # 1 + ceil(9 / 25) = 2 buckets: 2 x 100 us + 10 MB / 1000 MB/s.
    assert terms.steps == 10 and terms.concurrent
    assert terms.compute_s == pytest.approx(5.0)
    assert terms.allreduce_s == pytest.approx(10 * (2e-4 + 0.01))
    assert terms.transfer_s == 0.0
    gpu = validate(
        compose_config(
            [
                "distribution=ddp",
                "hardware=titanrtx_cluster",
                "hardware.nodes=1",
                "hardware.workers_per_node=2",
                "distribution.batch_size=32",
                "dataset.num_samples=640",
            ]
        )
    )
    assert communication_overlaps(gpu)
    hidden = epoch_terms(gpu, _facts(), _profile(measured_allreduce=True))
    # Eq. 5.1: only the last bucket, min(G, 25 MB) = 10 MB, over the ring of the link:
    # 2 (W - 1) (50 us + 5 MB / 2000 MB/s).
    assert hidden.allreduce_s == pytest.approx(10 * 2 * (50e-6 + 5 / 2000))


def test_free_parameters_scale_their_own_terms_only() -> None:
    terms = EpochTerms(compute_s=10.0, allreduce_s=1.0, transfer_s=0.5, steps=4, concurrent=True)
    assert terms.seconds(RAW) == pytest.approx(11.5)
    assert terms.seconds({"contention": 1.2, "communication": 2.0}) == pytest.approx(15.0)
    # A model's own parameter is in the terms of that model only (Horovod's, declared in its
    # spec): the shared ones are every multi-worker model's.
    assert terms.coefficients() == {"contention": 10.0, "communication": 1.5}
    # Horovod on CPU workers: its background thread competes with all the step's compute.
    horovod = EpochTerms(
        10.0, 1.0, 0.0, 4, concurrent=True, model_terms=((HOROVOD_BACKGROUND, 10.0),)
    )
    assert horovod.coefficients()["horovod_background"] == 10.0
    assert horovod.seconds({"horovod_background": 0.3}) == pytest.approx(10.0 + 3.0 + 1.0)
