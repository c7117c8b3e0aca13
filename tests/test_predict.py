"""The performance models' equations against values computed by hand."""

from __future__ import annotations

import pytest

from harness.compose import compose_config
from harness.config import validate
from harness.hardware_profile import Cost, HardwareProfile, Link
from harness.predict import ddp, gpipe, horovod, memory, sequential


def _ring() -> HardwareProfile:
    """4 workers; the links of the ring 0-1-2-3-0 (latency s, bandwidth MB/s)."""
    def link(src: int, dst: int, latency_us: float, mbps: float) -> Link:
        return Link(src, dst, True, Cost(latency_us / 1e6, mbps * 1e6))
    return HardwareProfile("ring", "config", 4, 1, [
        link(0, 1, 10, 1000), link(1, 2, 20, 500), link(2, 3, 10, 1000), link(0, 3, 50, 2000)])


def test_horovod_eq_5_1_takes_the_slowest_ring_link_and_the_last_fused_buffer() -> None:
    # min(G=100, th=64) = 64 MB; steps of 64/4 = 16 MB; slowest link 1-2: 20 us + 16/500 s
    assert horovod.ring_allreduce_seconds(_ring(), 4, 64) == pytest.approx(6 * 0.03202)
    step = horovod.step_seconds(0.5, 4, 100, 64, _ring())
    assert step == pytest.approx(0.5 + 6 * 0.03202)
    # 1024 images, 32 per worker and step, 4 workers: 8 steps
    assert horovod.epoch_seconds(0.5, 1024, 32, 4, 100, 64, _ring()) == pytest.approx(8 * step)
    # a gradient smaller than th is sent whole; th = 0 (no fusion) is bounded by G as well
    assert horovod.step_seconds(0.5, 4, 8, 64, _ring()) == pytest.approx(0.5 + 6 * (20e-6 + 2 / 500))
    assert horovod.step_seconds(0.5, 4, 8, 0, _ring()) == pytest.approx(0.5 + 6 * (20e-6 + 2 / 500))


def test_the_free_parameters_of_the_data_parallel_model() -> None:
    raw = horovod.step_seconds(0.5, 4, 100, 64, _ring())
    tuned = horovod.step_seconds(0.5, 4, 100, 64, _ring(), overhead_s=0.01, bandwidth_scale=0.5)
    assert tuned == pytest.approx(0.5 + 0.01 + 6 * (20e-6 + 16 / 250))
    assert raw < tuned
    # one worker has nothing to communicate
    assert horovod.step_seconds(0.5, 1, 100, 64, _ring(), overhead_s=0.01) == 0.5


def test_ddp_is_eq_5_1_with_its_bucket_size() -> None:
    assert ddp.epoch_seconds(0.5, 1024, 32, 4, 100, 25, _ring()) == pytest.approx(
        horovod.epoch_seconds(0.5, 1024, 32, 4, 100, 25, _ring()))
    assert ddp.epoch_seconds(0.5, 1024, 32, 4, 100, 25, _ring()) == pytest.approx(
        8 * (0.5 + 6 * (20e-6 + 6.25 / 500)))


def test_gpipe_eq_6_1_compute() -> None:
    assert gpipe.compute_seconds(8.0, 4, 8) == pytest.approx(8.0 * 11 / 32)
    assert gpipe.compute_seconds(8.0, 1, 8) == pytest.approx(8.0)  # one stage: no bubble


def test_gpipe_eq_6_2_communication() -> None:
    # W=4, #mb=8, c = (1, 3, 2): filling max(c1) + max(c1,c2) = 4; full (8-2) * 3 = 18;
    # draining max(c2,c3) + max(c3) = 5; times 2 = 54
    assert gpipe.communication_seconds([1, 3, 2], 8) == pytest.approx(54)
    assert gpipe.communication_seconds([2], 4) == pytest.approx(2 * 4 * 2)  # W=2: #mb steps
    assert gpipe.communication_seconds([], 4) == 0


def test_gpipe_link_costs_and_batch_time() -> None:
    costs = gpipe.link_costs([0.5, 0.25, 0.1], 4, _ring())
    assert costs == pytest.approx([10e-6 + 2 / 1000, 20e-6 + 1 / 500, 10e-6 + 0.4 / 1000])
    whole = gpipe.batch_seconds(8.0, 8, 4, [0.5, 0.25, 0.1], _ring())
    assert whole == pytest.approx(8.0 * 11 / 32 + gpipe.communication_seconds(costs, 8))
    hidden = gpipe.batch_seconds(8.0, 8, 4, [0.5, 0.25, 0.1], _ring(), overlap=1.0)
    assert hidden == pytest.approx(8.0 * 11 / 32)
    assert gpipe.epoch_seconds(320, 32, 8.0, 8, [0.5, 0.25, 0.1], _ring()) == \
        pytest.approx(10 * whole)


def test_memory_per_worker() -> None:
    # weights + gradients + momentum (3 x 100) + fusion buffer 64 + 32 x 2 MB of activations
    # (the terms one by one: tests/test_memory_model.py)
    stage = memory.StageFacts(weights_mb=100, saved_mb_per_sample=2.0)
    worker = memory.data_parallel_memory(100, 100, stage, 32, buffer_mb=64)
    assert worker.total == 428
    assert memory.fits([428, 300], 0.5) and not memory.fits([428, 600], 0.5)
    assert memory.fits([10**9], None)


def test_the_sequential_model_extrapolates_measured_batches(tmp_path) -> None:  # noqa: ANN001
    assert sequential.epoch_seconds(0.5, 1000, 32) == pytest.approx(0.5 * 32)
    config = validate(compose_config([
        "dataset=mnist", "network=mobilenetv2", "hardware.cpu_threads=1",
        f"dataset.cache_dir={tmp_path}"]))
    timing = sequential.measure_batch_seconds(config, batch_size=8, probe_batches=3,
                                              warmup_batches=1)
    assert timing.batch_size == 8 and timing.batches == 3
    assert 0 < timing.median_s < 10 and timing.std_s >= 0


def _uniform(workers: int, latency_us: float = 10, mbps: float = 1000) -> HardwareProfile:
    return HardwareProfile("uniform", "config", workers, 1, [
        Link(i, j, True, Cost(latency_us / 1e6, mbps * 1e6))
        for i in range(workers) for j in range(i + 1, workers)])


def test_pipedream_epoch_is_pipeline_depth_plus_the_bottleneck_interval() -> None:
    from harness.predict.pipedream import PipelineStage, epoch_split

    # Stage 0 on workers 0-1 (8 MB of weights, 1 MB out), stage 1 on worker 2.
    # c = 10 us + 1 MB / 1000 MB/s = 1.01 ms; stage 0's replicas allreduce 8 MB:
    # 2 (2-1) (10 us + 4 MB / 1000 MB/s) = 8.02 ms; x_0 = 2c + 8.02 ms, x_1 = 2c.
    stages = [PipelineStage(0.2, 2, 8.0, 1.0), PipelineStage(0.3, 1, 4.0, 0.0)]
    split = epoch_split(stages, 10, _uniform(3))
    # I_0 = (0.2 + 10.04 ms) / 2 < I_1 = 0.3 + 2.02 ms: stage 1 is the bottleneck.
    assert split.compute_s == pytest.approx(0.2 + 0.3 + 9 * 0.3)
    assert split.communication_s == pytest.approx(2 * 0.00101 + 9 * 0.00202)
    # Make the replicated stage the bottleneck: its interval is halved by its two replicas.
    stages[0] = PipelineStage(0.8, 2, 8.0, 1.0)
    split = epoch_split(stages, 10, _uniform(3))
    assert split.compute_s == pytest.approx(0.8 + 0.3 + 9 * 0.8 / 2)
    assert split.communication_s == pytest.approx(2 * 0.00101 + 9 * (2 * 0.00101 + 0.00802) / 2)
    assert split.seconds == pytest.approx(split.compute_s + split.communication_s)
    assert epoch_split(stages, 0, _uniform(3)).seconds == 0.0
