"""Every distribution model trains the same thing: from one seed and one global batch,
sequential, DDP, Horovod and GPipe follow the same per-step loss trajectory, and PipeDream's
differs only as its weight stashing predicts.

The setting: VGG-11 on synthetic MNIST, seed `run.seed`, a global batch of 8 (data-parallel:
`distribution.batch_size=4` per worker on 2 workers; pipelines: the whole batch of 8), one
epoch of STEPS steps in the data order of (seed, epoch 0), SGD with momentum and weight decay.
The data-parallel ranks' shards of step k together are exactly the sequential batch k (rank r
reads every 2nd sample of the epoch's order from r: the test checks this), and a pipeline's
first stage reads the unsharded batch k.

What may differ, and the tolerances:
- Without BatchNorm (the network's BatchNorm layers replaced by identities, in the test only)
  the gradient of every model is, in exact arithmetic, that of the batch's mean loss, so all
  four trajectories are one. They differ only in float summation order (DDP and Horovod average
  two shard gradients, GPipe sums four micro-batches' scaled gradients), which SGD carries
  forward. Everything trains in float64 (DTYPE: why, there), so these differences stay near
  1e-16 however a trajectory amplifies them. FLOAT_TOLERANCE (relative 1e-9) bounds them with
  ample room over STEPS steps; the test prints what it measured.
- With BatchNorm, a layer normalises with the statistics of the samples it sees at once: a
  data-parallel worker's shard, a GPipe micro-batch. Those trajectories are not the sequential
  one (the test asserts the gap is far above FLOAT_TOLERANCE); they equal, to FLOAT_TOLERANCE, a
  single-process reference that normalises the batch in the same groups (DDP: the two
  interleaved shards; GPipe: the four contiguous micro-batches) and averages the groups'
  losses. PipeDream trains whole minibatches, so its BatchNorm groups are the sequential ones.
- PipeDream (stages 1-1): its trajectory is predicted by a single-process simulation of 1F1B
  with weight stashing: minibatch m's forward and backward on stage s use the stage's weights
  after as many updates as stage s ran backwards before F(m) in onefoneb.worker_ops (the
  trainer's version_log must say the same), and the gradient updates the live weights. The
  trainer matches that prediction to FLOAT_TOLERANCE and differs from the sequential
  trajectory by far more.

Also: `evaluation_model()` (data-parallel: the replicas agree; pipelines: every worker's
assembled network is the stages' trained weights, and equals the reference's final weights)
and `reset()` (weights and optimizer state back to the initial ones; training again gives
the same losses, bit for bit).

Two workers run every multi-worker model one after the other in one spawn (one process pool,
one gloo group); the sequential model and the references run in the test process.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from harness.commands.compose import compose_config
from harness.config.schema import DistbenchConfig, validate
from harness.costs.onefoneb import Kind, worker_ops
from harness.distributions.base import TrainingContext
from harness.distributions.registry import spec_named
from harness.measure.metrics import PhaseClock
from harness.runtime.distributed import Peers
from harness.runtime.workload import Workload, build_workload
from harness.system.worker_env import WorkerEnvironment
from tests.helpers import spawn_workers
from tests.unit.harness.distributions.test_gpipe import free_port

STEPS, BATCH, WORKERS, MICRO_BATCHES = 6, 8, 2, 4
BALANCE = "[11,20]"  # VGG-11's 31 layers in two stages (no profiling)
FLOAT_TOLERANCE = 1e-9  # relative: float64 summation order only (see the module docstring)
# Every trajectory is computed in float64, the workers' and the references' alike. With
# BatchNorm, a layer normalising 2 or 4 samples at a 1x1 spatial size divides by their spread,
# which can be nearly zero: there a trajectory is chaotic, and it multiplied float32's
# summation-order differences (~1e-7) up to 1e-3 within STEPS steps, past the tolerance, at
# learning rates and on CPUs that nobody could list in advance (0.01 on an AMD EPYC, 0.002 on
# an Intel Xeon, measured 2026-11-28). float64's differences (~1e-16) stay far below it
# whatever the amplification. (The data path gives images in torch's default dtype.)
DTYPE = torch.float64
# Where the BatchNorm trajectories stay smooth over STEPS steps (at the default 0.01 they
# spike: the loss goes from 2.1 to 4.7); float64 makes either rate safe, this one reads better.
LR = "optimizer.lr=0.002"
# (model, with BatchNorm, check reset) the workers train; Horovod once (hvd.init once per
# process). reset() is checked once per trainer class (it trains the epoch a second time).
# PipeDream only with BatchNorm: without it this network barely learns in STEPS steps (the
# loss stays near ln 10), so stale weights change little that could be seen.
CASES = [
    ("ddp", False, False),
    ("ddp", True, True),
    ("gpipe", False, False),
    ("gpipe", True, True),
    ("pipedream", True, True),
    ("horovod", False, True),
]


def overrides(model: str) -> list[str]:
    common = [
        "dataset=mnist",
        "network=vgg11",
        f"dataset.num_samples={STEPS * BATCH}",
        LR,
        "run.progress=false",
    ]
    if model == "sequential":
        return [*common, f"distribution.batch_size={BATCH}"]
    distributed = [f"distribution={model}", "hardware=local_2cpu", *common]
    if model in ("ddp", "horovod"):
        return [*distributed, f"distribution.batch_size={BATCH // WORKERS}"]
    pipeline = [*distributed, f"distribution.batch_size={BATCH}", f"distribution.balance={BALANCE}"]
    if model == "gpipe":
        return [*pipeline, f"distribution.micro_batches={MICRO_BATCHES}"]
    return [*pipeline, "distribution.stages=1-1"]


def workload(model: str, batchnorm: bool, rank: int = 0) -> tuple[DistbenchConfig, Workload]:
    """The cell's config and this worker's workload (data-parallel: its shard)."""
    config = validate(compose_config(overrides(model)))
    sharded = model in ("ddp", "horovod")
    built = (
        build_workload(config, rank=rank, world_size=WORKERS) if sharded else build_workload(config)
    )  # pipelines do not shard the data by worker
    if not batchnorm:
        strip_batchnorm(built.model)
    return config, built


def strip_batchnorm(model: nn.Module) -> None:
    """Replace every BatchNorm layer by an identity, in place (the layer count, and so the
    stage plan, stays the same)."""
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, nn.BatchNorm2d):
                setattr(module, name, nn.Identity())


def fingerprint(module: nn.Module) -> dict[str, list[float]]:
    """Per state entry (parameters and buffers): its sum and its sum of magnitudes, in float64:
    enough to tell weights apart, small enough to pass between processes."""
    return {
        name: [float(t.double().sum()), float(t.double().abs().sum())]
        for name, t in module.state_dict().items()
    }


def stage_fingerprint(network: nn.Module, stage: nn.Module) -> dict[str, list[float]]:
    """`fingerprint` of a pipeline stage's own tensors, under the whole network's names."""
    names = {id(t): name for name, t in network.state_dict(keep_vars=True).items()}
    return {
        names[id(t)]: [float(t.double().sum()), float(t.double().abs().sum())]
        for t in stage.state_dict(keep_vars=True).values()
    }


def train_and_reset(context: TrainingContext, model: str, check_reset: bool) -> dict:
    """Build `model`'s trainer, train one epoch, evaluate; with `check_reset`, reset and
    train the epoch again."""
    trainer = spec_named(model).trainer(context)
    initial = fingerprint(trainer.evaluation_model())
    first = trainer.train_epoch(0).batch_losses
    versions = [[r.minibatch, r.forward_version] for r in getattr(trainer, "version_log", [])]
    trained = fingerprint(trainer.evaluation_model())
    stage = (
        stage_fingerprint(context.workload.model, trainer.module)
        if hasattr(trainer, "module")
        else None
    )
    report = {
        "initial": initial,
        "first": first,
        "trained": trained,
        "stage": stage,
        "versions": versions,
    }
    if check_reset:
        trainer.reset()
        report.update(
            optimizer_state_after_reset=len(trainer.optimizer.state),
            version_after_reset=getattr(trainer, "version", 0),
            reset=fingerprint(trainer.evaluation_model()),
        )
        report["second"] = trainer.train_epoch(0).batch_losses
    return json.loads(json.dumps(report))  # batch indices become strings, as the workers' do


def worker_context(
    config: DistbenchConfig, built: Workload, rank: int, world_size: int
) -> TrainingContext:
    """What the harness gives a CPU worker of a gloo group that is already initialised."""
    cpu = torch.device("cpu")
    return TrainingContext(
        config=config,
        workload=built,
        device=cpu,
        clock=PhaseClock(cpu),
        peers=Peers(
            WorkerEnvironment(rank=rank, local_rank=rank, world_size=world_size), backend="gloo"
        ),
        heartbeat=lambda: None,
    )


def _worker(
    rank: int, world_size: int, port: int, out: str, cases: list[tuple[str, bool, bool]]
) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=120),
    )
    torch.set_num_threads(1)
    torch.set_default_dtype(DTYPE)  # this process only trains these trajectories
    try:
        reports = {}
        for model, batchnorm, check_reset in cases:
            config, built = workload(model, batchnorm, rank)
            context = worker_context(config, built, rank, world_size)
            reports[f"{model}/{batchnorm}"] = {
                **train_and_reset(context, model, check_reset),
                "shard": built.loader.batch_indices().tolist(),
            }
        Path(out, f"rank{rank}.json").write_text(json.dumps(reports))
    finally:
        dist.destroy_process_group()


# -- the single-process references ------------------------------------------------------------
def reference(
    batchnorm: bool,
    groups: Sequence[Sequence[int]],
    forward_versions: Sequence[Sequence[int]] | None = None,
) -> tuple[list[float], dict]:
    """Loss per step of SGD on the sequential batches, each batch's loss the mean of its
    `groups`' (positions in the batch) mean losses, each group forwarded alone (its own
    BatchNorm statistics); and the final parameters' fingerprint (parameters only: BatchNorm's
    running statistics depend on how often each worker forwards, e.g. GPipe's recomputation
    updates them again, and are not part of the trajectory).

    With `forward_versions` (per layer-list stage, per minibatch: the weight version its
    forward used), PipeDream with weight stashing: minibatch m runs every stage on the weights
    after `forward_versions[s][m]` updates, and its gradient updates the live weights."""
    config, built = workload("sequential", batchnorm)
    network = built.model
    optimizer = built.make_optimizer(network.parameters())
    criterion = nn.CrossEntropyLoss()
    stage_of = _stage_of_parameter(config, network) if forward_versions else {}
    history = [{n: p.detach().clone() for n, p in network.named_parameters()}]  # by version
    losses = []
    built.loader.set_epoch(0)
    for m, (images, labels) in enumerate(built.loader):
        weights = {
            n: (history[forward_versions[stage_of[n]][m]][n] if forward_versions else p)
            .detach()
            .clone()
            .requires_grad_()
            for n, p in network.named_parameters()
        }
        loss = sum(
            criterion(functional_call(network, weights, (images[list(g)],)), labels[list(g)])
            for g in groups
        ) / len(groups)
        loss.backward()
        for name, p in network.named_parameters():
            p.grad = weights[name].grad
        optimizer.step()
        optimizer.zero_grad()
        history.append({n: p.detach().clone() for n, p in network.named_parameters()})
        losses.append(float(loss.detach()))
    weights = {
        name: [float(p.double().sum()), float(p.double().abs().sum())]
        for name, p in network.named_parameters()
    }
    return losses, weights


def _stage_of_parameter(config: DistbenchConfig, network: nn.Module) -> dict[str, int]:
    """Parameter name -> its PipeDream stage under BALANCE."""
    from workloads.networks import to_layer_list

    first_of_second = json.loads(BALANCE)[0]
    layers = to_layer_list(config.network.name, network)
    owner = {
        id(p): int(i >= first_of_second)
        for i, layer in enumerate(layers)
        for p in layer.parameters()
    }
    return {name: owner[id(p)] for name, p in network.named_parameters()}


def pipedream_forward_versions() -> list[list[int]]:
    """Per stage of 1-1, per minibatch: the updates the stage ran before that forward in 1F1B."""
    versions = []
    for stage in range(2):
        backwards, seen = 0, {}
        for op in worker_ops([1, 1], stage, 0, STEPS):
            if op.kind is Kind.forward:
                seen[op.minibatch] = backwards
            else:
                backwards += 1
        versions.append([seen[m] for m in range(STEPS)])
    return versions


# -- comparisons ------------------------------------------------------------------------------
def trajectory(reports: list[dict], case: str, key: str = "first") -> list[float]:
    """Per step, the mean of the workers' losses for it (what harness.worker.run records)."""
    per_step: dict[int, list[float]] = {}
    for report in reports:
        for step, loss in report[case][key].items():
            per_step.setdefault(int(step), []).append(loss)
    assert sorted(per_step) == list(range(STEPS)), case
    return [sum(per_step[s]) / len(per_step[s]) for s in range(STEPS)]


def gap(a: Sequence[float], b: Sequence[float]) -> float:
    """The largest relative difference between two trajectories."""
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def moved(before: dict[str, list[float]], after: dict[str, list[float]]) -> float:
    """The largest change of a fingerprint entry (`fingerprint`) from `before` to `after`,
    relative to its sum of magnitudes before."""
    return max(
        abs(x - y) / max(before[k][1], 1e-12) for k in before for x, y in zip(after[k], before[k])
    )


def close(a: dict[str, list[float]], b: dict[str, list[float]], tolerance: float) -> bool:
    """`a` agrees with `b` on every entry `b` has: sum and sum of magnitudes to `tolerance`
    relative to the sum of magnitudes (a sum's rounding error scales with it, not with the sum,
    which cancels)."""
    return all(abs(x - y) <= tolerance * max(b[k][1], 1.0) for k in b for x, y in zip(a[k], b[k]))


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default dtype (new parameters, the synthetic images) is `dtype` inside."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@pytest.fixture(scope="module", autouse=True)
def in_float64() -> Iterator[None]:
    """The module's references and sequential runs in float64 (DTYPE), like its workers; the
    test process's default dtype back afterwards, for the modules that run after it."""
    with default_dtype(DTYPE):
        yield


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """The module's references and sequential runs on one thread, as each worker trains (the
    results do not depend on it: float64, FLOAT_TOLERANCE). Two threads on two cores that the
    suite keeps busy spin while they wait for each other: two references took 29.5 CPU-s on
    two threads against 6.6 on one, measured with the cores oversubscribed (about the same on
    an idle machine). The test process's thread count back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def dataset_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """conftest's dataset cache (one per test run) for the module-scoped fixtures too, which run
    before its function-scoped autouse fixture sets it (else they would read the user's
    ~/.cache)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DISTBENCH_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "dataset-cache"))
        yield


@pytest.fixture(scope="module")
def worker_reports(tmp_path_factory: pytest.TempPathFactory, dataset_cache: None) -> list[dict]:
    out = tmp_path_factory.mktemp("trajectories")
    for model, batchnorm, _ in CASES:  # the synthetic data cache, built once here
        workload(model, batchnorm)
    spawn_workers(_worker, args=(WORKERS, free_port(), str(out), CASES), nprocs=WORKERS)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORKERS)]


@pytest.fixture(scope="module")
def sequential(dataset_cache: None) -> dict[bool, dict]:
    """The sequential trainer's report, with and without BatchNorm (in this process)."""
    reports = {}
    for batchnorm in (False, True):
        config, built = workload("sequential", batchnorm)
        cpu = torch.device("cpu")
        context = TrainingContext(
            config=config,
            workload=built,
            device=cpu,
            clock=PhaseClock(cpu),
            peers=Peers(WorkerEnvironment(), backend=None),
            heartbeat=lambda: None,
        )
        reports[batchnorm] = {
            **train_and_reset(context, "sequential", check_reset=batchnorm),
            "batches": built.loader.batch_indices().tolist(),
        }
    return reports


WHOLE = [range(BATCH)]
SHARDS = [range(r, BATCH, WORKERS) for r in range(WORKERS)]  # rank r: every 2nd sample from r
MICRO = [range(k, k + BATCH // MICRO_BATCHES) for k in range(0, BATCH, BATCH // MICRO_BATCHES)]


def test_the_data_parallel_shards_together_are_the_sequential_batches(
    worker_reports: list[dict], sequential: dict[bool, dict]
) -> None:
    batches = sequential[False]["batches"]
    for model in ("ddp", "horovod"):
        shards = [report[f"{model}/False"]["shard"] for report in worker_reports]
        for step, batch in enumerate(batches):
            for rank, positions in enumerate(SHARDS):
                assert shards[rank][step] == [batch[i] for i in positions]


def test_sequential_ddp_horovod_and_gpipe_follow_one_trajectory_without_batchnorm(
    worker_reports: list[dict], sequential: dict[bool, dict]
) -> None:
    expected = sequential[False]["first"]
    expected = [expected[str(s)] for s in range(STEPS)]
    for model in ("ddp", "horovod", "gpipe"):
        measured = gap(trajectory(worker_reports, f"{model}/False"), expected)
        print(f"{model} vs sequential, no BatchNorm: largest relative gap {measured:.1e}")
        assert measured <= FLOAT_TOLERANCE, model
    # It trains: SGD moved the weights far beyond the tolerance, so that agreeing is no
    # agreement of networks that stood still. (Not "the loss falls": without BatchNorm this
    # network's loss stays within 0.03 of ln 10 over STEPS steps at every learning rate from
    # 0.001 to 0.05, each step a new batch, so whether the last step's loss is below the first
    # one's is the initialisation's luck.)
    assert moved(sequential[False]["initial"], sequential[False]["trained"]) > 10 * FLOAT_TOLERANCE


@pytest.mark.parametrize(("model", "groups"), [("ddp", SHARDS), ("gpipe", MICRO)])
def test_with_batchnorm_each_model_normalises_the_groups_it_sees(
    worker_reports: list[dict], sequential: dict[bool, dict], model: str, groups: list[range]
) -> None:
    plain = [sequential[True]["first"][str(s)] for s in range(STEPS)]
    predicted, final = reference(True, groups)
    measured = trajectory(worker_reports, f"{model}/True")
    print(
        f"{model} with BatchNorm: gap to its grouped reference {gap(measured, predicted):.1e}, "
        f"to sequential {gap(measured, plain):.1e}"
    )
    assert gap(measured, predicted) <= FLOAT_TOLERANCE
    assert gap(measured, plain) > 10 * FLOAT_TOLERANCE  # BatchNorm's groups do matter
    for report in worker_reports:  # the network it evaluates is the reference's
        assert close(report[f"{model}/True"]["trained"], final, FLOAT_TOLERANCE)


def test_pipedream_follows_the_trajectory_weight_stashing_predicts(
    worker_reports: list[dict], sequential: dict[bool, dict]
) -> None:
    versions = pipedream_forward_versions()
    batchnorm, case = True, "pipedream/True"
    for stage, report in enumerate(worker_reports):  # stage s on rank s (1-1)
        assert report[case]["versions"] == [[m, versions[stage][m]] for m in range(STEPS)]
    assert versions[0] == [0, 0, 1, 2, 3, 4] and versions[1] == list(range(STEPS))
    predicted, final = reference(batchnorm, WHOLE, versions)
    plain = [sequential[batchnorm]["first"][str(s)] for s in range(STEPS)]
    measured = trajectory(worker_reports, case)
    print(
        f"pipedream (BatchNorm {batchnorm}): gap to the prediction "
        f"{gap(measured, predicted):.1e}, to sequential {gap(measured, plain):.1e}"
    )
    assert gap(measured, predicted) <= FLOAT_TOLERANCE
    assert gap(measured[:1], plain[:1]) <= FLOAT_TOLERANCE  # stale weights from step 1 on
    assert gap(measured, plain) > 10 * FLOAT_TOLERANCE
    for report in worker_reports:
        assert close(report[case]["trained"], final, FLOAT_TOLERANCE)


@pytest.mark.parametrize("case", [f"{m}/{bn}" for m, bn, _ in CASES])
def test_every_worker_evaluates_the_network_as_trained(
    worker_reports: list[dict], case: str
) -> None:
    ranks = [report[case] for report in worker_reports]
    # Every worker's evaluation network is the same (pipelines: assembled from the stages).
    assert ranks[0]["trained"] == ranks[1]["trained"] != ranks[0]["initial"]
    for report in ranks:
        if report["stage"] is not None:  # its own stage's trained tensors, unchanged
            assert all(report["trained"][name] == value for name, value in report["stage"].items())
    if ranks[0]["stage"] is not None:  # the stages together cover the network
        assert ranks[0]["stage"].keys() | ranks[1]["stage"].keys() == ranks[0]["trained"].keys()


@pytest.mark.parametrize("case", [f"{m}/{bn}" for m, bn, reset in CASES if reset])
def test_reset_returns_to_the_start_and_training_repeats_itself(
    worker_reports: list[dict], case: str
) -> None:
    for report in (report[case] for report in worker_reports):
        # reset: the initial weights and buffers, no optimizer state, and the same losses again
        assert report["reset"] == report["initial"]
        assert report["optimizer_state_after_reset"] == 0
        assert report["version_after_reset"] == 0
        assert report["second"] == report["first"]


def test_the_sequential_trainer_resets_to_its_start(sequential: dict[bool, dict]) -> None:
    report = sequential[True]
    assert report["reset"] == report["initial"] != report["trained"]
    assert report["optimizer_state_after_reset"] == 0
    assert report["second"] == report["first"]
