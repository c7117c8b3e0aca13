"""Recommending for hardware whose device this machine lacks (a login node planning a GPU
cluster): step times come from a facts file or from MLflow, never from a probe here; with
neither, one line says what to run where.

Every command runs with CUDA hidden (`CUDA_VISIBLE_DEVICES=`, and torch's answer in this
process), so the tests mean the same on a machine that has a GPU. The commands run in this
process (`harness.recommend.main`): what they answer is the tests' business, not their process's
start (tests/integration/test_analysis.py runs the recommender's bad input as a user types it).
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.in_process import command_here
from tests.integration.test_recommend_repeatable import assert_overrides_train

MNIST_IMAGES = 70_000  # Table 3.2: dataset.num_samples=null trains all of them
GPU_NAME = "NVIDIA TITAN RTX"


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA hidden as `CUDA_VISIBLE_DEVICES=` hides it from a fresh process; in this one, torch
    may have answered already (the harness asks once per process), so its answer is set."""
    import torch

    from harness.cli import preflight

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(preflight, "torch_sees_cuda", lambda: False)


@pytest.fixture(scope="module", autouse=True)
def saved_activations_measured_once() -> Iterator[None]:
    """What autograd saves per layer (`harness.measure.saved_activations`, two forwards on the
    CPU: seconds) depends on the network, the dataset and the seed alone: the first of the
    module's commands that needs a workload's measures it for real, each later one is handed
    that measurement. All else runs as it would: what the command keeps, where, and what it
    says it measured."""
    from harness.config.schema import DistbenchConfig
    from harness.costs.activations import SavedActivations
    from harness.worker.measurements import WorkerMeasurements

    measure = WorkerMeasurements.saved_activations
    measured: dict[str, SavedActivations] = {}

    def once(self: WorkerMeasurements, config: DistbenchConfig) -> SavedActivations:
        key = repr((config.network.ref, config.dataset.spec, config.run.seed))
        if key not in measured:
            measured[key] = measure(self, config)
        return measured[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WorkerMeasurements, "saved_activations", once)
        yield


def _recommend(
    output_root: Path, capfd: pytest.CaptureFixture[str], *args: str
) -> subprocess.CompletedProcess[str]:
    """`python -m harness.recommend args` on `output_root`, in this process."""
    from harness.recommend import main

    return command_here(main, [*args, f"run.output_dir={output_root}"], capfd)


def test_nothing_measured_for_the_device_answers_memory_and_says_what_to_run_where(
    output_root: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """No step time on the device: no option is ranked by time, every option's memory is
    predicted (the memory question needs no GPU), and one line says what to run
    where to rank them."""
    done = _recommend(
        output_root, capfd, "dataset=imagenet", "network=resnet152", "hardware=titanrtx_cluster"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert (
        "s/epoch: not predicted: no step time of resnet152 has been measured on cuda yet"
        in done.stdout
    )
    # every option a row: no seconds, no range, uncalibrated, its memory per worker and
    # whether it fits
    assert re.search(r"^ +1 +\S.* +- +- +no +\d+ +(yes|NO) ", done.stdout, re.MULTILINE), (
        done.stdout
    )
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("not ranked")]
    print(line)
    assert line.startswith(
        "not ranked by time: hardware=titanrtx_cluster: no sequential "
        "step time measured on cuda for resnet152/imagenet at batch 32"
    )
    assert (
        "run `python -m harness network=resnet152 dataset=imagenet distribution=sequential "
        "hardware=titanrtx_cluster distribution.batch_size=32"
    ) in line
    assert str(output_root / "facts" / "titanrtx_cluster.json") in line
    assert not (output_root / "mlflow.db").exists()  # looking created no MLflow store


@functools.cache
def _layer_count(network: str, dataset: str) -> int:
    from harness.measure.network_facts import describe
    from workloads.datasets import dataset_spec

    return describe(network, dataset_spec(dataset))["num_layers"]


def _kept_facts(output_root: Path, steps: dict[int, float]) -> Path:
    """The facts file a calibration on the GPU machine would have kept for mobilenetv2 on
    mnist: `steps` (batch -> seconds) and a layer profile (so that nothing is profiled here,
    which takes long on a CPU), written through the real writer."""
    from harness.predict.facts.store import FactsStore, facts_path
    from harness.profiles.network import LayerProfile, NetworkProfile

    path = facts_path(output_root, "titanrtx_cluster")
    store = FactsStore.load(path)
    for batch, seconds in steps.items():
        store.record_step(
            network="mobilenetv2",
            dataset="mnist",
            device="cuda",
            device_name=GPU_NAME,
            batch=batch,
            seconds=seconds,
        )
    layers = [
        LayerProfile(
            index=i,
            type="Layer",
            forward_ms=1.0,
            backward_ms=2.0,
            update_ms=0.1,
            activation_mb=0.5,
            parameter_mb=0.2,
        )
        for i in range(_layer_count("mobilenetv2", "mnist"))
    ]
    store.record_profile(
        network="mobilenetv2",
        dataset="mnist",
        device="cuda",
        device_name=GPU_NAME,
        profile=NetworkProfile(128, "cpu", layers),
    )
    return store.save()


def test_a_facts_file_of_the_device_is_used_and_named(
    output_root: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # step times at batch 128 (the sequential batch of mnist, and GPipe's 3072 / 24
    # micro-batch) and 64 (3072 / 48)
    path = _kept_facts(output_root, {128: 0.010, 64: 0.006})
    kept = path.read_text()

    done = _recommend(
        output_root,
        capfd,
        "dataset=mnist",
        "network=mobilenetv2",
        "hardware=titanrtx_cluster",
        "--json",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    source = f"facts file {path}"
    steps = {step["batch"]: step for step in answer["step_times"]}
    assert steps[128]["seconds"] == pytest.approx(0.010) and not steps[128]["scaled"]
    assert steps[64]["seconds"] == pytest.approx(0.006) and not steps[64]["scaled"]
    # GPipe's 3072 / 12 micro-batch was measured nowhere: the nearest batch, per sample.
    assert steps[256]["seconds"] == pytest.approx(0.020) and steps[256]["scaled"]
    assert steps[256]["measured_batch"] == 128
    assert all(
        step["source"] == source and step["device_name"] == GPU_NAME for step in steps.values()
    )
    assert answer["layer_profile"] == [source]
    # No probe here and no fit: the config's link speeds, said as the table says it.
    assert answer["links"].startswith("links: hardware titanrtx_cluster's configured speeds")
    assert answer["links_since_fit"] is None
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


def test_step_times_from_another_machine_than_the_fits_cells_are_named(tmp_path: Path) -> None:
    """A fit keeps the machines its cells ran on; where the step times a recommendation uses
    were measured on another (this VM's hosts all read "AMD EPYC" and ran 3-5x apart by
    instruction set), the table says so, and how to fit the parameters for this machine."""
    from harness.analysis.calibration import FitCoverage, Fitted, calibrate_commands
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.profiles.steps import StepTime
    from harness.recommend import machine_since_fit

    hardware = validate(compose_config(["hardware=local_2cpu"])).hardware
    path = tmp_path / "analysis" / "calibrate_local" / "fit.json"

    def fit(*machines: str) -> Fitted:
        return Fitted(
            {},
            0.0,
            str(path),
            hardware="local_2cpu",
            fit=FitCoverage(
                path,
                "local_2cpu",
                56,
                ("resnet18", "vgg11"),
                {"ddp": 8},
                0.0,
                "configured",
                machines,
            ),
        )

    steps = [
        (f"batch {batch}", StepTime(batch, 0.1, "facts file f.json", batch, "AMD EPYC (AVX2)"))
        for batch in (16, 32)
    ]
    assert machine_since_fit(fit("AMD EPYC (AVX512)"), steps, hardware) == (
        "machine changed since the fit: its cells ran on AMD EPYC (AVX512), the step times "
        "used on another (batch 16, batch 32 on AMD EPYC (AVX2)); its parameters were learnt "
        f"at the former's speed: {calibrate_commands(hardware)} on this machine fit them for "
        f"it (the fit: {path})"
    )
    assert machine_since_fit(fit("AMD EPYC (AVX2)"), steps, hardware) is None
    assert machine_since_fit(fit(), steps, hardware) is None  # a fit from before it kept them
    assert machine_since_fit(Fitted.raw("no fit"), steps, hardware) is None
    # A cell recorded before its machine was:
    unnamed = [("batch 16", StepTime(16, 0.1, "MLflow runs", 16))]
    assert machine_since_fit(fit("AMD EPYC (AVX512)"), unnamed, hardware) is None


def test_the_table_says_where_the_links_speeds_come_from(
    output_root: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The configured speeds until harness.probe has measured the links, then the probe's
    profile, with what an allreduce between nodes takes from a CPU worker's compute."""
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.profiles.hardware import (
        COMPUTE_LOST_FACT,
        HardwareProfile,
        link_line,
        profile_path,
    )

    ask = ["dataset=mnist", "network=mobilenetv2", "hardware=titanrtx_cluster"]
    hardware = validate(compose_config(ask)).hardware
    configured = HardwareProfile.from_config(hardware)
    assert link_line(hardware, configured) == (
        "links: hardware titanrtx_cluster's configured speeds (no harness.probe profile yet; "
        "python -m harness.probe hardware=titanrtx_cluster measures them)"
    )
    assert link_line(hardware, None) is None  # one worker: no link
    measured = HardwareProfile(
        configured.hardware,
        "measured",
        configured.workers,
        configured.nodes,
        configured.links,
        facts={"measured_at": "2026-11-29T11:13:30+00:00", COMPUTE_LOST_FACT: 2.41},
    )
    measured.save(profile_path(output_root, "titanrtx_cluster"))
    _kept_facts(output_root, {128: 0.010, 64: 0.006})
    done = _recommend(output_root, capfd, *ask)  # the table, as a user reads it
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "links: measured by harness.probe, 2026-11-29T11:13:30+00:00; an allreduce between "
        "nodes takes 2.41 ms of a worker's compute per MB"
    ) in done.stdout.splitlines()


def test_links_probed_after_the_fit_are_named_beside_its_factor(tmp_path: Path) -> None:
    """A fit keeps the links it priced its cells with; where the links priced now differ (a
    probe after the analysis), the table says the fit's communication factor belongs to the
    others, and how to fit it again."""
    from harness.analysis.calibration import FitCoverage, Fitted
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.profiles.hardware import HardwareProfile
    from harness.recommend import links_since_fit

    hardware = validate(compose_config(["hardware=local_2cpu"])).hardware
    configured = HardwareProfile.from_config(hardware)
    probed = replace(
        configured, source="measured", facts={"measured_at": "2026-11-30T06:31:22+00:00"}
    )
    path = tmp_path / "analysis" / "calibrate_local" / "fit.json"

    def fit(links: str | None) -> Fitted:
        return Fitted(
            {},
            0.0,
            str(path),
            hardware="local_2cpu",
            fit=FitCoverage(path, "local_2cpu", 56, ("resnet18", "vgg11"), {"ddp": 8}, 0.0, links),
        )

    assert links_since_fit(fit("configured"), probed) == (
        "links changed since the fit: it priced its cells with links configured, these are "
        "measured 2026-11-30T06:31:22+00:00; its communication factor belongs to the former: "
        "python -m harness.analysis tracking.experiment=calibrate_local fits it again (the "
        f"fit: {path})"
    )
    assert links_since_fit(fit("measured 2026-11-30T06:31:22+00:00"), probed) is None
    assert links_since_fit(fit(None), probed) is None  # a fit from before it kept its links
    assert links_since_fit(Fitted.raw("no fit"), probed) is None
    assert links_since_fit(fit("configured"), None) is None  # one worker: no link


def _log_sequential_cell(
    output_root: Path,
    overrides: list[str],
    seconds_per_epoch: float,
    device_name: str,
    **metrics: float,
) -> str:
    """A sequential cell as `harness.worker.run` records it: the resolved config as `config.yaml`,
    status ok, its seconds per epoch."""
    from omegaconf import OmegaConf

    from harness.commands.compose import compose_config
    from harness.config.schema import resolved_container
    from harness.records.mlflow_store import tracking_uri
    from harness.records.tracking import log_run

    resolved = resolved_container(
        compose_config(
            [
                "dataset=mnist",
                "network=mobilenetv2",
                "distribution=sequential",
                f"run.output_dir={output_root}",
                *overrides,
            ]
        )
    )
    folder = output_root / "runs" / f"cell-{len(list(output_root.glob('runs/*')))}"
    folder.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(resolved), folder / "config.yaml")
    return log_run(
        uri=tracking_uri(None, output_root),
        experiment="gpu_grid",
        run_name="sequential",
        tags={"status": "ok", "device_name": device_name},
        params=resolved,
        metrics={"seconds_per_epoch": seconds_per_epoch, **metrics},
        artifacts=[folder / "config.yaml"],
    )


def test_a_step_time_from_sequential_cells_carries_the_speed_they_ran_at(output_root: Path) -> None:
    """The reference kernel each cell times around itself (harness.measure.steadiness) goes
    with the step time taken from sequential cells: the median of theirs, timed in cells as
    every other cell's is (the analysis scales by it), and none where a cell lacks it."""
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.predict.recorded import sequential_steps
    from harness.records.mlflow_store import tracking_uri

    overrides = ["hardware=local_cpu", "dataset.num_samples=320"]
    for seconds, before, after in ((0.5, 14.0, 15.0), (0.6, 17.0, 18.0), (0.7, 16.0, 16.0)):
        _log_sequential_cell(
            output_root,
            [*overrides, "distribution.batch_size=32"],
            seconds,
            "a CPU",
            reference_kernel_ms_before=before,
            reference_kernel_ms_after=after,
        )
    _log_sequential_cell(output_root, [*overrides, "distribution.batch_size=64"], 0.5, "a CPU")
    config = validate(
        compose_config(
            ["dataset=mnist", "network=mobilenetv2", *overrides, f"run.output_dir={output_root}"]
        )
    )
    at_32, at_64 = sequential_steps(config)[0]
    assert (at_32.batch, at_32.seconds, at_32.reference_ms) == (32, 0.6 / 10, 16.0)
    assert at_32.reference_in_cells and at_64.reference_in_cells
    assert at_64.reference_ms is None  # its cell recorded no kernel
    # A store moved elsewhere (an analysis of a copy): read where it is now, not where the
    # cells' recorded configs say it was (its artifacts stay where they are).
    moved = output_root.parent / "moved"
    moved.mkdir()
    shutil.move(output_root / "mlflow.db", moved / "mlflow.db")
    assert sequential_steps(config)[0] == []
    found, where = sequential_steps(config, uri=tracking_uri(None, moved))
    assert [step.batch for step in found] == [32, 64] and str(moved) in where


def test_sequential_cells_recorded_in_mlflow_are_used_and_named(
    output_root: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # 320 samples at batch 32: 10 steps in 0.5 s, a step of 0.05 s on the GPU
    run_id = _log_sequential_cell(
        output_root,
        ["hardware=titanrtx_cluster", "distribution.batch_size=32", "dataset.num_samples=320"],
        0.5,
        GPU_NAME,
    )
    # the same workload on a CPU: another kind of device, never used for a cuda hardware
    decoy = _log_sequential_cell(
        output_root,
        ["hardware=local_cpu", "distribution.batch_size=32", "dataset.num_samples=320"],
        99.0,
        "some CPU",
    )
    facts = _kept_facts(output_root, {})  # a layer profile only: step times from MLflow

    done = _recommend(
        output_root,
        capfd,
        "dataset=mnist",
        "network=mobilenetv2",
        "hardware=titanrtx_cluster",
        "distribution=gpipe",
        "distribution.batch_size=32",
        "distribution.micro_batches=4",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)
    lines = done.stdout.splitlines()
    assert any(
        line.strip().startswith(f"batch 32: 0.05 s, MLflow run {run_id} at sqlite:///")
        and line.endswith(f"({GPU_NAME})")
        for line in lines
    ), done.stdout
    assert decoy not in done.stdout
    # GPipe's micro-batches of 32 / 8 = 4 samples: scaled from batch 32, and marked
    assert any(
        line.strip().startswith("batch 4: 0.00625 s*, scaled per sample from batch 32")
        for line in lines
    ), done.stdout
    assert f"layer profile (pipelines): facts file {facts}" in lines
    (row,) = [line for line in lines if re.match(r"\s*\d+\s+sequential\s", line)]
    # sequential: 70000 // 32 = 2187 steps of 0.05 s
    assert MNIST_IMAGES // 32 == 2187
    assert float(row.split()[2]) == pytest.approx(109.35, abs=1e-3)
    (gpipe,) = [line for line in lines if re.match(r"\s*\d+\s+gpipe x2 mb8\s", line)]
    assert "*" in gpipe
    assert lines[-1].startswith("recommended: ")


def test_a_probe_here_is_kept_in_the_facts_file_and_read_back_without_probing(
    output_root: Path,
) -> None:
    from dataclasses import replace

    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.predict.facts.cache import cache_for, step_time_source
    from harness.predict.facts.gather import gather
    from harness.predict.facts.store import facts_path
    from harness.worker.measurements import WorkerMeasurements

    config = validate(
        compose_config(
            [
                "dataset=mnist",
                "network=mobilenetv2",
                "distribution=sequential",
                "hardware=local_cpu",
                "hardware.cpu_threads=1",
                "distribution.batch_size=4",
                f"run.output_dir={output_root}",
            ]
        )
    )
    measurements = WorkerMeasurements()
    cache = cache_for(1, measurements=measurements, measure_memory=False)  # times only
    probed = gather(config, cache)
    # what is used is what was kept, read back as a later run reads it
    used = step_time_source(config, cache)
    # (a probe the machine disturbed however often it was timed again is kept marked so, and
    # its source says it: the suite's other process shares these cores)
    assert used.source.startswith(f"facts file {facts_path(output_root, 'local_cpu')}")
    kept = json.loads(facts_path(output_root, "local_cpu").read_text())
    (entry,) = kept["step_times"]
    assert (entry["network"], entry["device"], entry["threads"], entry["batch"]) == (
        "mobilenetv2",
        "cpu",
        1,
        4,
    )
    assert entry["seconds"] == probed.step_seconds
    assert (entry["probe_batches"], len(entry["batch_seconds"])) == (1, 1)
    assert entry["q1_seconds"] == entry["q3_seconds"] == entry["seconds"]  # one batch
    assert (used.low, used.high, used.measured_at) == (
        entry["q1_seconds"],
        entry["q3_seconds"],
        entry["measured_at"],
    )
    # the machine's speed around the probe: the reference kernel a cell times around itself,
    # kept with it (a 24-product kernel of milliseconds), but timed outside any cell
    assert 0.1 < entry["reference_ms"] < 1000 and used.reference_ms == entry["reference_ms"]
    assert not used.reference_in_cells
    # kept under this machine: the CPU's name and the instruction set torch's kernels use
    from harness.runtime.environment import cpu_capability, cpu_model

    assert entry["device_name"] == used.device_name == f"{cpu_model()} ({cpu_capability()})"

    offline = cache_for(1, measurements=measurements, probe=False, measure_memory=False)
    again = gather(config, offline)
    assert again.step_seconds == probed.step_seconds
    assert step_time_source(config, offline).source.startswith(
        f"facts file {facts_path(output_root, 'local_cpu')}"
    )
    # another thread count is another measurement: not there
    from harness.predict.facts.store import MissingMeasurement

    with pytest.raises(MissingMeasurement, match="cpu \\(2 threads\\)"):
        gather(replace(config, hardware=replace(config.hardware, cpu_threads=2)), offline)
    # The recommender's cache uses what was kept for this device; without reuse
    # (`--remeasure`, or an analysis) it times the step again.
    for reuse, measured in ((True, []), (False, ["the step time at batch 4"])):
        cache = cache_for(1, measurements=measurements, reuse=reuse, measure_memory=False)
        assert gather(config, cache).step_seconds > 0 and cache.measured == measured
    # A probe asked for 5 batches that stopped after 3, steady, is what a later run asking for
    # 5 would measure: kept; one asked for 3 is not.
    from harness.predict.facts.store import FactsStore

    for asked, measured in ((5, []), (3, ["the step time at batch 4"])):
        store = FactsStore.load(facts_path(output_root, "local_cpu"))
        store.record_step(
            network="mobilenetv2",
            dataset="mnist",
            device="cpu",
            threads=1,
            device_name=entry["device_name"],
            batch=4,
            seconds=0.01,
            probe_batches=3,
            probe_asked=asked,
            batch_seconds=[0.01] * 3,
        )
        store.save()
        cache = cache_for(5, measurements=measurements, reuse=True, measure_memory=False)
        assert gather(config, cache).step_seconds > 0 and cache.measured == measured
    # A step time kept on another machine is timed again, not reused: this VM's hosts all read "AMD
    # EPYC" and differed 3-5x in speed by instruction set
    # (docs/benchmarks/2026-12-02-probe-length-slow-and-noisy-hosts.md, "A slower host, and the
    # machine a cell ran on recorded (2026-12-02)").
    store = FactsStore.load(facts_path(output_root, "local_cpu"))
    store.step_times = [
        {**step, "device_name": f"{cpu_model()} (another instruction set)"}
        for step in store.step_times
    ]
    store.save()
    cache = cache_for(1, measurements=measurements, reuse=True, measure_memory=False)
    assert gather(config, cache).step_seconds > 0
    assert cache.measured == ["the step time at batch 4"]


def test_the_batch_rule_prefers_an_exact_batch_then_the_nearest_scaled_per_sample() -> None:
    from harness.profiles.steps import MeasuredStep, choose_step_time

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


def _recommend_here(output_root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The recommender in this process (its stdout): no interpreter to start."""
    from harness.recommend import main

    capsys.readouterr()
    main(
        [
            "dataset=mnist",
            "network=mobilenetv2",
            "hardware=titanrtx_cluster",
            "hardware.nodes=1",
            *args,
            f"run.output_dir={output_root}",
        ]
    )
    return capsys.readouterr().out


def test_the_fit_is_chosen_by_coverage_or_named_and_models_it_did_not_calibrate_say_so(
    output_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not the newest fit.json, however little it covers, and no range as narrow as a calibrated one
    for a model it never saw: the fit covering the most models asked about is used (or `--fit`), the
    header names it, and every option says whether it is calibrated; an uncalibrated one has the raw
    equations' range and the calibrating command."""
    import os

    from harness.analysis.calibration import RAW_ERROR_FACTOR
    from tests.integration.test_analysis import _write_fit

    _kept_facts(output_root, {128: 0.010, 64: 0.006})
    params = {"titanrtx_cluster": {"contention": 1.0, "communication": 1.0}}
    broad = _write_fit(
        output_root / "analysis" / "grid",
        params,
        models={"ddp": 4, "gpipe": 4, "sequential": 4},
        errors={"ddp": 8.0, "gpipe": 10.0, "sequential": 4.0},
    )
    narrow = _write_fit(
        output_root / "analysis" / "b",
        params,
        networks=("vgg11",),
        models={"ddp": 1, "sequential": 2},
    )
    os.utime(broad, (1, 1))  # the narrow fit is the newer file

    answer = json.loads(_recommend_here(output_root, capsys, "--json"))
    assert answer["fit"] == {
        "path": str(broad),
        "hardware": "titanrtx_cluster",
        "cells": 12,
        "networks": ["mobilenetv2", "resnet18"],
        "models": {"ddp": 4, "gpipe": 4, "sequential": 4},
        "leave_one_network_out_measured": True,
    }
    assert answer["calibrated_models"] == ["ddp", "gpipe", "sequential"]
    assert answer["uncalibrated_models"] == ["fsdp", "horovod", "pipedream"]
    assert answer["calibrate"] == (
        "python -m harness +sweep=calibrate_local hydra.sweeper.params.hardware="
        "titanrtx_cluster hardware.nodes=1, python -m harness.probe hardware=titanrtx_cluster "
        "hardware.nodes=1, then python -m harness.analysis tracking.experiment=calibrate_local"
    )
    errors = {"ddp": 8.0, "gpipe": 10.0, "sequential": 4.0}
    for option in answer["options"]:  # the kept step times have no spread: only the error
        seconds, model = option["seconds_per_epoch"], option["distribution"]
        if model in errors:
            assert option["calibrated"], option["label"]
            assert option["seconds_high"] == pytest.approx(seconds * (1 + errors[model] / 100))
        else:
            assert not option["calibrated"], option["label"]
            assert "the fit has no cell of the model" in option["range_source"]
            assert option["seconds_high"] == pytest.approx(seconds * RAW_ERROR_FACTOR)
            assert option["seconds_low"] == pytest.approx(seconds / RAW_ERROR_FACTOR)

    named = json.loads(_recommend_here(output_root, capsys, "--json", f"--fit={narrow}"))
    assert named["fit"]["path"] == str(narrow) and named["fit"]["networks"] == ["vgg11"]
    assert not named["fit"]["leave_one_network_out_measured"]
    assert named["calibrated_models"] == []  # one network: its error is unknown
    (ddp,) = [o for o in named["options"] if o["label"] == "ddp x2"]
    assert "hold one network" in ddp["range_source"]

    lines = _recommend_here(output_root, capsys).splitlines()
    assert lines[-1].startswith("recommended: ")
    assert lines[0].endswith(
        f"parameters: {broad} (hardware=titanrtx_cluster, 12 cells; networks mobilenetv2, "
        f"resnet18; models ddp, gpipe, sequential)"
    )
    assert (
        "range (cal yes): the step times' quartiles over the probe's batches, widened by "
        "the fit's error on a network it was not fitted on (ddp 8.0%, gpipe 10.0%, "
        "sequential 4.0%)"
    ) in lines
    assert (
        "range (cal no: fsdp, horovod, pipedream): uncalibrated (the fit has no cell of "
        "the model on hardware=titanrtx_cluster): the raw equations' error, x/3 to x3 "
        "(docs/recommend.md)"
    ) in lines
    assert f"to calibrate hardware=titanrtx_cluster: {answer['calibrate']}" in lines


def test_a_bad_ask_is_refused_before_anything_is_measured_or_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No probe and no rewritten facts/<hardware>.json before a candidate is found invalid: every
    candidate is composed and validated first: here GPipe's Table 3.3 batch (3072) cannot fit the
    512 samples asked for, which DDP's 2 x 128 can."""
    from harness.recommend import main

    root = tmp_path / "outputs"
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "dataset=mnist",
                "network=mobilenetv2",
                "hardware=local_2cpu",
                "dataset.num_samples=512",
                f"run.output_dir={root}",
                "--probe-batches=1",
            ]
        )
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        "distbench: invalid config: dataset.num_samples=512 is invalid: "
        "an epoch needs at least one full pipeline batch (batch size 3072)"
    )
    assert "the recommender's candidate gpipe" in line
    assert not root.exists()  # nothing measured, no facts file written


def test_a_candidate_that_cannot_exist_for_the_ask_is_skipped_with_why() -> None:
    """Worker counts the recommender tries that a model cannot use (more pipeline stages than
    the network has layers) are listed as skipped, before anything is measured."""
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.recommend import check_candidates

    asked = [
        "dataset=mnist",
        "network=resnet18",
        "hardware=local_2cpu",
        "hardware.workers_per_node=16",
        "dataset.num_samples=4096",
        "distribution.batch_size=32",
    ]
    checked = check_candidates(validate(compose_config(asked)), asked)
    skipped = [line for line in checked.skipped if line.startswith(("gpipe", "pipedream"))]
    assert skipped and all(
        "16 pipeline stages for network=resnet18, which has 15 layers" in line for line in skipped
    ), checked.skipped
    assert "ddp x16" in {
        config.distribution.name + f" x{config.world_size}" for config in checked.configs
    }


def test_a_layer_profile_is_kept_and_found_per_batch(tmp_path: Path) -> None:
    """Each layer's share of a step moves with the batch (ResNet-50 on one core: its first 9
    layers take 35 % of a step at batch 8, 50 % at batch 32), so a profile is kept per batch
    and a cell's is the one at its batch, else the nearest kept."""
    from harness.predict.facts.store import FactsStore
    from harness.profiles.network import LayerProfile, NetworkProfile

    def profile(batch: int) -> NetworkProfile:
        return NetworkProfile(
            batch,
            "cpu",
            [
                LayerProfile(
                    index=0,
                    type="Layer",
                    forward_ms=batch,
                    backward_ms=2.0 * batch,
                    update_ms=0.1,
                    activation_mb=0.5,
                    parameter_mb=0.2,
                )
            ],
        )

    store = FactsStore.load(tmp_path / "facts.json")
    for batch in (8, 32, 8):  # the second batch-8 profile replaces the first
        store.record_profile(
            network="resnet50",
            dataset="cifar10",
            device="cpu",
            device_name=GPU_NAME,
            threads=1,
            profile=profile(batch),
        )
    store = FactsStore.load(store.save())
    assert sorted(entry["profile"]["batch_size"] for entry in store.layer_profiles) == [8, 32]

    def found(batch: int | None) -> int:
        return store.profile("resnet50", "cifar10", "cpu", 1, batch=batch).batch_size

    assert found(8) == 8 and found(32) == 32
    assert found(12) == 8 and found(128) == 32  # none at the batch: the nearest
    assert found(None) == 8  # no batch asked: the newest
