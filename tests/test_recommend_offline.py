"""Recommending for hardware whose device this machine lacks (a login node planning a GPU
cluster): step times come from a facts file or from MLflow, never from a probe here; with
neither, one line says what to run where.

Every command runs with CUDA hidden (`CUDA_VISIBLE_DEVICES=`), so the tests mean the same on a
machine that has a GPU.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import run_module
from tests.test_recommend_repeatable import assert_overrides_train

MNIST_IMAGES = 70_000  # Table 3.2: dataset.num_samples=null trains all of them
GPU_NAME = "NVIDIA TITAN RTX"


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def _recommend(output_root: Path, *args: str):  # noqa: ANN202 - CompletedProcess
    return run_module("harness.recommend", [*args, f"run.output_dir={output_root}"],
                      cwd=output_root.parent, timeout=120)


def test_nothing_measured_for_the_device_answers_memory_and_says_what_to_run_where(
        output_root: Path) -> None:
    """No step time on the device: no option is ranked by time, every option's memory is
    predicted (issue 22: the memory question needs no GPU), and one line says what to run
    where to rank them."""
    done = _recommend(output_root, "dataset=imagenet", "network=resnet152",
                      "hardware=titanrtx_cluster")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "s/epoch: not predicted: no step time of resnet152 has been measured on cuda yet" \
        in done.stdout
    # every option a row: no seconds, no range, its memory per worker and whether it fits
    assert re.search(r"^ +1 +\S.* +- +- +\d+ +(yes|NO) ", done.stdout, re.MULTILINE), \
        done.stdout
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("not ranked")]
    print(line)
    assert line.startswith("not ranked by time: hardware=titanrtx_cluster: no sequential "
                           "step time measured on cuda for resnet152/imagenet at batch 32")
    assert ("run `python -m harness network=resnet152 dataset=imagenet distribution=sequential "
            "hardware=titanrtx_cluster distribution.batch_size=32") in line
    assert str(output_root / "facts" / "titanrtx_cluster.json") in line
    assert not (output_root / "mlflow.db").exists()  # looking created no MLflow store


def _layer_count(network: str, dataset: str) -> int:
    from harness.describe import describe
    from workloads.datasets import dataset_spec

    return describe(network, dataset_spec(dataset))["num_layers"]


def _kept_facts(output_root: Path, steps: dict[int, float]) -> Path:
    """The facts file a calibration on the GPU machine would have kept for mobilenetv2 on
    mnist: `steps` (batch -> seconds) and a layer profile (so that nothing is profiled here,
    which takes long on a CPU), written through the real writer."""
    from harness.predict.facts import FactsStore, facts_path
    from harness.profiler import LayerProfile, NetworkProfile

    path = facts_path(output_root, "titanrtx_cluster")
    store = FactsStore.load(path)
    for batch, seconds in steps.items():
        store.record_step(network="mobilenetv2", dataset="mnist", device="cuda",
                          device_name=GPU_NAME, batch=batch, seconds=seconds)
    layers = [LayerProfile(index=i, type="Layer", forward_ms=1.0, backward_ms=2.0,
                           update_ms=0.1, activation_mb=0.5, parameter_mb=0.2)
              for i in range(_layer_count("mobilenetv2", "mnist"))]
    store.record_profile(network="mobilenetv2", dataset="mnist", device="cuda",
                         device_name=GPU_NAME, profile=NetworkProfile(128, "cpu", layers))
    return store.save()


def test_a_facts_file_of_the_device_is_used_and_named(output_root: Path) -> None:
    # step times at batch 128 (the sequential batch of mnist, and GPipe's 3072 / 24
    # micro-batch) and 64 (3072 / 48)
    path = _kept_facts(output_root, {128: 0.010, 64: 0.006})
    kept = path.read_text()

    done = _recommend(output_root, "dataset=mnist", "network=mobilenetv2",
                      "hardware=titanrtx_cluster", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    source = f"facts file {path}"
    steps = {step["batch"]: step for step in answer["step_times"]}
    assert steps[128]["seconds"] == pytest.approx(0.010) and not steps[128]["scaled"]
    assert steps[64]["seconds"] == pytest.approx(0.006) and not steps[64]["scaled"]
    # GPipe's 3072 / 12 micro-batch was measured nowhere: the nearest batch, per sample.
    assert steps[256]["seconds"] == pytest.approx(0.020) and steps[256]["scaled"]
    assert steps[256]["measured_batch"] == 128
    assert all(step["source"] == source and step["device_name"] == GPU_NAME
               for step in steps.values())
    assert answer["layer_profile"] == [source]
    options = {option["label"]: option for option in answer["options"]}
    # sequential: 70000 // 128 = 546 steps of 0.010 s (raw equations: no analysis here)
    assert MNIST_IMAGES // 128 == 546
    assert options["sequential"]["seconds_per_epoch"] == pytest.approx(5.46)
    # DDP on 2 workers: each trains its half, 70000 // 2 // 128 = 273 steps, plus allreduces
    assert options["ddp x2"]["seconds_per_epoch"] > 2.73
    assert options["gpipe x2 mb12"]["step_time_scaled_from"] == 128
    assert options["gpipe x2 mb24"]["step_time_scaled_from"] is None
    # 4 nodes x 4 GPUs: whole nodes too; every option's overrides train it as predicted
    assert {option["workers"] for option in answer["options"]} == {1, 2, 4, 8, 16}
    assert_overrides_train(answer["options"])
    assert path.read_text() == kept  # nothing measured here, nothing written


def _log_sequential_cell(output_root: Path, overrides: list[str], seconds_per_epoch: float,
                         device_name: str) -> str:
    """A sequential cell as `harness.run` records it: the resolved config as `config.yaml`,
    status ok, its seconds per epoch."""
    from omegaconf import OmegaConf

    from harness.compose import compose_config
    from harness.config import resolved_container
    from harness.tracking import log_run, tracking_uri

    resolved = resolved_container(compose_config(
        ["dataset=mnist", "network=mobilenetv2", "distribution=sequential",
         f"run.output_dir={output_root}", *overrides]))
    folder = output_root / "runs" / f"cell-{len(list(output_root.glob('runs/*')))}"
    folder.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(resolved), folder / "config.yaml")
    return log_run(uri=tracking_uri(None, output_root), experiment="gpu_grid",
                   run_name="sequential", tags={"status": "ok", "device_name": device_name},
                   params=resolved, metrics={"seconds_per_epoch": seconds_per_epoch},
                   artifacts=[folder / "config.yaml"])


def test_sequential_cells_recorded_in_mlflow_are_used_and_named(output_root: Path) -> None:
    # 320 samples at batch 32: 10 steps in 0.5 s, a step of 0.05 s on the GPU
    run_id = _log_sequential_cell(output_root, [
        "hardware=titanrtx_cluster", "distribution.batch_size=32", "dataset.num_samples=320"],
        0.5, GPU_NAME)
    # the same workload on a CPU: another kind of device, never used for a cuda hardware
    decoy = _log_sequential_cell(output_root, [
        "hardware=local_cpu", "distribution.batch_size=32", "dataset.num_samples=320"],
        99.0, "some CPU")
    facts = _kept_facts(output_root, {})  # a layer profile only: step times from MLflow

    done = _recommend(output_root, "dataset=mnist", "network=mobilenetv2",
                      "hardware=titanrtx_cluster", "distribution=gpipe",
                      "distribution.batch_size=32", "distribution.micro_batches=4")
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)
    lines = done.stdout.splitlines()
    assert any(line.strip().startswith(f"batch 32: 0.05 s, MLflow run {run_id} at sqlite:///")
               and line.endswith(f"({GPU_NAME})") for line in lines), done.stdout
    assert decoy not in done.stdout
    # GPipe's micro-batches of 32 / 8 = 4 samples: scaled from batch 32, and marked
    assert any(line.strip().startswith("batch 4: 0.00625 s*, scaled per sample from batch 32")
               for line in lines), done.stdout
    assert f"layer profile (pipelines): facts file {facts}" in lines
    (row,) = [line for line in lines if re.match(r"\s*\d+\s+sequential\s", line)]
    # sequential: 70000 // 32 = 2187 steps of 0.05 s
    assert MNIST_IMAGES // 32 == 2187
    assert float(row.split()[2]) == pytest.approx(109.35, abs=1e-3)
    (gpipe,) = [line for line in lines if re.match(r"\s*\d+\s+gpipe x2 mb8\s", line)]
    assert "*" in gpipe
    assert lines[-1].startswith("recommended: ")


def test_a_probe_here_is_kept_in_the_facts_file_and_read_back_without_probing(
        output_root: Path) -> None:
    from dataclasses import replace

    from harness.compose import compose_config
    from harness.config import validate
    from harness.predict.facts import cache_for, facts_path, gather, step_time_source

    config = validate(compose_config([
        "dataset=mnist", "network=mobilenetv2", "distribution=sequential", "hardware=local_cpu",
        "hardware.cpu_threads=1", "distribution.batch_size=4", f"run.output_dir={output_root}"]))
    cache = cache_for(1)
    cache.measure_memory = False  # times only
    probed = gather(config, cache)
    # what is used is what was kept, read back as a later run reads it
    used = step_time_source(config, cache)
    assert used.source == f"facts file {facts_path(output_root, 'local_cpu')}"
    kept = json.loads(facts_path(output_root, "local_cpu").read_text())
    (entry,) = kept["step_times"]
    assert (entry["network"], entry["device"], entry["threads"], entry["batch"]) == (
        "mobilenetv2", "cpu", 1, 4)
    assert entry["seconds"] == probed.step_seconds
    assert (entry["probe_batches"], len(entry["batch_seconds"])) == (1, 1)
    assert entry["q1_seconds"] == entry["q3_seconds"] == entry["seconds"]  # one batch
    assert (used.low, used.high, used.measured_at) == (
        entry["q1_seconds"], entry["q3_seconds"], entry["measured_at"])

    offline = cache_for(1, probe=False)
    offline.measure_memory = False
    again = gather(config, offline)
    assert again.step_seconds == probed.step_seconds
    assert step_time_source(config, offline).source == \
        f"facts file {facts_path(output_root, 'local_cpu')}"
    # another thread count is another measurement: not there
    from harness.predict.facts import MissingMeasurement

    with pytest.raises(MissingMeasurement, match="cpu \\(2 threads\\)"):
        gather(replace(config, hardware=replace(config.hardware, cpu_threads=2)), offline)
    # The recommender's cache uses what was kept for this device; without reuse
    # (`--remeasure`, or an analysis) it times the step again.
    for reuse, measured in ((True, []), (False, ["the step time at batch 4"])):
        cache = cache_for(1, reuse=reuse)
        cache.measure_memory = False
        assert gather(config, cache).step_seconds > 0 and cache.measured == measured


def test_the_batch_rule_prefers_an_exact_batch_then_the_nearest_scaled_per_sample() -> None:
    from harness.predict.steps import MeasuredStep, choose_step_time

    facts = MeasuredStep(32, 0.2, "facts file", rank=0)
    mlflow = MeasuredStep(32, 0.3, "MLflow", rank=1)
    large = MeasuredStep(128, 0.4, "MLflow", rank=1)
    assert choose_step_time([], 32) is None
    exact = choose_step_time([mlflow, large, facts], 32)
    assert (exact.seconds, exact.source, exact.scaled) == (0.2, "facts file", False)
    nearest = choose_step_time([facts, large], 96)  # 128 is nearer to 96 than 32 (by ratio)
    assert (nearest.measured_batch, nearest.scaled) == (128, True)
    assert nearest.seconds == pytest.approx(0.4 * 96 / 128)
    tie = choose_step_time([MeasuredStep(16, 0.1, "a"), MeasuredStep(64, 0.4, "b")], 32)
    assert tie.measured_batch == 64  # equally near: the larger batch
