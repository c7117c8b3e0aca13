"""Every plan trains what the sequential model trains: from one seed and one global batch, a
device-mesh plan (`distribution=mesh`: data parallelism replicated or sharded, tensor
parallelism with or without sequence parallelism, pipeline stages under each schedule that
runs over gloo, micro-batches and gradient accumulation, activation checkpointing) follows the
sequential model's per-step loss trajectory, and its trained weights, gathered whole, are the
sequential model's.

The setting: the Llama and GPT-2 presets' tiny decoders on synthetic tokens (sequences of
SEQ_LEN tokens), seed `run.seed`, a global batch of GLOBAL sequences (`run.global_batch`),
one epoch of STEPS steps, AdamW. Every trajectory is computed in float64, the workers' and the
sequential reference's alike (tests/integration/test_trajectories.py says why), so the plans
differ from the reference only in float summation order (tensor parallelism sums a projection
in two halves; data parallelism and micro-batches average partial gradients): FLOAT_TOLERANCE,
relative 1e-9, bounds that over STEPS steps. Checkpointing recomputes the same forward, so it
changes nothing beyond it either.

Four workers run every plan one after the other in one spawn (one gloo group, a device mesh
per plan); the sequential model runs in the test process.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from harness.commands.compose import compose_config
from harness.config.schema import DistbenchConfig, validate
from harness.distributions.base import TrainingContext
from harness.distributions.registry import spec_named
from harness.measure.metrics import PhaseClock
from harness.runtime.distributed import Peers
from harness.runtime.workload import Workload, build_workload
from harness.system.worker_env import WorkerEnvironment
from tests.helpers import spawn_workers
from tests.integration.test_trajectories import default_dtype, gap, worker_context
from tests.unit.harness.distributions.test_gpipe import free_port
from workloads.networks.tensor_parallel import hf_plan

STEPS, GLOBAL, SEQ_LEN, WORKERS = 3, 8, 16, 4
FLOAT_TOLERANCE = 1e-9  # relative: float64 summation order only (module docstring)
# relative, bfloat16 only: one bfloat16 rounding (2^-8); measured 1-2.2e-4 over STEPS steps
BF16_TOLERANCE = 2**-8
DTYPE = torch.float64
NETWORKS = ("llama_tiny", "gpt2_tiny")

# (name, network, the plan's settings): each plan of four workers, one dimension or more at a
# time; between them every schedule that runs over gloo, and each checkpointing mode.
PLANS: list[tuple[str, str, list[str]]] = [
    ("fsdp2 x tp2", "llama_tiny", ["distribution.tp=2"]),
    (
        "dp2 x tp2sp",
        "gpt2_tiny",
        ["distribution.tp=2", "distribution.dp_replicate=2", "distribution.sequence_parallel=true"],
    ),
    (
        "hsdp2x2 accumulated",
        "llama_tiny",
        [
            "distribution.dp_replicate=2",
            "distribution.micro_batch_size=1",
            "distribution.activation_checkpointing=full",
        ],
    ),
    ("tp2 x pp2 1f1b", "gpt2_tiny", ["distribution.tp=2", "distribution.pp=2"]),
    (
        "tp2 x pp2 gpipe",
        "llama_tiny",
        [
            "distribution.tp=2",
            "distribution.pp=2",
            "distribution.schedule=gpipe",
            "distribution.activation_checkpointing=selective",
        ],
    ),
    (
        "dp2 x pp2 interleaved",
        "llama_tiny",
        [
            "distribution.pp=2",
            "distribution.dp_replicate=2",
            "distribution.schedule=interleaved_1f1b",
        ],
    ),
    (
        "fsdp2 x pp2 zero bubble",
        "gpt2_tiny",
        ["distribution.pp=2", "distribution.schedule=interleaved_zb"],
    ),
    (
        "dp2 x pp2 looped_bfs",
        "llama_tiny",
        ["distribution.pp=2", "distribution.dp_replicate=2", "distribution.schedule=looped_bfs"],
    ),
    (
        "pp2 zbv",
        "gpt2_tiny",
        [
            "distribution.pp=2",
            "distribution.dp_replicate=2",
            "distribution.schedule=zbv",
            "distribution.micro_batch_size=2",
        ],
    ),
    # activation checkpointing is a setting of the data-parallel models too
    (
        "ddp ac=full",
        "llama_tiny",
        ["distribution=ddp", "distribution.activation_checkpointing=full"],
    ),
    (
        "fsdp ac=sel",
        "gpt2_tiny",
        ["distribution=fsdp", "distribution.activation_checkpointing=selective"],
    ),
]


def overrides(network: str, plan: list[str] | None) -> list[str]:
    common = [
        "dataset=tokens",
        f"dataset.seq_len={SEQ_LEN}",
        "dataset.vocab_size=64",
        f"dataset.num_samples={STEPS * GLOBAL}",
        f"network={network}",
        "optimizer.name=adamw",
        "optimizer.lr=0.001",
        f"run.global_batch={GLOBAL}",
        "run.progress=false",
    ]
    if plan is None:
        return common
    model = [] if any(o.startswith("distribution=") for o in plan) else ["distribution=mesh"]
    return [*model, "hardware=local_4cpu", *common, *plan]


def workload(
    network: str, plan: list[str] | None, rank: int = 0
) -> tuple[DistbenchConfig, Workload]:
    config = validate(compose_config(overrides(network, plan)))
    shards = config.distribution.data_shards(config)
    shard = config.distribution.data_shard_of(config, rank)
    return config, build_workload(config, rank=shard, world_size=shards)


def one_process(config: DistbenchConfig, built: Workload) -> TrainingContext:
    """What the harness gives the sequential model's one CPU worker."""
    cpu = torch.device("cpu")
    return TrainingContext(
        config=config,
        workload=built,
        device=cpu,
        clock=PhaseClock(cpu),
        peers=Peers(WorkerEnvironment(), backend=None),
        heartbeat=lambda: None,
    )


def fingerprint(module: nn.Module) -> dict[str, list[float]]:
    """Per parameter: its sum and sum of magnitudes in float64, by its layer-list position."""
    return {
        name: [float(t.detach().double().sum()), float(t.detach().double().abs().sum())]
        for name, t in module.named_parameters()
    }


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=120),
    )
    torch.set_num_threads(1)
    torch.set_default_dtype(DTYPE)
    try:
        reports = {}
        for name, network, plan in PLANS:
            config, built = workload(network, plan, rank)
            context = worker_context(config, built, rank, world_size)
            trainer = spec_named(config.distribution.name).trainer(context)
            losses = trainer.train_epoch(0).batch_losses
            trained = fingerprint(trainer.evaluation_model())
            reports[name] = {
                "losses": losses,
                "trained": trained,
                "run_name": config.run_name,
                "metrics": sorted(trainer.extra_metrics()),
            }
        Path(out, f"rank{rank}.json").write_text(json.dumps(reports))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def dataset_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DISTBENCH_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "dataset-cache"))
        yield


@pytest.fixture(scope="module")
def plan_reports(tmp_path_factory: pytest.TempPathFactory, dataset_cache: None) -> list[dict]:
    out = tmp_path_factory.mktemp("plans")
    with default_dtype(DTYPE):
        for network in NETWORKS:  # the token cache, built once here
            workload(network, None)
    spawn_workers(_worker, args=(WORKERS, free_port(), str(out)), nprocs=WORKERS)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORKERS)]


@pytest.fixture(scope="module")
def sequential(dataset_cache: None) -> dict[str, dict]:
    """Each network's sequential trajectory and trained weights (in this process)."""
    reports = {}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with default_dtype(DTYPE):
            for network in NETWORKS:
                config, built = workload(network, None)
                trainer = spec_named("sequential").trainer(one_process(config, built))
                losses = trainer.train_epoch(0).batch_losses
                trained = trainer.evaluation_model()
                as_trained = fingerprint(trained)
                # and in the form a tensor-parallel plan rewrites it to (GPT-2's Conv1D as
                # nn.Linear: the same function and the same weights, transposed and split)
                hf_plan(config.network.ref, trained, 1, False)
                reports[network] = {
                    "losses": [losses[step] for step in range(STEPS)],
                    "trained": as_trained,
                    "trained_tp": fingerprint(trained),
                }
    finally:
        torch.set_num_threads(before)
    return reports


def trajectory(reports: list[dict], plan: str) -> list[float]:
    """Per step, the mean of the losses the workers report for it (what a cell records)."""
    per_step: dict[int, list[float]] = {}
    for report in reports:
        for step, loss in report[plan]["losses"].items():
            per_step.setdefault(int(step), []).append(loss)
    assert sorted(per_step) == list(range(STEPS)), plan
    return [sum(per_step[s]) / len(per_step[s]) for s in range(STEPS)]


@pytest.mark.parametrize("name, network", [(name, network) for name, network, _ in PLANS])
def test_a_plan_follows_the_sequential_trajectory(
    plan_reports: list[dict], sequential: dict[str, dict], name: str, network: str
) -> None:
    measured = trajectory(plan_reports, name)
    reference = sequential[network]["losses"]
    print(f"{name}: largest relative gap to sequential {gap(measured, reference):.2e}")
    assert gap(measured, reference) < FLOAT_TOLERANCE
    assert len(set(map(round, [measured[0] * 1e6, measured[-1] * 1e6]))) == 2  # it trained


@pytest.mark.parametrize("name, network, plan", PLANS)
def test_a_plan_gathers_the_sequential_weights(
    plan_reports: list[dict], sequential: dict[str, dict], name: str, network: str, plan: list[str]
) -> None:
    """Every worker's whole network (its own stages' and shards' weights and the others',
    gathered) is the sequential model's after the same steps."""
    tensor_parallel = "distribution.tp=2" in plan
    reference = sequential[network]["trained_tp" if tensor_parallel else "trained"]
    for report in plan_reports:
        trained = report[name]["trained"]
        assert set(trained) == set(reference)
        for key, (total, magnitude) in reference.items():
            assert abs(trained[key][0] - total) <= FLOAT_TOLERANCE * max(magnitude, 1.0), key
            assert abs(trained[key][1] - magnitude) <= FLOAT_TOLERANCE * max(magnitude, 1.0), key


def test_a_plans_name_leads_with_the_plan(plan_reports: list[dict]) -> None:
    """The run's name: the plan (axes, schedule, micro-batch, checkpointing), the workers,
    the global batch and a data-parallel position's batch, the network and data."""
    names = {name: plan_reports[0][name]["run_name"] for name, _, _ in PLANS}
    assert names == {
        "fsdp2 x tp2": "fsdp2 x tp2 mb4 1x4 g8 b4 llama_tiny-tokens-t16-v64",
        "dp2 x tp2sp": "dp2 x tp2sp mb4 1x4 g8 b4 gpt2_tiny-tokens-t16-v64",
        "hsdp2x2 accumulated": "hsdp2x2 mb1 ac=full 1x4 g8 b2 llama_tiny-tokens-t16-v64",
        "tp2 x pp2 1f1b": "tp2 x pp2 1f1b mb4 1x4 g8 b8 gpt2_tiny-tokens-t16-v64",
        "tp2 x pp2 gpipe": "tp2 x pp2 gpipe mb4 ac=sel2 1x4 g8 b8 llama_tiny-tokens-t16-v64",
        "dp2 x pp2 interleaved": (
            "dp2 x pp2 interleaved_1f1b v2 mb2 1x4 g8 b4 llama_tiny-tokens-t16-v64"
        ),
        "fsdp2 x pp2 zero bubble": (
            "fsdp2 x pp2 interleaved_zb v2 mb2 1x4 g8 b4 gpt2_tiny-tokens-t16-v64"
        ),
        "dp2 x pp2 looped_bfs": "dp2 x pp2 looped_bfs v2 mb2 1x4 g8 b4 llama_tiny-tokens-t16-v64",
        "pp2 zbv": "dp2 x pp2 zbv mb2 1x4 g8 b4 gpt2_tiny-tokens-t16-v64",
        "ddp ac=full": "ddp 1x4 ac=full b2 llama_tiny-tokens-t16-v64",
        "fsdp ac=sel": "fsdp 1x4 ac=sel2 b2 gpt2_tiny-tokens-t16-v64",
    }


@pytest.mark.parametrize(
    "setting",
    [
        "distribution.activation_checkpointing=full",
        "distribution.activation_checkpointing=selective",
    ],
)
def test_checkpointing_changes_nothing_the_sequential_model_computes(
    sequential: dict[str, dict], setting: str
) -> None:
    """Recomputing a layer's forward in its backward gives the same gradients: the same
    trajectory, bit for bit, as keeping the activations."""
    assert one_sequential_trajectory("llama_tiny", [setting]) == sequential["llama_tiny"]["losses"]


def test_bfloat16_trains_near_the_float32_trajectory(dataset_cache: None) -> None:
    """bfloat16 compute (autocast of float32 weights) and bfloat16 parameters train the same
    model as float32 to within bfloat16's rounding (8 bits of mantissa: a relative 2^-8 per
    operation), not to float summation order: BF16_TOLERANCE is stated for them alone. (In
    float32: autocast lowers float32 operations only.)"""
    reference = one_sequential_trajectory("llama_tiny", [], torch.float32)
    for precision in ("bf16_mixed", "bf16"):
        setting = f"distribution.precision={precision}"
        losses = one_sequential_trajectory("llama_tiny", [setting], torch.float32)
        print(f"{precision}: largest relative gap to float32 {gap(losses, reference):.2e}")
        assert gap(losses, reference) < BF16_TOLERANCE
        assert gap(losses, reference) > 1e-6  # it did compute in bfloat16


def one_sequential_trajectory(
    network: str, settings: list[str], dtype: torch.dtype = DTYPE
) -> list[float]:
    """The sequential model's losses with `settings`, in this process (`dtype` default)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with default_dtype(dtype):
            config = validate(compose_config([*overrides(network, None), *settings]))
            built = build_workload(config)
            trainer = spec_named("sequential").trainer(one_process(config, built))
            losses = trainer.train_epoch(0).batch_losses
    finally:
        torch.set_num_threads(before)
    return [losses[step] for step in range(STEPS)]


def test_a_pipeline_plan_says_where_each_stage_spent_its_epoch(plan_reports: list[dict]) -> None:
    """A pipeline worker's bubble and phases, by its place in the pipeline; none without one."""
    for rank, report in enumerate(plan_reports):
        place = rank // 2  # tp2 x pp2: ranks 0-1 the first stage, 2-3 the second
        assert f"bubble_stage{place}" in report["tp2 x pp2 1f1b"]["metrics"]
        assert f"backward_seconds_per_epoch_stage{place}" in report["tp2 x pp2 1f1b"]["metrics"]
        assert not [m for m in report["fsdp2 x tp2"]["metrics"] if m.startswith("bubble")]
