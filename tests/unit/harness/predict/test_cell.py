"""The performance models' equations against values computed by hand, through the path the
analysis and the recommender take (`harness.predict.cell.epoch_terms`)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.commands.compose import compose_config
from harness.config.schema import DistbenchConfig, validate
from harness.costs import allreduce, memory
from harness.costs.partition import StagePlan
from harness.costs.terms import CellFacts, LayerFacts, burst_bytes
from harness.distributions.gpipe import equations as gpipe
from harness.distributions.pipedream.equations import PipelineStage, boundary_seconds
from harness.predict.cell import epoch_terms
from harness.profiles.hardware import Cost, HardwareProfile, Link
from harness.worker import step_time as sequential


def _ring() -> HardwareProfile:
    """4 workers; the links of the ring 0-1-2-3-0 (latency s, bandwidth MB/s)."""

    def link(src: int, dst: int, latency_us: float, mbps: float) -> Link:
        return Link(src, dst, True, Cost(latency_us / 1e6, mbps * 1e6))

    return HardwareProfile(
        "ring",
        "config",
        4,
        1,
        [link(0, 1, 10, 1000), link(1, 2, 20, 500), link(2, 3, 10, 1000), link(0, 3, 50, 2000)],
    )


def _gpu_cell(distribution: str, *overrides: str, workers: int = 4) -> DistbenchConfig:
    """A cell of `workers` GPUs on one node: their allreduces overlap the backward pass
    (`predict.terms.communication_overlaps`), Eq. 5.1's premise."""
    return validate(
        compose_config(
            [
                f"distribution={distribution}",
                "hardware=titanrtx_cluster",
                "hardware.nodes=1",
                f"hardware.workers_per_node={workers}",
                "distribution.batch_size=32",
                *overrides,
            ]
        )
    )


def _replica_facts(gradient_mb: float, step_seconds: float = 0.5) -> CellFacts:
    """A network whose whole gradient is `gradient_mb` MB and whose step takes `step_seconds`."""
    layer = LayerFacts(weights_mb=gradient_mb, activation_mb_per_sample=0.1, compute_share=1.0)
    return CellFacts(
        weights_mb=gradient_mb,
        gradient_mb=gradient_mb,
        input_mb_per_sample=0.01,
        layers=[layer],
        step_seconds=step_seconds,
        step_batch=32,
    )


def test_horovod_eq_5_1_takes_the_slowest_ring_link_and_the_last_fused_buffer() -> None:
    # min(G=100, th=64) = 64 MB; steps of 64/4 = 16 MB; slowest link 1-2: 20 us + 16/500 s
    assert allreduce.ring_allreduce_seconds(_ring(), 4, 64) == pytest.approx(6 * 0.03202)
    cell = _gpu_cell("horovod", "distribution.fusion_threshold_mb=64", "dataset.num_samples=1024")
    terms = epoch_terms(cell, _replica_facts(100), _ring())
    # 1024 images, 32 per worker and step, 4 workers: 8 steps of one sequential step each
    assert terms.steps == 8
    # One layer: its 100 MB are ready only when the backward ends, one tensor above th sent
    # whole (predict.overlap): nothing hides it. Steps of 100/4 = 25 MB.
    assert terms.seconds() == pytest.approx(8 * (0.5 + 6 * (20e-6 + 25 / 500)))
    # Ten layers of 10 MB and a backward long enough: the first fused buffer (70 MB, filled by
    # the last seven layers) hides behind the backward of the first three; only the last
    # buffer (30 MB) is exposed, as Eq. 5.1 assumes.
    layers = [LayerFacts(weights_mb=10, activation_mb_per_sample=0.01, compute_share=0.1)] * 10
    deep = CellFacts(
        weights_mb=100,
        gradient_mb=100,
        input_mb_per_sample=0.01,
        layers=layers,
        step_seconds=10.0,
        step_batch=32,
    )
    assert epoch_terms(cell, deep, _ring()).seconds() == pytest.approx(
        8 * (10.0 + 6 * (20e-6 + 7.5 / 500))
    )
    # a gradient smaller than th is sent whole; th = 0 (no fusion) is bounded by G as well
    small = 8 * (0.5 + 6 * (20e-6 + 2 / 500))
    assert epoch_terms(cell, _replica_facts(8), _ring()).seconds() == pytest.approx(small)
    unfused = _gpu_cell("horovod", "distribution.fusion_threshold_mb=0", "dataset.num_samples=1024")
    assert epoch_terms(unfused, _replica_facts(8), _ring()).seconds() == pytest.approx(small)


def test_the_free_parameters_of_the_data_parallel_model() -> None:
    cell = _gpu_cell("horovod", "distribution.fusion_threshold_mb=64", "dataset.num_samples=1024")
    terms = epoch_terms(cell, _replica_facts(100), _ring())
    raw = terms.seconds()
    # contention scales the workers' compute, communication the allreduce
    tuned = terms.seconds({"contention": 1.1, "communication": 2.0})
    assert tuned == pytest.approx(8 * (1.1 * 0.5 + 2.0 * 6 * (20e-6 + 25 / 500)))
    assert raw < tuned
    # one worker has nothing to communicate, and its step is the probe itself: no parameter
    alone = _gpu_cell("horovod", "dataset.num_samples=1024", workers=1)
    assert epoch_terms(alone, _replica_facts(100), None).seconds(
        {"contention": 1.1, "communication": 2.0}
    ) == pytest.approx(32 * 0.5)


def test_ddp_is_eq_5_1_with_its_bucket_size() -> None:
    # Ten 10 MB layers, a backward long enough to hide every bucket but the last (the thesis'
    # regime): DDP's 25 MB buckets fill every three layers, the last one holds 10 MB.
    layers = [LayerFacts(weights_mb=10, activation_mb_per_sample=0.01, compute_share=0.1)] * 10
    facts = CellFacts(
        weights_mb=100,
        gradient_mb=100,
        input_mb_per_sample=0.01,
        layers=layers,
        step_seconds=10.0,
        step_batch=32,
    )
    ddp = epoch_terms(
        _gpu_cell("ddp", "distribution.bucket_cap_mb=25", "dataset.num_samples=1024"),
        facts,
        _ring(),
    )
    horovod_25 = epoch_terms(
        _gpu_cell("horovod", "distribution.fusion_threshold_mb=25", "dataset.num_samples=1024"),
        facts,
        _ring(),
    )
    assert ddp.seconds() == pytest.approx(horovod_25.seconds())
    assert ddp.seconds() == pytest.approx(8 * (10.0 + 6 * (20e-6 + 2.5 / 500)))


def test_gpipe_eq_6_2_communication() -> None:
    # W=4, #mb=8, c = (1, 3, 2): filling max(c1) + max(c1,c2) = 4; full (8-2) * 3 = 18;
    # draining max(c2,c3) + max(c3) = 5; times 2 = 54
    assert gpipe.communication_seconds([1, 3, 2], 8) == pytest.approx(54)
    assert gpipe.communication_seconds([2], 4) == pytest.approx(2 * 4 * 2)  # W=2: #mb steps
    assert gpipe.communication_seconds([], 4) == 0


def test_gpipe_eq_6_1_and_6_2_over_an_epoch() -> None:
    # 4 equal one-layer stages; a sequential step of one micro-batch (4 images) takes 1 s:
    # forward 1/3, backward 2/3, no update. 320 images in batches of 32 = 8 micro-batches.
    cell = _gpu_cell(
        "gpipe",
        "distribution.micro_batches=8",
        "distribution.recompute=never",
        "dataset.num_samples=320",
    )
    out_mb = [0.5, 0.25, 0.1, 0.01]  # each stage's output per sample
    layers = [
        LayerFacts(
            weights_mb=1.0,
            activation_mb_per_sample=mb,
            compute_share=0.25,
            forward_share=1 / 12,
            backward_share=1 / 6,
        )
        for mb in out_mb
    ]
    facts = CellFacts(
        weights_mb=4.0,
        gradient_mb=4.0,
        input_mb_per_sample=0.01,
        layers=layers,
        step_seconds=1.0,
        step_batch=4,
        plan=StagePlan.of([1, 1, 1, 1]),
    )
    costs = gpipe.link_costs(out_mb[:-1], 4, _ring())
    assert costs == pytest.approx([10e-6 + 2 / 1000, 20e-6 + 1 / 500, 10e-6 + 0.4 / 1000])
    terms = epoch_terms(cell, facts, _ring())
    # Eq. 6.1 with T_seq = 8 micro-batches x 1 s: 8 (4 + 8 - 1) / (4 x 8), per batch; 10 batches
    assert terms.steps == 10
    assert terms.compute_s == pytest.approx(10 * 8.0 * 11 / 32)
    assert terms.transfer_s == pytest.approx(10 * gpipe.communication_seconds(costs, 8))
    assert terms.seconds() == pytest.approx(terms.compute_s + terms.transfer_s)
    # transfers hidden entirely behind compute leave Eq. 6.1 alone
    assert terms.seconds({"communication": 0.0}) == pytest.approx(10 * 8.0 * 11 / 32)


def test_an_emulated_links_bucket_lets_a_small_transfer_through_at_once() -> None:
    """tbf's bucket (`hardware.link.burst_kb`, 256 KB) passes a message up to its size at once
    once it has refilled; the rest goes at the rate. Real links have none."""
    emulated = validate(
        compose_config(
            [
                "distribution=gpipe",
                "hardware=emulated_2nodes_100mbit",
                "distribution.batch_size=32",
                "distribution.micro_batches=4",
                "distribution.recompute=never",
                "dataset.num_samples=320",
            ]
        )
    )
    bucket = 256 * 1024
    assert burst_bytes(emulated) == bucket
    assert burst_bytes(validate(compose_config(["hardware=local_2cpu"]))) == 0.0
    # Micro-batches of 4: 4 x 0.05 MB = 200 KB fit the bucket (the latency only); 4 x 0.5 MB
    # = 2 MB leave 2 MB - 256 KB for the link's 500 MB/s.
    assert gpipe.link_costs([0.05, 0.5], 4, _ring(), burst_bytes=bucket) == pytest.approx(
        [10e-6, 20e-6 + (2e6 - bucket) / 500e6]
    )
    stages = [
        PipelineStage(compute_s=1.0, replicas=1, weights_mb=1.0, output_mb=mb)
        for mb in (0.2, 2.0, 0.0)
    ]
    assert boundary_seconds(stages, _ring(), burst_bytes=bucket) == pytest.approx(
        [10e-6, 20e-6 + (2e6 - bucket) / 500e6]
    )
    # Through the cell: VGG-like boundaries of 8 x 0.01 MB cost the latency alone.
    layers = [
        LayerFacts(
            weights_mb=1.0,
            activation_mb_per_sample=0.01,
            compute_share=0.5,
            forward_share=1 / 6,
            backward_share=1 / 3,
        )
    ] * 2
    facts = CellFacts(
        weights_mb=2.0,
        gradient_mb=2.0,
        input_mb_per_sample=0.01,
        layers=layers,
        step_seconds=1.0,
        step_batch=8,
        plan=StagePlan.of([1, 1]),
    )
    terms = epoch_terms(emulated, facts, _ring())
    assert terms.transfer_s == pytest.approx(terms.steps * gpipe.communication_seconds([10e-6], 4))


def test_memory_per_worker() -> None:
    # weights + gradients + momentum (3 x 100) + fusion buffer 64 + 32 x 2 MB of activations
    # (the terms one by one: tests/unit/harness/costs/test_memory.py)
    stage = memory.StageFacts(weights_mb=100, saved_mb_per_sample=2.0)
    worker = memory.data_parallel_memory(100, 100, stage, 32, buffer_mb=64)
    assert worker.total == 428
    assert memory.fits([428, 300], 0.5) and not memory.fits([428, 600], 0.5)
    assert memory.fits([10**9], None)


def test_the_sequential_epoch_is_the_measured_step_once_per_full_batch() -> None:
    # T_seq as the harness trains: the last, partial batch is never trained, so 1000 images in
    # batches of 32 are 31 steps (one worker of any model is the same)
    for distribution in ("sequential", "ddp"):
        cell = validate(
            compose_config(
                [
                    f"distribution={distribution}",
                    "dataset.num_samples=1000",
                    "distribution.batch_size=32",
                ]
            )
        )
        assert cell.world_size == 1
        terms = epoch_terms(cell, _replica_facts(10, step_seconds=0.5), None)
        assert terms.steps == 31 and terms.seconds() == pytest.approx(0.5 * 31)


def test_the_sequential_model_extrapolates_measured_batches(tmp_path) -> None:  # noqa: ANN001
    config = validate(
        compose_config(
            [
                "dataset=mnist",
                "network=mobilenetv2",
                "hardware.cpu_threads=1",
                f"dataset.cache_dir={tmp_path}",
            ]
        )
    )
    timing = sequential.measure_batch_seconds(
        config, batch_size=8, probe_batches=3, warmup_batches=1
    )
    assert timing.batch_size == 8 and timing.batches == 3
    assert 0 < timing.median_s < 10 and timing.std_s >= 0


def test_the_probe_warms_up_once_a_long_step_has_run_and_stops_timing_once_steady() -> None:
    from harness.measure.timing_rule import ProbeLength

    length = ProbeLength(warmup_batches=4, probe_batches=5, spread=0.02)
    # A 5-second step: one warm-up step, then three timed steps within 2 % are enough.
    assert length.warmup_count([5.9]) == 1
    assert not length.enough([5.9, 5.5, 5.48])
    assert length.enough([5.9, 5.5, 5.48, 5.56])
    assert length.timed([5.9, 5.5, 5.48, 5.56]) == [5.5, 5.48, 5.56]
    # Spread over 2 %: on to the most asked for.
    assert not length.enough([5.9, 5.0, 5.5, 6.0])
    assert not length.enough([5.9, 5.0, 5.5, 6.0, 5.2])
    assert length.enough([5.9, 5.0, 5.5, 6.0, 5.2, 5.4])
    # Short steps warm up for every batch asked for (under a second in all), then time 5.
    short = [0.18, 0.11, 0.11, 0.11]
    assert length.warmup_count(short[:3]) is None and length.warmup_count(short) == 4
    assert not length.enough(short + [0.11, 0.11])
    assert length.enough(short + [0.11, 0.11, 0.11])
    # Spread 0 always times every batch asked for; fewer asked than 3: that many.
    assert not ProbeLength(1, 5).enough([5.9, 5.5, 5.5, 5.5, 5.5])
    assert ProbeLength(0, 2, 0.02).enough([5.0, 9.0])


def _uniform(workers: int, latency_us: float = 10, mbps: float = 1000) -> HardwareProfile:
    return HardwareProfile(
        "uniform",
        "config",
        workers,
        1,
        [
            Link(i, j, True, Cost(latency_us / 1e6, mbps * 1e6))
            for i in range(workers)
            for j in range(i + 1, workers)
        ],
    )


def test_pipedream_epoch_is_pipeline_depth_plus_the_bottleneck_interval() -> None:
    from harness.distributions.pipedream.equations import PipelineStage, epoch_split

    # Stage 0 on workers 0-1 (8 MB of weights, 1 MB out), stage 1 on worker 2.
    # c = 10 us + 1 MB / 1000 MB/s = 1.01 ms; stage 0's replicas allreduce 8 MB:
    # 2 (2-1) (10 us + 4 MB / 1000 MB/s) = 8.02 ms; x_0 = 2c + 8.02 ms, x_1 = 2c.
    stages = [PipelineStage(0.2, 2, 8.0, 1.0), PipelineStage(0.3, 1, 4.0, 0.0)]
    split = epoch_split(stages, 10, _uniform(3))
    # I_0 = (0.2 + 10.04 ms) / 2 < I_1 = 0.3 + 2.02 ms: stage 1 is the bottleneck.
    assert split.compute_s == pytest.approx(0.2 + 0.3 + 9 * 0.3)
    assert split.communication_s == pytest.approx(2 * 0.00101 + 9 * 0.00202)
    # Make the replicated stage the bottleneck: its interval is halved by its two replicas.
    # Each replica trains 5 of the 10 minibatches one after another, the first two together:
    # the depth, then 4 more of a replica's periods; 5 allreduces each (the depth has none).
    stages[0] = PipelineStage(0.8, 2, 8.0, 1.0)
    split = epoch_split(stages, 10, _uniform(3))
    assert split.compute_s == pytest.approx(0.8 + 0.3 + 4 * 0.8)
    assert split.communication_s == pytest.approx(2 * 0.00101 + 4 * 2 * 0.00101 + 5 * 0.00802)
    assert split.seconds == pytest.approx(split.compute_s + split.communication_s)
    assert epoch_split(stages, 0, _uniform(3)).seconds == 0.0
    # What the bottleneck's replica flattens for its allreduces: its 8 MB, for each of its 5
    # minibatches; an unreplicated bottleneck flattens nothing.
    assert split.flattened_mb == pytest.approx(5 * 8.0)
    assert (
        epoch_split(
            [PipelineStage(0.2, 1, 8.0, 1.0), PipelineStage(0.3, 1, 4.0, 0.0)], 10, _uniform(2)
        ).flattened_mb
        == 0.0
    )


def test_pipedreams_flattening_is_its_own_term_on_cpu_workers() -> None:
    """A replicated stage's gradients flattened into its replicas' one message and back, per
    ms of `pipedream_flatten` per MB: the weights of the stage, once per minibatch of a
    replica; prior 0 keeps the raw equation; none without replicas or on GPUs."""
    from harness.distributions.pipedream import FLATTEN
    from harness.distributions.registry import spec_named

    pipedream = spec_named("pipedream")
    layer = LayerFacts(weights_mb=15.0, activation_mb_per_sample=0.1, compute_share=0.5)
    facts = CellFacts(
        weights_mb=30.0,
        gradient_mb=30.0,
        input_mb_per_sample=0.01,
        layers=[layer, layer],
        step_seconds=1.0,
        step_batch=32,
        plan=StagePlan.of([2], [2]),
    )

    def flatten_s(*overrides: str, plan: StagePlan = facts.plan) -> float:
        config = validate(
            compose_config(
                [
                    "distribution=pipedream",
                    "hardware=local_2cpu",
                    "distribution.batch_size=32",
                    "dataset.num_samples=512",
                    *overrides,
                ]
            )
        )
        terms = pipedream.epoch_terms(
            config,
            dataclasses.replace(facts, plan=plan),
            HardwareProfile.from_config(config.hardware),
        )
        assert terms.seconds() == terms.seconds({FLATTEN.name: FLATTEN.prior})
        return terms.coefficients().get(FLATTEN.name, 0.0)

    assert FLATTEN in pipedream.free_parameters and FLATTEN.prior == 0.0
    # 16 minibatches of 32, 8 a replica, 30 MB each: 240 MB, seconds per ms per MB
    assert flatten_s("distribution.stages=2") == pytest.approx(8 * 30.0 / 1000)
    assert flatten_s("distribution.stages=straight", plan=StagePlan.of([1, 1])) == 0.0
    assert flatten_s("distribution.stages=2", "hardware.device=cuda") == 0.0
