"""FSDP2 (`distribution=fsdp`, harness.distributions.fsdp) trains what sequential trains, is
recorded like every other model, and is offered and predicted by the recommender.

Training: two gloo workers on the CPU, `torch.distributed.fsdp.fully_shard` for real, in the
setting of tests/integration/test_trajectories.py (VGG-11 on synthetic MNIST, a global batch of 8: 4
per worker, STEPS steps). Without BatchNorm every FSDP variant (reshard after forward or not, and
HSDP with one shard per group, which replicates through FSDP's 2-D mesh and allreduces) follows the
sequential trajectory to float tolerance, like DDP. With BatchNorm each worker normalises its own
shard: the DDP reference (SHARDS). bfloat16 mixed precision follows that reference only loosely
(BF16_TOLERANCE, the measured gap with room), and is checked to train.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from mlflow.tracking import MlflowClient

from harness.commands.compose import compose_config
from harness.config.schema import ConfigError, DistbenchConfig, validate
from harness.costs.terms import CellFacts, LayerFacts
from harness.distributions.fsdp import (
    COPIES,
    FSDPConfig,
    collective_seconds,
    memory_per_worker,
    step_communication_seconds,
)
from harness.distributions.registry import spec_named
from harness.profiles.hardware import AllreduceCost, Cost, HardwareProfile
from harness.recommend import worker_counts
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from harness.runtime.workload import Workload, build_workload
from tests.helpers import cell_worker_pids, spawn_workers
from tests.integration.test_trajectories import (
    BATCH,
    DTYPE,
    FLOAT_TOLERANCE,
    LR,
    SHARDS,
    STEPS,
    WORKERS,
    close,
    dataset_cache,  # noqa: F401 - the fixture that points module fixtures at the test cache
    default_dtype,
    gap,
    in_float64,  # noqa: F401 - autouse: this module's references in float64 too
    moved,
    reference,
    strip_batchnorm,
    train_and_reset,
    trajectory,
    worker_context,
)
from tests.unit.harness.distributions.test_gpipe import free_port
from tests.unit.harness.records.test_eventlog import assert_compliant

# bfloat16 keeps 8 bits of mantissa: a relative error of ~4e-3 per rounding, carried through
# the steps. Measured gap to the float32 reference: 3.4e-2 (Intel Xeon, learning rate 0.01),
# 4.9e-2 (AMD EPYC, test_trajectories.LR), 3.2e-2 (Intel Xeon, LR); this test prints it.
BF16_TOLERANCE = 1e-1
# case name: (FSDP settings, with BatchNorm, check reset)
CASES = {
    "reshard": ([], False, False),
    "keep": (["distribution.reshard_after_forward=false"], False, False),
    "hsdp": (["distribution.shard_degree=1"], False, False),
    "batchnorm": ([], True, True),
    "bf16": (["distribution.mixed_precision=true"], True, False),
}


def fsdp_workload(
    settings: list[str], batchnorm: bool, rank: int = 0
) -> tuple[DistbenchConfig, Workload]:
    config = validate(
        compose_config(
            [
                "distribution=fsdp",
                "hardware=local_2cpu",
                "dataset=mnist",
                "network=vgg11",
                f"dataset.num_samples={STEPS * BATCH}",
                "run.progress=false",
                LR,
                f"distribution.batch_size={BATCH // WORKERS}",
                *settings,
            ]
        )
    )
    built = build_workload(config, rank=rank, world_size=WORKERS)
    if not batchnorm:
        strip_batchnorm(built.model)
    return config, built


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=120),
    )
    torch.set_num_threads(1)
    try:
        reports = {}
        for case, (settings, batchnorm, check_reset) in CASES.items():
            # bfloat16 from float32, as a user's cell runs it (CPU BatchNorm takes bfloat16
            # inputs with float32 parameters only); the others in the trajectories' float64
            torch.set_default_dtype(torch.float32 if case == "bf16" else DTYPE)
            config, built = fsdp_workload(settings, batchnorm, rank)
            context = worker_context(config, built, rank, world_size)
            report = train_and_reset(context, "fsdp", check_reset)  # shards built.model
            sharded = {type(parameter).__name__ for parameter in built.model.parameters()}
            reports[case] = {**report, "parameter_types": sorted(sharded)}
        Path(out, f"rank{rank}.json").write_text(json.dumps(reports))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def worker_reports(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> list[dict]:
    request.getfixturevalue("dataset_cache")
    out = tmp_path_factory.mktemp("fsdp")
    for settings, batchnorm, _ in CASES.values():  # the synthetic data cache, built once here
        fsdp_workload(settings, batchnorm)
    spawn_workers(_worker, args=(WORKERS, free_port(), str(out)), nprocs=WORKERS)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORKERS)]


@pytest.fixture(scope="module")
def references(request: pytest.FixtureRequest) -> dict[str, tuple[list[float], dict]]:
    """The single-process SGD references: the whole batch (no BatchNorm), and each worker's
    shard normalised on its own (BatchNorm); the latter also in float32, for bfloat16 (its
    initial weights are drawn in float32)."""
    request.getfixturevalue("dataset_cache")
    with default_dtype(torch.float32):
        float32 = reference(True, SHARDS)
    return {
        "whole": reference(False, [range(BATCH)]),
        "shards": reference(True, SHARDS),
        "shards_float32": float32,
    }


def test_the_parameters_are_sharded_dtensors(worker_reports: list[dict]) -> None:
    for report in worker_reports:
        for case in CASES:
            assert report[case]["parameter_types"] == ["DTensor"], case


@pytest.mark.parametrize("case", ["reshard", "keep", "hsdp"])
def test_without_batchnorm_fsdp_follows_the_sequential_trajectory(
    worker_reports: list[dict], references: dict, case: str
) -> None:
    expected, final = references["whole"]
    measured = gap(trajectory(worker_reports, case), expected)
    print(f"fsdp {case} vs sequential, no BatchNorm: largest relative gap {measured:.1e}")
    assert measured <= FLOAT_TOLERANCE
    for report in worker_reports:  # every worker evaluates the whole trained network
        assert close(report[case]["trained"], final, FLOAT_TOLERANCE)
        # it trains (see test_trajectories for why not "the loss falls")
        assert moved(report[case]["initial"], report[case]["trained"]) > 10 * FLOAT_TOLERANCE


def test_with_batchnorm_each_worker_normalises_its_shard(
    worker_reports: list[dict], references: dict
) -> None:
    predicted, final = references["shards"]
    measured = gap(trajectory(worker_reports, "batchnorm"), predicted)
    print(f"fsdp with BatchNorm: gap to the per-shard reference {measured:.1e}")
    assert measured <= FLOAT_TOLERANCE
    ranks = [report["batchnorm"] for report in worker_reports]
    assert ranks[0]["trained"] == ranks[1]["trained"]  # rank 0's buffers, everyone's weights
    assert close(ranks[0]["trained"], final, FLOAT_TOLERANCE)


def test_reset_returns_to_the_start_and_training_repeats_itself(worker_reports: list[dict]) -> None:
    for report in (report["batchnorm"] for report in worker_reports):
        assert report["reset"] == report["initial"]
        assert report["optimizer_state_after_reset"] == 0
        assert report["second"] == report["first"]


def test_mixed_precision_trains_close_to_float32(
    worker_reports: list[dict], references: dict
) -> None:
    predicted, _ = references["shards_float32"]
    measured = trajectory(worker_reports, "bf16")
    print(
        f"fsdp bfloat16 with BatchNorm: gap to the float32 reference {gap(measured, predicted):.1e}"
    )
    assert gap(measured, predicted) <= BF16_TOLERANCE
    assert gap(measured, predicted) > FLOAT_TOLERANCE  # bfloat16 did compute


# -- a recorded cell --------------------------------------------------------------------------
def test_a_two_worker_fsdp_cell_is_recorded_like_the_others(output_root: Path) -> None:
    """Two repeats: each starts from its seed's initial weights, which every worker builds
    whole and each must take its shard of (they once failed to load into the sharded
    parameters: 'mixed torch.Tensor and DTensor')."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "distribution=fsdp",
            "hardware=local_2cpu",
            "network=mobilenetv2",
            "dataset=mnist",
            "distribution.batch_size=8",
            "dataset.num_samples=64",
            "run.epochs=1",
            "run.repeats=2",
            "run.warmup_batches=1",
            "run.progress=false",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (output_root / "runs").glob("*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok", result["error"]
    metrics = result["metrics"]
    assert metrics["world_size"] == 2 and metrics["samples_per_epoch"] == 64
    assert metrics["repeats"] == 2 and len(result["epoch_seconds"]) == 2
    assert metrics["replicas_in_sync"] == 1.0
    assert metrics["peak_memory_mb_rank0"] > 0 and metrics["peak_memory_mb_rank1"] > 0
    assert result["config"]["distribution"]["name"] == "fsdp"
    assert result["config"]["distribution"]["reshard_after_forward"] is True
    run = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}").get_run(
        result["mlflow_run_id"]
    )
    assert run.data.params["distribution.name"] == "fsdp"
    assert run.data.metrics["seconds_per_epoch"] == metrics["seconds_per_epoch"]
    assert not cell_worker_pids(output_root)
    # one MLPerf log per repeat, each passing MLPerf's checker
    assert_compliant(Path(result["output_dir"]), repeats=2)


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["distribution.shard_degree=3"],
            "distribution.shard_degree=3 is invalid: must divide the cell's 2 workers",
        ),
        (
            ["distribution.shard_degree=0"],
            "distribution.shard_degree=0 is invalid: must be a positive number of workers",
        ),
        (
            ["+distribution.micro_batches=4"],
            "distribution.micro_batches: unknown key; allowed: name, batch_size, backend, "
            "activation_checkpointing, checkpoint_every, precision, reshard_after_forward",
        ),
    ],
)
def test_bad_fsdp_settings_are_refused_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(compose_config(["distribution=fsdp", "hardware=local_2cpu", *overrides]))


# -- the performance model and the recommender ------------------------------------------------
def _facts() -> CellFacts:
    """A network of three units (10, 30 and 60 MB of weights)."""
    layers = [
        LayerFacts(weights_mb=mb, activation_mb_per_sample=1.0, compute_share=1 / 3)
        for mb in (10.0, 30.0, 60.0)
    ]
    return CellFacts(
        weights_mb=100.0,
        gradient_mb=100.0,
        input_mb_per_sample=0.1,
        layers=layers,
        step_seconds=1.0,
        step_batch=32,
    )


def _config(*overrides: str, hardware: str = "local_4cpu") -> DistbenchConfig:
    return validate(
        compose_config(["distribution=fsdp", f"hardware={hardware}", "dataset=cifar10", *overrides])
    )


def test_each_worker_holds_its_shard_of_weights_gradients_and_momentum() -> None:
    facts = _facts()
    resharded = memory_per_worker(_config(), facts)[0]
    kept = memory_per_worker(_config("distribution.reshard_after_forward=false"), facts)[0]
    assert (resharded.weights, resharded.gradients, resharded.optimizer) == (25.0, 25.0, 25.0)
    # gathered at the peak: the two largest units (resharded) or all of them, plus the largest
    # unit's whole gradient before its reduce-scatter
    assert resharded.buffers == 60 + 30 + 60 and kept.buffers == 100 + 60
    halves = memory_per_worker(_config("distribution.shard_degree=2"), facts)[0]
    assert halves.weights == 50.0


def test_the_collectives_follow_the_settings() -> None:
    facts = _facts()
    profile = HardwareProfile(
        "local_4cpu",
        "config",
        4,
        1,
        [],
        [AllreduceCost(workers, Cost(1e-3, 1e9)) for workers in (2, 4)],
    )
    resharded = step_communication_seconds(_config(), facts, profile)
    kept = step_communication_seconds(
        _config("distribution.reshard_after_forward=false"), facts, profile
    )
    bf16 = step_communication_seconds(_config("distribution.mixed_precision=true"), facts, profile)
    # gloo: an all-gather 0.75x an allreduce, a reduce-scatter 1.3x; 3 units, 100 MB
    gather, scatter = 0.75 * 2 * (3e-3 + 0.1), 1.3 * (3e-3 + 0.1)
    assert resharded == pytest.approx(gather + scatter)
    assert kept == pytest.approx(gather / 2 + scatter)
    assert bf16 == pytest.approx(0.75 * 2 * (3e-3 + 0.05) + scatter)


def test_across_nodes_a_collective_costs_its_wire_bytes() -> None:
    """A shard group across two nodes' link: the all-gather puts half an allreduce's bytes on
    the wire, gloo's reduce-scatter a whole allreduce's (the emulated sweep's link counters);
    HSDP's shard groups within a node keep the shares measured on one machine's cores."""
    facts = _facts()
    profile = HardwareProfile(
        "emulated_2nodes_1gbit", "config", 2, 1, [], [AllreduceCost(2, Cost(1e-3, 1e9))]
    )
    across = step_communication_seconds(_config(hardware="emulated_2nodes_1gbit"), facts, profile)
    assert across == pytest.approx(0.5 * 2 * (3e-3 + 0.1) + 1.0 * (3e-3 + 0.1))
    nodes = HardwareProfile(
        "slurm_local_2nodes",
        "config",
        2,
        2,
        [],
        [AllreduceCost(workers, Cost(1e-3, 1e9)) for workers in (2, 4)],
    )
    within = step_communication_seconds(
        _config(
            "distribution.shard_degree=2",
            "hardware.workers_per_node=2",
            hardware="slurm_local_2nodes",
        ),
        facts,
        nodes,
    )
    # each node's shard group on its cores (gloo's shares), then the shards' allreduce
    # between the two nodes (50 MB of each worker's half of the gradients)
    gather, scatter = 0.75 * 2 * (3e-3 + 0.1), 1.3 * (3e-3 + 0.1)
    assert within == pytest.approx(gather + scatter + 3e-3 + 0.05)


def test_across_nodes_a_collective_costs_what_the_probe_timed_after_compute() -> None:
    """Where the probe timed FSDP's collectives after compute among the shard group's
    workers (CPU workers: across nodes, or on one machine's cores), each unit's all-gather and
    reduce-scatter is priced from those times, between two sizes on the straight line through
    them; elsewhere (GPUs, a group of another size) by its share of the allreduce."""
    facts = _facts()
    measured = {
        "workers": 2,
        "compute_before_ms": 20.0,
        "bytes": [1e6, 1e7, 1e8],
        "all_gather": [0.002, 0.05, 0.7],
        "reduce_scatter": [0.003, 0.08, 1.0],
    }
    allreduce = [AllreduceCost(2, Cost(1e-3, 1e9))]
    profile = HardwareProfile(
        "emulated_2nodes_1gbit",
        "measured",
        2,
        2,
        [],
        allreduce,
        {"collectives_after_compute": measured},
    )
    across = step_communication_seconds(_config(hardware="emulated_2nodes_1gbit"), facts, profile)
    # units of 10, 30 and 60 MB: 10 MB is the middle size; 30 and 60 MB between 10 and 100 MB
    gather = {10: 0.05, 30: 0.05 + 0.65 * 20 / 90, 60: 0.05 + 0.65 * 50 / 90}
    scatter = {10: 0.08, 30: 0.08 + 0.92 * 20 / 90, 60: 0.08 + 0.92 * 50 / 90}
    assert across == pytest.approx(sum(2 * gather[mb] + scatter[mb] for mb in (10, 30, 60)))
    kept = step_communication_seconds(
        _config("distribution.reshard_after_forward=false", hardware="emulated_2nodes_1gbit"),
        facts,
        profile,
    )
    assert kept == pytest.approx(sum(gather[mb] + scatter[mb] for mb in (10, 30, 60)))
    # the shares where the profile cannot say: a group of 4, one host's nodes
    wider = HardwareProfile(
        "emulated_2nodes_1gbit",
        "measured",
        4,
        2,
        [],
        [AllreduceCost(4, Cost(1e-3, 1e9))],
        {"collectives_after_compute": measured},
    )
    assert step_communication_seconds(
        _config("hardware.workers_per_node=2", hardware="emulated_2nodes_1gbit"), facts, wider
    ) == pytest.approx(0.5 * 2 * (3e-3 + 0.1) + 1.0 * (3e-3 + 0.1))
    one_machine = HardwareProfile(
        "local_2cpu", "measured", 2, 1, [], allreduce, {"collectives_after_compute": measured}
    )
    assert step_communication_seconds(
        _config(hardware="local_2cpu"), facts, one_machine
    ) == pytest.approx(across)
    gpus = _config("hardware.device=cuda", hardware="local_2cpu")
    assert collective_seconds(gpus, one_machine, "all_gather", 10.0) == pytest.approx(
        0.5 * (1e-3 + 0.01)
    )  # NCCL's half of the allreduce, on GPUs' own links


def test_the_copies_around_the_collectives_are_fsdps_own_term_on_cpu_workers() -> None:
    """MB gathered and reduced per step (2 x 100 resharded, 100 kept, bfloat16 halves the
    gathers) times the steps, per ms of `fsdp_copies`; prior 0 keeps the raw equation as it
    was; a GPU worker's copies are the device's."""
    facts = _facts()
    fsdp = spec_named("fsdp")

    def copies_s(config: DistbenchConfig) -> float:
        terms = fsdp.epoch_terms(config, facts, HardwareProfile.from_config(config.hardware))
        assert terms.seconds() == pytest.approx(terms.compute_s + terms.allreduce_s)
        return terms.coefficients().get(COPIES.name, 0.0) / terms.steps

    assert COPIES in fsdp.free_parameters and COPIES.prior == 0.0
    assert copies_s(_config()) == pytest.approx(0.3)
    assert copies_s(_config("distribution.reshard_after_forward=false")) == pytest.approx(0.2)
    assert copies_s(_config("distribution.mixed_precision=true")) == pytest.approx(0.2)
    assert copies_s(_config(hardware="h100_node")) == 0.0


def test_the_recommender_offers_fsdp_with_and_without_resharding() -> None:
    asked = _config(hardware="titanrtx_cluster")
    offered = [c.distribution for c in spec_named("fsdp").candidates(asked, worker_counts(asked))]
    assert all(isinstance(d, FSDPConfig) for d in offered)
    assert {d.reshard_after_forward for d in offered} == {True, False}
    assert any(d.shard_degree is not None for d in offered)  # HSDP on several nodes
    assert spec_named("fsdp").label(_config(), None) == "fsdp x4"
