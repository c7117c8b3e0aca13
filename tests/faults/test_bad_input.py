"""Bad input, as a user meets it: every command answers an invalid config, an unknown name or an
impossible combination with one line on stderr that names the key and what is allowed, exit
status 2 and no traceback, before any cell starts (harness.cli)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.commands.compose import compose_config
from harness.config.schema import ConfigError, validate
from tests.helpers import REPO_ROOT, install_slurm_where_missing
from tests.in_process import listing, refusal_broken, run_in_process

NETWORKS = (
    "bert_large, gpt2_large, gpt2_medium, gpt2_small, gpt2_tiny, gpt2_xl, hf, llama3_405b, "
    "llama3_70b, llama3_8b, "
    "llama_tiny, mobilenetv2, module, resnet152, resnet18, resnet50, timm, torchvision, "
    "vgg11, vgg16"
)

# Commands that take config overrides. analysis/recommend are checked once they exist.
COMMANDS = [
    "harness",
    "harness.describe",
    "harness.probe",
    "harness.plan",
    "harness.analysis",
    "harness.recommend",
]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The outcome of every row of BAD_INPUTS (below), the named cases' included: all run in
    one subprocess (run_table), once for this module, as each was run in its own before."""
    import json
    import subprocess

    # A row whose sweep goes to SLURM is checked past "SLURM is not installed" only where it is
    # (the cluster modules, in the other process, may not have installed it yet).
    install_slurm_where_missing()
    root = tmp_path_factory.mktemp("bad-inputs")
    done = subprocess.run(
        [sys.executable, "-m", "tests.faults.test_bad_input", str(root)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((root / "report.json").read_text())


def _assert_one_line_exit_2(table: list[dict], case: Bad, *fragments: str) -> None:
    """`case` (a row of BAD_INPUTS) exited with status 2, printed one line starting
    'distbench: ' that says `case.says` and every fragment, no traceback, and wrote nothing
    (_verdict below, which runs on every row)."""
    row = table[BAD_INPUTS.index(case)]
    assert row["broken"] is None, f"{row['case']}: {row['broken']}\n{row['stderr'][-600:]}"
    for fragment in fragments:
        assert fragment in row["stderr"], row["stderr"]


@pytest.mark.parametrize("module", COMMANDS)
def test_an_unknown_group_option_lists_the_choices(module: str, table: list[dict]) -> None:
    _assert_one_line_exit_2(table, UNKNOWN_NETWORK[module])


@pytest.mark.parametrize("module", ["harness", "harness.plan"])
def test_an_impossible_pipeline_stops_the_command(module: str, table: list[dict]) -> None:
    _assert_one_line_exit_2(
        table, IMPOSSIBLE_PIPELINE[module], "sum to the 15 layers of network=resnet18"
    )


def test_a_sweep_with_an_unknown_option_stops_before_any_cell(table: list[dict]) -> None:
    _assert_one_line_exit_2(table, SWEEP_WITH_UNKNOWN_OPTION)


def test_a_gpu_sweep_on_a_machine_without_one_starts_no_cell(table: list[dict]) -> None:
    """`+sweep=imagenet_resnet` (CUDA hardware) with the local launcher: it used to run its
    3 cells to `failed` and exit 0."""
    if torch_cuda_available():
        pytest.skip("this machine has CUDA: the sweep would be valid here")
    _assert_one_line_exit_2(table, GPU_SWEEP)


def test_a_wrong_flag_value_is_one_line(table: list[dict]) -> None:
    _assert_one_line_exit_2(table, WRONG_FLAG_VALUE)


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def test_a_misspelled_appended_key_is_not_ignored(table: list[dict]) -> None:
    _assert_one_line_exit_2(table, MISSPELLED_APPENDED_KEY)


def test_a_malformed_override_is_one_line(table: list[dict]) -> None:
    _assert_one_line_exit_2(table, MALFORMED_OVERRIDE)


def test_teardown_lines_are_refused_before_any_job(table: list[dict]) -> None:
    """As a user meets test_safety's refusal of `teardown`: one line, exit status 2, before
    any job is submitted, and the lines never ran."""
    _assert_one_line_exit_2(table, TEARDOWN, "is invalid", "allowed: null")


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        # more pipeline stages than the network has layers (ResNet-18's list has 15)
        (
            [
                "distribution=gpipe",
                "network=resnet18",
                "hardware.workers_per_node=16",
                "distribution.batch_size=32",
                "distribution.micro_batches=4",
            ],
            "hardware.workers_per_node=16 is invalid: 16 pipeline stages for network=resnet18, "
            "which has 15 layers; allowed: at most 15 stages",
        ),
        (
            [
                "distribution=pipedream",
                "network=resnet18",
                "hardware.workers_per_node=16",
                "distribution.stages=" + "-".join(["1"] * 16),
            ],
            "allowed: at most 15 stages",
        ),
        # a replication plan that does not match the worker count
        (
            ["distribution=pipedream", "hardware=local_4cpu", "distribution.stages=2-1"],
            "the replica counts must sum to the 4 workers of hardware=local_4cpu",
        ),
        (
            [
                "distribution=pipedream",
                "hardware=local_4cpu",
                "distribution.stages=2-1-1",
                "distribution.balance=[5,5]",
            ],
            "needs one layer count per stage (3)",
        ),
        # a balance that does not cover the layer list
        (
            [
                "distribution=gpipe",
                "hardware=local_2cpu",
                "network=resnet18",
                "distribution.balance=[10,10]",
                "distribution.batch_size=32",
                "distribution.micro_batches=4",
            ],
            "must sum to the 15 layers of network=resnet18",
        ),
        # a batch smaller than the micro-batch count
        (
            [
                "distribution=gpipe",
                "hardware=local_2cpu",
                "distribution.batch_size=4",
                "distribution.micro_batches=8",
            ],
            "distribution.micro_batches=8 is invalid: must divide",
        ),
        (["distribution=gpipe", "hardware=local_cpu"], "GPipe needs 2 or more workers"),
        # another model's setting: GPipe runs one stage per worker, it has no `stages`
        (
            ["distribution=gpipe", "hardware=local_2cpu", "+distribution.stages=1-1"],
            "distribution.stages: unknown key; allowed: name, batch_size, backend, balance, "
            "micro_batches, recompute",
        ),
        # fewer samples than one batch per worker
        (
            [
                "distribution=ddp",
                "hardware=local_2cpu",
                "dataset.num_samples=16",
                "distribution.batch_size=16",
            ],
            "batch size 16 x 2 workers = 32",
        ),
        # NCCL on CPU workers
        (
            ["distribution=ddp", "distribution.backend=nccl"],
            "NCCL needs hardware.device=cuda; allowed on CPU: gloo, or null",
        ),
    ],
)
def test_impossible_combinations_are_rejected(overrides: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate(compose_config(overrides))
    assert fragment in str(error.value)


def test_a_valid_pipeline_still_validates() -> None:
    config = validate(
        compose_config(
            [
                "distribution=gpipe",
                "hardware=local_2cpu",
                "network=resnet18",
                "distribution.balance=[10,5]",
                "distribution.batch_size=32",
                "distribution.micro_batches=4",
            ]
        )
    )
    assert config.distribution.balance == [10, 5]


# --- The bad-input table -------------------------------------------------------------------
# Every row is one kind of bad input to one command's real entry point: it must exit with
# status 2, say so in ONE line on stderr naming what `says` quotes, print no traceback, and
# write nothing (the listing of the test's directory is compared before and after).
# `{work}` is the directory the command runs in, `{file}` a regular file in it; `env`
# changes the environment for the one case (e.g. a PATH without SLURM's sbatch).


@dataclass(frozen=True)
class Bad:
    command: str  # run as `python -m <command>`
    args: tuple[str, ...]
    says: str  # a fragment of the one line
    env: tuple[tuple[str, str], ...] = ()


def _bad(command: str, args: str, says: str, **env: str) -> Bad:
    return Bad(command, tuple(args.split()), says, tuple(env.items()))


# The cases the tests above name, added to the table (one subprocess for them all: a fresh
# interpreter per case costs several seconds of imports on 2 CPU cores).
UNKNOWN_NETWORK = {
    module: Bad(
        module, ("network=resnet19",), f"network=resnet19: unknown; choose one of {NETWORKS}"
    )
    for module in COMMANDS
}
IMPOSSIBLE_PIPELINE = {
    module: Bad(
        module,
        (
            "distribution=gpipe",
            "hardware=local_2cpu",
            "distribution.batch_size=8",
            "distribution.micro_batches=4",
            "distribution.balance=[1,1]",
            "run.output_dir={work}/outputs",
        ),
        "distribution.balance=[1, 1] is invalid",
    )
    for module in ("harness", "harness.plan")
}
SWEEP_WITH_UNKNOWN_OPTION = Bad(
    "harness",
    (
        "-m",
        "network=mobilenetv2,resnet19",
        "dataset.num_samples=128",
        "run.epochs=1",
        "run.output_dir={work}/outputs",
    ),
    "network=resnet19: unknown; choose one of",
)
GPU_SWEEP = Bad(
    "harness",
    ("+sweep=imagenet_resnet",),
    "hardware.device='cuda' is invalid: torch sees no CUDA device",
)
WRONG_FLAG_VALUE = Bad(
    "harness.analysis", ("--probe-batches=abc",), "--probe-batches: invalid int value: 'abc'"
)
MISSPELLED_APPENDED_KEY = Bad(
    "harness",
    ("+dataset.num_sample=16", "run.output_dir={work}/outputs"),
    "dataset.num_sample: unknown key; allowed: name, source",
)
# submitit would write `teardown` into the job script as shell lines after srun (the marker
# file is what those lines would leave in the directory the table lists).
TEARDOWN = Bad(
    "harness",
    (
        "-m",
        "hydra/launcher=submitit_slurm",
        "hardware=slurm_local_2nodes",
        "distribution=ddp",
        "+hydra.launcher.teardown=['touch {work}/pwned']",
        "run.output_dir={work}/outputs",
    ),
    "hydra.launcher.teardown=",
)
MALFORMED_OVERRIDE = Bad(
    "harness.describe", ("run.epochs=[1",), "run.epochs=[1: malformed override"
)


# PATH with this Python but no SLURM: "where SLURM is not installed".
NO_SLURM_PATH = str(Path(sys.executable).parent)
SWEEP = "-m dataset.num_samples=16 distribution.batch_size=8 run.epochs=1"

BAD_INPUTS: list[Bad] = [
    # python -m harness: unknown names
    _bad("harness", "network=resnet19", "network=resnet19: unknown; choose one of"),
    _bad("harness", "dataset=svhn", "dataset=svhn: unknown; choose one of"),
    _bad("harness", "distribution=zero", "distribution=zero: unknown; choose one of"),
    _bad("harness", "hardware=dgx", "hardware=dgx: unknown; choose one of"),
    _bad("harness", "hydra/launcher=nope", "hydra/launcher=nope: unknown; choose one of"),
    _bad("harness", "+dataset.num_sample=16", "dataset.num_sample: unknown key"),
    _bad("harness", "dataset.num_sample=16", "num_sample"),
    _bad("harness", "run.epoch=2", "epoch"),
    _bad("harness", "--bogus-flag", "unrecognized arguments: --bogus-flag"),
    _bad("harness", "run.epochs=[1", "run.epochs=[1: malformed override"),
    # types
    _bad("harness", "run.epochs=abc", "run.epochs"),
    _bad("harness", "run.epochs=1.5", "run.epochs"),
    _bad("harness", "tracking.enabled=maybe", "tracking.enabled"),
    _bad("harness", "hardware.device=tpu", "hardware.device"),
    _bad("harness", "dataset.source=web", "dataset.source"),
    _bad("harness", "distribution.recompute=sometimes", "distribution.recompute"),
    _bad("harness", "distribution.batch_division=round", "distribution.batch_division"),
    _bad("harness", "optimizer.name=adam", "optimizer.name"),
    _bad("harness", "hydra.launcher.timeout_min=abc", "timeout_min"),
    # ranges
    _bad("harness", "run.epochs=0", "run.epochs=0 is invalid"),
    _bad("harness", "run.epochs=-1", "run.epochs=-1 is invalid"),
    _bad("harness", "run.warmup_batches=-1", "run.warmup_batches=-1 is invalid"),
    _bad("harness", "run.repeats=0", "run.repeats=0 is invalid"),
    _bad(
        "harness",
        "run.target_accuracy=1.5",
        "run.target_accuracy=1.5 is invalid: allowed: a fraction in (0, 1]",
    ),
    _bad(
        "harness",
        "run.target_accuracy=0.9 run.eval=false",
        "run.eval=False is invalid: run.target_accuracy needs run.eval=true",
    ),
    _bad("harness", "dataset.eval_samples=0", "dataset.eval_samples=0 is invalid"),
    _bad("harness", "run.seed=-1", "run.seed=-1 is invalid: allowed: 0 to"),
    _bad("harness", "run.seed=99999999999999999999", "run.seed=99999999999999999999 is invalid"),
    _bad(
        "harness",
        "run.seed=18446744073709551615 run.repeats=2",
        "run.seed=18446744073709551615 is invalid: allowed: 0 to 18446744073709551614",
    ),
    _bad("harness", "run.progress_timeout_s=0", "run.progress_timeout_s=0"),
    _bad("harness", "run.progress_timeout_s=-5", "run.progress_timeout_s=-5"),
    _bad("harness", "run.progress_timeout_s=nan", "run.progress_timeout_s=nan is invalid"),
    _bad("harness", "run.progress_timeout_s=inf", "run.progress_timeout_s=inf is invalid"),
    _bad("harness", "run.progress_timeout_s=1e308", "run.progress_timeout_s=1e+308 is invalid"),
    _bad("harness", "tracking.experiment=", "tracking.experiment='' is invalid"),
    Bad("harness", ("tracking.experiment='   '",), "allowed: a non-empty MLflow experiment name"),
    _bad("harness", "distribution.batch_size=0", "distribution.batch_size=0 is invalid"),
    _bad("harness", "distribution.backend=mpi", "distribution.backend='mpi' is invalid"),
    _bad(
        "harness", "distribution=ddp distribution.bucket_cap_mb=0", "distribution.bucket_cap_mb=0"
    ),
    _bad(
        "harness",
        "distribution=horovod distribution.fusion_threshold_mb=-1",
        "distribution.fusion_threshold_mb=-1.0 is invalid",
    ),
    _bad(
        "harness",
        "distribution=horovod distribution.cycle_time_ms=0",
        "distribution.cycle_time_ms=0",
    ),
    _bad(
        "harness",
        "distribution=gpipe hardware=local_2cpu distribution.balance=[0,15]",
        "distribution.balance=[0, 15] is invalid",
    ),
    _bad("harness", "distribution=pipedream distribution.stages=a-b", "distribution.stages='a-b'"),
    # another model's setting (each model's settings are the schema of its config file)
    _bad(
        "harness",
        "distribution=ddp distribution.micro_batches=8",
        "distribution.micro_batches: unknown key; allowed: name, batch_size, backend, "
        "activation_checkpointing, checkpoint_every, precision, bucket_cap_mb; micro_batches "
        "is a setting of distribution=gpipe, not ddp: in a sweep "
        "over models use +per_model.gpipe.micro_batches=8",
    ),
    # the sweep over models with one model's setting, then the per-model form's errors
    _bad(
        "harness",
        "-m distribution=sequential,ddp,gpipe distribution.batch_size=32 "
        "distribution.micro_batches=4",
        "not sequential: in a sweep over models use +per_model.gpipe.micro_batches=4",
    ),
    _bad(
        "harness",
        f"{SWEEP} distribution=sequential,gpipe hardware=local_2cpu "
        "+per_model.gpip.micro_batches=4",
        "per_model.gpip: unknown distribution model; allowed: ddp, fsdp, gpipe, horovod, "
        "mesh, pipedream, sequential",
    ),
    _bad(
        "harness",
        "+per_model.gpipe.bogus=1",
        "per_model.gpipe.bogus: unknown key; allowed: "
        "batch_size, backend, balance, micro_batches, "
        "recompute",
    ),
    _bad(
        "harness",
        "+per_model.gpipe.micro_batches=abc",
        "per_model.gpipe.micro_batches=abc is invalid: Value 'abc' of type 'str'",
    ),
    _bad(
        "harness", "+per_model.pipedream.stages=a-b", "per_model.pipedream.stages='a-b' is invalid"
    ),
    # a model's internal schema is no option of the group
    _bad(
        "harness",
        "distribution=ddp_schema",
        "distribution=ddp_schema: unknown; choose one of "
        "ddp, fsdp, gpipe, horovod, mesh, pipedream, pipedream_straight, sequential",
    ),
    _bad("harness", "hardware.nodes=0", "hardware.nodes=0 is invalid"),
    _bad("harness", "hardware.workers_per_node=0", "hardware.workers_per_node=0 is invalid"),
    _bad("harness", "hardware.cpu_threads=0", "hardware.cpu_threads=0 is invalid"),
    _bad("harness", "hardware.device_memory_gb=-1", "hardware.device_memory_gb=-1"),
    _bad("harness", "dataset.num_samples=0", "dataset.num_samples=0 is invalid"),
    _bad("harness", "dataset.num_workers=-1", "dataset.num_workers=-1 is invalid"),
    _bad("harness", "optimizer.lr=0", "optimizer.lr=0"),
    _bad("harness", "optimizer.momentum=1", "optimizer.momentum=1"),
    _bad("harness", "optimizer.weight_decay=-1", "optimizer.weight_decay=-1"),
    # what the fields declare (harness.config.accepts): finite numbers within physical bounds, names
    # that cannot leave their root, paths the file system can hold
    _bad(
        "harness",
        "optimizer.weight_decay=inf",
        "optimizer.weight_decay=inf is invalid: allowed: a finite number in [0, 1,000]",
    ),
    _bad("harness", "optimizer.lr=inf", "optimizer.lr=inf is invalid"),
    _bad("harness", "optimizer.lr=nan", "optimizer.lr=nan is invalid"),
    _bad("harness", "hardware.device_memory_gb=inf", "hardware.device_memory_gb=inf is invalid"),
    _bad(
        "harness",
        "hardware.device_memory_gb=1e15",
        "hardware.device_memory_gb=1000000000000000.0 is invalid: allowed: a finite number in "
        "(0, 100,000] GB",
    ),
    _bad(
        "harness",
        "hardware.cpu_threads=1099511627776",
        "hardware.cpu_threads=1099511627776 is invalid: allowed: a whole number in "
        "[1, 65,536] threads",
    ),
    _bad(
        "harness.plan",
        "distribution=gpipe hardware=local_2cpu hardware.cpu_threads=1099511627776",
        "hardware.cpu_threads=1099511627776 is invalid",
    ),
    _bad(
        "harness",
        "distribution=ddp distribution.bucket_cap_mb=inf",
        "distribution.bucket_cap_mb=inf is invalid",
    ),
    _bad(
        "harness",
        "distribution=horovod distribution.fusion_threshold_mb=inf",
        "distribution.fusion_threshold_mb=inf is invalid",
    ),
    _bad(
        "harness", "+per_model.ddp.bucket_cap_mb=inf", "per_model.ddp.bucket_cap_mb=inf is invalid"
    ),
    _bad(
        "harness.probe",
        "hardware=local_2cpu probe.message_bytes=[8,1099511627776000]",
        "probe.message_bytes=[8, 1099511627776000] is invalid",
    ),
    _bad(
        "harness",
        "tracking.experiment=../../escaped",
        "tracking.experiment='../../escaped' "
        "is invalid: allowed: a name that becomes a file or directory name",
    ),
    _bad("harness", f"tracking.experiment={'x' * 300}", "tracking.experiment='xxx"),
    _bad("harness", f"tracking.experiment={'x' * 10_000}", "(10000 characters) is invalid"),
    _bad("harness", "run.output_dir=", "run.output_dir='' is invalid: allowed: a path to create"),
    _bad("harness", f"run.output_dir={{work}}/{'d' * 300}", "run.output_dir='"),
    _bad("harness", f"run.output_dir={{work}}/{'d/' * 2100}", "at most 4096 bytes"),
    _bad("harness.recommend", f"hardware.name={'h' * 300}", "hardware.name='hhh"),
    _bad(
        "harness", "hydra.run.dir=/proc/x", "hydra.run.dir='/proc/x' is invalid: cannot write there"
    ),
    _bad("harness", f"hydra.run.dir={{work}}/{'d' * 300}", "each part at most 255 bytes"),
    _bad("harness", f"{SWEEP} hydra.sweep.dir=/proc/x", "hydra.sweep.dir='/proc/x' is invalid"),
    _bad("harness", "probe.repeats=0", "probe.repeats=0 is invalid"),
    _bad("harness", "probe.message_bytes=[8]", "probe.message_bytes=[8] is invalid"),
    _bad("harness", "hydra.launcher.timeout_min=0", "hydra.launcher.timeout_min=0 is invalid"),
    _bad("harness", "hydra.launcher.timeout_min=-1", "hydra.launcher.timeout_min=-1 is invalid"),
    _bad(
        "harness",
        "distribution=ddp hardware=local_2cpu hydra.launcher.grace_after_result_s=-1",
        "hydra.launcher.grace_after_result_s=-1.0 is invalid",
    ),
    _bad(
        "harness",
        f"{SWEEP} hydra.launcher.grace_after_result_s=nan",
        "hydra.launcher.grace_after_result_s=nan is invalid",
    ),
    _bad(
        "harness",
        f"{SWEEP} hydra.launcher.remeasure_sample=-1",
        "hydra.launcher.remeasure_sample=-1 is invalid: finished cells chosen at random",
    ),
    _bad(
        "harness",
        f"{SWEEP} hydra.launcher.passes=0",
        "hydra.launcher.passes=0 is invalid: runs of every cell, one pass over the sweep after "
        "another; allowed: 1 to 100",
    ),
    _bad("harness", f"{SWEEP} hydra.launcher.passes=101", "hydra.launcher.passes=101 is invalid"),
    # combinations
    _bad(
        "harness",
        "distribution.batch_size=100000000 dataset.num_samples=null",
        "distribution.batch_size=100000000 is invalid",
    ),
    _bad(
        "harness",
        "distribution.batch_size=64 dataset.num_samples=32",
        "dataset.num_samples=32 is invalid",
    ),
    _bad(
        "harness",
        "distribution=ddp hardware=local_2cpu distribution.batch_size=16 dataset.num_samples=16",
        "batch size 16 x 2 workers = 32",
    ),
    # a refused size names the value that works
    _bad(
        "harness",
        "distribution=ddp hardware=local_2cpu dataset.num_samples=128 run.epochs=1",
        "(batch size 128 x 2 workers = 256); allowed: dataset.num_samples=256 or more, or the "
        "largest distribution.batch_size that works: 64",
    ),
    _bad(
        "harness",
        "distribution=gpipe hardware=local_2cpu distribution.batch_size=32 "
        "distribution.micro_batches=5",
        "distribution.micro_batches=5 is invalid: must divide the GPipe batch "
        "(distribution.batch_size=32) into equal micro-batches of 1 sample or more; allowed: "
        "divisors of 32: 1, 2, 4, 8, 16, 32, or null (the largest divisor up to 24)",
    ),
    _bad(
        "harness",
        "distribution=pipedream hardware=local_4cpu distribution.stages=4 "
        "distribution.batch_size=64 dataset.num_samples=200",
        "allowed: dataset.num_samples=256 or more, or the largest distribution.batch_size that "
        "works: 50",
    ),
    _bad("harness", "distribution=ddp distribution.backend=nccl", "NCCL needs hardware.device"),
    _bad(
        "harness",
        "distribution=gpipe hardware=h100_1gpu hardware.workers_per_node=2 "
        "distribution.backend=gloo",
        "distribution.backend='gloo' is invalid: gloo cannot send CUDA tensors between "
        "pipeline stages",
    ),
    _bad("harness", "distribution=gpipe hardware=local_cpu", "GPipe needs 2 or more workers"),
    _bad(
        "harness",
        "distribution=gpipe hardware=local_2cpu distribution.batch_size=4 "
        "distribution.micro_batches=8",
        "distribution.micro_batches=8 is invalid",
    ),
    _bad(
        "harness",
        "distribution=gpipe hardware=local_2cpu distribution.batch_size=8 "
        "distribution.micro_batches=4 distribution.balance=[1,1]",
        "sum to the 15 layers of network=resnet18",
    ),
    _bad(
        "harness",
        "distribution=pipedream hardware=local_4cpu distribution.stages=2-1",
        "the replica counts must sum to the 4 workers",
    ),
    _bad(
        "harness",
        "distribution=ddp hardware.nodes=2 hardware.workers_per_node=1",
        "hardware.nodes=2 is invalid here: this launcher runs on one machine",
    ),
    _bad(
        "harness",
        "dataset=highres dataset.source=real dataset.root={work}",
        "exists only as synthetic data",
    ),
    # this machine and its paths
    _bad(
        "harness", "hardware.device=cuda", "hardware.device='cuda' is invalid: torch sees no CUDA"
    ),
    _bad("harness", "dataset.source=real", "dataset.root=None is invalid"),
    _bad(
        "harness",
        "dataset.source=real dataset.root={work}/missing",
        "dataset.root='{work}/missing' is invalid: no such directory",
    ),
    _bad("harness", "dataset.cache_dir=/proc/x", "dataset.cache_dir='/proc/x' is invalid"),
    _bad(
        "harness", "dataset.cache_dir={file}", "dataset.cache_dir='{file}' is invalid: it is a file"
    ),
    _bad("harness", "run.output_dir=/proc/x", "run.output_dir='/proc/x' is invalid"),
    _bad("harness", "run.output_dir={file}", "run.output_dir='{file}' is invalid: it is a file"),
    _bad("harness", "run.output_dir={file}/sub", "is invalid: it is under the file"),
    _bad(
        "harness",
        "run.output_dir=/sys/kernel",  # read-only, even for root
        "run.output_dir='/sys/kernel' is invalid: cannot write there",
    ),
    # sweeps (-m): every cell checked before the first starts
    _bad("harness", f"{SWEEP} network=mobilenetv2,resnet19", "network=resnet19: unknown"),
    _bad(
        "harness",
        f"{SWEEP} run.warmup_batches=1,-1",
        "in sweep cell dataset.num_samples=16 "
        "distribution.batch_size=8 run.epochs=1 run.warmup_batches=-1: run.warmup_batches=-1",
    ),
    _bad("harness", f"{SWEEP} run.seed=0,99999999999999999999", "run.seed=99999999999999999999"),
    _bad("harness", f"{SWEEP} hardware.device=cpu,cuda", "hardware.device='cuda' is invalid"),
    _bad("harness", "+sweep=imagenet_resnet", "hardware.device='cuda' is invalid: torch sees no"),
    _bad("harness", "+sweep=nosuch", "sweep=nosuch: unknown; choose one of"),
    _bad(
        "harness",
        f"{SWEEP} hydra/launcher=submitit_slurm",
        "hydra/launcher=submitit_slurm is invalid here: SLURM is not installed",
        PATH=NO_SLURM_PATH,
    ),
    _bad("harness", f"{SWEEP} hydra.launcher.timeout_min=0", "hydra.launcher.timeout_min=0"),
    _bad("harness", f"{SWEEP} hydra.launcher.timeout_min=-1", "hydra.launcher.timeout_min=-1"),
    _bad("harness", f"{SWEEP} run.output_dir={{file}}", "run.output_dir='{file}' is invalid"),
    _bad("harness", f"{SWEEP} tracking.experiment=", "tracking.experiment='' is invalid"),
    _bad(
        "harness",
        f"{SWEEP} dataset.source=synthetic,real dataset.root={{work}}/missing",
        "dataset.root='{work}/missing' is invalid",
    ),
    _bad(
        "harness",
        f"{SWEEP} distribution=ddp hardware=local_2cpu dataset.num_samples=64 hardware.nodes=1,2",
        "hardware.nodes=2 is invalid here",
    ),
    _bad(
        "harness",
        "-m distribution.batch_size=8,100000000 dataset.num_samples=null",
        "distribution.batch_size=100000000 is invalid",
    ),
    _bad(
        "harness",
        f"{SWEEP} hydra/launcher=submitit_slurm distribution=ddp "
        "hardware=local_2cpu hydra.launcher.nodes=3",
        "hydra.launcher.nodes=3",
    ),
    _bad("harness", f"{SWEEP} run.progress_timeout_s=10,inf", "run.progress_timeout_s=inf"),
    # harness.describe
    _bad("harness.describe", "dataset=svhn", "dataset=svhn: unknown"),
    _bad("harness.describe", "distribution.batch_size=0", "distribution.batch_size=0 is invalid"),
    _bad("harness.describe", "+network.depth=3", "network.depth: unknown key"),
    _bad("harness.describe", "run.seed=-1", "run.seed=-1 is invalid"),
    _bad("harness.describe", "network=[a", "network=[a: malformed override"),
    # harness.plan
    _bad("harness.plan", "distribution=ddp", "distribution=ddp is invalid for harness.plan"),
    _bad("harness.plan", "distribution=gpipe hardware=local_cpu", "GPipe needs 2 or more"),
    _bad(
        "harness.plan",
        "distribution=pipedream hardware=local_2cpu distribution.stages=1-1-1",
        "the replica counts must sum to the 2 workers",
    ),
    _bad(
        "harness.plan",
        "distribution=gpipe hardware=local_2cpu distribution.recompute=x",
        "distribution.recompute",
    ),
    # harness.probe
    _bad("harness.probe", "hardware=local_cpu", "hardware=local_cpu is invalid for the probe"),
    _bad(
        "harness.probe",
        "hardware=local_2cpu probe.message_bytes=[8]",
        "probe.message_bytes=[8] is invalid",
    ),
    _bad("harness.probe", "hardware=local_2cpu probe.warmup=-1", "probe.warmup=-1 is invalid"),
    _bad(
        "harness.probe",
        "hardware=local_2cpu run.output_dir={file}",
        "run.output_dir='{file}' is invalid",
    ),
    _bad(
        "harness.probe",
        "hardware=local_2cpu hardware.device=cuda",
        "hardware.device='cuda' is invalid: torch sees no CUDA",
    ),
    _bad(
        "harness.probe",
        "hardware=local_2cpu hydra/launcher=submitit_slurm",
        "SLURM is not installed",
        PATH=NO_SLURM_PATH,
    ),
    # harness.analysis
    _bad("harness.analysis", "--probe-batches=abc", "--probe-batches: invalid int value: 'abc'"),
    _bad("harness.analysis", "--probe-batches=0", "--probe-batches=0 is invalid"),
    _bad("harness.analysis", "--probe-batches", "--probe-batches: expected one argument"),
    _bad("harness.analysis", "tracking.experiment=nosuch", "no MLflow store at"),
    _bad("harness.analysis", "run.output_dir={file}", "run.output_dir='{file}' is invalid"),
    _bad("harness.analysis", "network=resnet19", "network=resnet19: unknown"),
    # a tracking URI no MLflow store accepts: refused before work by every command (a cell
    # trained with it would keep its result pending for ever)
    *(
        _bad(module, "tracking.uri=bogus://nowhere", "no MLflow store has the scheme 'bogus'")
        for module in COMMANDS
    ),
    _bad(
        "harness",
        f"{SWEEP} tracking.uri=bogus://nowhere",
        "tracking.uri='bogus://nowhere' is invalid",
    ),
    # harness.recommend
    _bad("harness.recommend", "--fit={work}/missing.json", "--fit={work}/missing.json is invalid"),
    _bad("harness.recommend", "--fit={file}", "--fit={file} is invalid: not a fit.json"),
    # fit.json's numbers checked by value, naming the field; any depth read without a crash
    _bad(
        "harness.recommend",
        "hardware=local_2cpu --fit={work}/fit_not_finite.json",
        "hardware.local_2cpu.params.contention is nan, allowed 0 to 1e+06",
    ),
    _bad(
        "harness.recommend",
        "hardware=local_2cpu --fit={work}/fit_cells.json",
        "hardware.local_2cpu.cells is 1000000000000000000000000000000, allowed 0 to 1e+09",
    ),
    _bad(
        "harness.recommend",
        "--fit={work}/fit_nested.json",
        "is invalid: not a fit.json of harness.analysis (nested deeper than any it writes)",
    ),
    # a candidate invalid for the settings asked (GPipe's Table 3.3 batch of 3072 in an epoch
    # of 512): refused before anything is probed or a facts file written
    _bad(
        "harness.recommend",
        "network=mobilenetv2 hardware=local_2cpu dataset.num_samples=512",
        "dataset.num_samples=512 is invalid: an epoch needs at least one full pipeline batch",
    ),
    _bad("harness.recommend", "--probe-batches=x", "--probe-batches: invalid int value"),
    _bad("harness.recommend", "--probe-spread=1", "--probe-spread=1.0 is invalid: allowed 0"),
    _bad("harness.recommend", "--probe-spread=nan", "--probe-spread=nan is invalid"),
    _bad("harness.analysis", "--probe-spread=-0.1", "--probe-spread=-0.1 is invalid"),
    _bad("harness.recommend", "--json=1", "--json: ignored explicit argument"),
    _bad("harness.recommend", "run.output_dir={file}", "run.output_dir='{file}' is invalid"),
    _bad("harness.recommend", "distribution.batch_size=-8", "distribution.batch_size=-8"),
    _bad("harness.recommend", "dataset=svhn", "dataset=svhn: unknown"),
    # harness.recommend --plans / --predict: priced from data sheets, nothing measured
    _bad("harness.recommend", "--plans --predict", "--plans is invalid with --predict"),
    _bad("harness.recommend", "--predict --fit=x.json", "--fit is invalid with --predict"),
    _bad(
        "harness.recommend",
        "--plans --remeasure network=gpt2_small hardware=h100_node",
        "--remeasure is invalid with --plans",
    ),
    _bad("harness.recommend", "--plans --top=0", "--top: '0' is not a count"),
    _bad(
        "harness.recommend",
        "--plans network=gpt2_small hardware=local_2cpu",
        "hardware=local_2cpu is invalid for planning: it lacks hardware.accelerator",
    ),
    _bad(
        "harness.recommend",
        "--plans network=bert_large hardware=h100_node",
        "network=bert_large is invalid for planning",
    ),
    _bad(
        "harness.recommend",
        "--predict network=gpt2_small hardware=h100_node distribution=ddp",
        "distribution=ddp is invalid with --predict",
    ),
    _bad(
        "harness.recommend",
        "--predict network=gpt2_small hardware=h100_node distribution=mesh distribution.tp=2 "
        "distribution.dp_shard=2",
        "distribution.dp_shard=2 is invalid: dp_replicate x dp_shard x tp x pp = 1 x 2 x 2 x 1 "
        "= 4 must be the cell's 8 workers",
    ),
    _bad(
        "harness.recommend",
        "--predict network=gpt2_small hardware=h100_node distribution=mesh run.global_batch=12",
        "run.global_batch=12 is invalid: must divide among the plan's 8 data-parallel",
    ),
    _bad(
        "harness.recommend",
        "--plans network=gpt2_small hardware=h100_node hardware.accelerator.bf16_tflops=0",
        "hardware.accelerator.bf16_tflops=0",
    ),
    # harness.sync
    _bad("harness.sync", "network=resnet19", "network=resnet19: unknown"),
    _bad("harness.sync", "tracking.experiment=", "tracking.experiment='' is invalid"),
    _bad("harness.sync", "run.output_dir=[x", "run.output_dir=[x: malformed override"),
    _bad(
        "harness.sync", "run.output_dir={file}", "run.output_dir='{file}' is invalid: it is a file"
    ),
    _bad(
        "harness.sync",
        "run.output_dir={work}/missing",  # printed "synced", exit 0
        "run.output_dir='{work}/missing' is invalid: no such directory",
    ),
    # harness.compliance: a directory it cannot write, a path longer than a name may be
    _bad("harness.compliance", "--write-rules /proc/x", "--write-rules='/proc/x' is invalid"),
    _bad(
        "harness.compliance",
        "--write-rules {file}",
        "--write-rules='{file}' is invalid: it is a file",
    ),
    _bad("harness.compliance", "{work}/" + "a" * 330, "is invalid: File name too long"),
    # networks from elsewhere, token data, and a network that does not take the dataset
    _bad(
        "harness",
        "network=module network.target=nopkg.models:build",
        "network.target=nopkg.models:build: module nopkg.models does not import",
    ),
    _bad(
        "harness",
        "network=module network.target=torch.nn:Linear",  # the factory raises
        "network.target=torch.nn:Linear",
    ),
    _bad("harness", "network=module network.target=builtins:dict", "network.target=builtins:dict"),
    # a user's code run in its place while checked (workloads.networks.user_code): an exit is
    # a refusal, its output kept aside, the standard library never called
    *(
        _bad(
            module,
            "network=module network.target=tests.faults.user_modules:exits",
            "calling it called sys.exit(0) while distbench checked it",
        )
        for module in ("harness", "harness.describe")
    ),
    _bad(
        "harness",
        "network=module network.target=tests.faults.user_modules:floods_then_fails",
        "calling it raised ValueError: no model today",
    ),
    _bad(
        "harness",
        "network=module network.target=os:makedirs +network.kwargs.name={work}/made",
        "os is Python's standard library, which builds no network",
    ),
    _bad(
        "harness",
        "network=module network.target=torch.nn:Identity",
        "to (2, 1, 28, 28), expected logits of shape (2, 10)",
    ),
    _bad(
        "harness",
        "network=module network.target=torch.nn:Linear "
        "+network.kwargs.in_features=7 +network.kwargs.out_features=10",
        "its forward fails on dataset=mnist's input of shape (2, 1, 28, 28)",
    ),
    _bad("harness", "network=torchvision network.arch=nosuchnet", "network.arch"),
    _bad("harness", "network=timm network.arch=nosuchnet", "network.arch"),
    _bad("harness", "network=hf network.arch=nosuchmodel dataset=tokens", "network.arch"),
    _bad(
        "harness",
        "network=hf network.arch=gpt2 +network.config.n_layers=2 dataset=tokens",
        "network.config.n_layers",
    ),
    # a transformers config's values checked as distbench's own settings are
    *(
        _bad("harness", f"network=gpt2_tiny dataset=tokens {override}", says)
        for override, says in (
            ("network.config.n_embd=-8", "network.config.n_embd=-8 is invalid: a size"),
            ("network.config.n_embd=0", "network.config.n_embd=0 is invalid: a size"),
            ("+network.config.n_inner=-5", "network.config.n_inner=-5 is invalid: a size"),
            (
                "+network.config.layer_norm_epsilon=nan",
                "network.config.layer_norm_epsilon=nan is invalid: allowed: a finite number",
            ),
            (
                "+network.config.activation_function=nosuch",
                "not an activation of transformers",
            ),
        )
    ),
    _bad(
        "harness",
        "network=resnet18 network.arch=gpt2",
        "network.arch='gpt2' is invalid: is a setting of network.source=",
    ),
    # a network whose weights, gradients and optimizer state alone cannot fit a worker: GPT-2
    # with a billion-token vocabulary asked a CPU worker for 3 TB and ended `oom` with a
    # traceback; refused before any cell by every command that runs or describes one
    *(
        _bad(
            command,
            f"{flag}dataset=tokens network=gpt2_tiny +network.config.vocab_size=1000000000 "
            "run.output_dir={work}/outputs",
            "network.config.vocab_size=1000000000) cannot fit in memory: its 256.0 B "
            "parameters need 3,072.0 GB per worker",
        )
        for command, flag in (
            ("harness", ""),
            ("harness", "-m "),
            ("harness", "--dry-run "),
            ("harness.describe", ""),
        )
    ),
    _bad(
        "harness.describe",
        "dataset=tokens network=llama3_8b hardware=h100_1gpu",
        "its 8.0 B parameters need 96.4 GB per worker for their float32 weights, gradients and "
        "SGD's momentum alone (distribution=sequential: each worker holds them whole), more "
        "than hardware.device_memory_gb=80",
    ),
    # what the libraries say while a network is checked (torchvision's FutureWarning for
    # Inception's initialisation, transformers' logger for a BERT built as a decoder) is kept
    # out of the one line
    _bad(
        "harness",
        "network=torchvision network.arch=inception_v3 dataset=mnist",
        "network inception_v3: its forward fails on dataset=mnist's input",
    ),
    _bad(
        "harness",
        "dataset=tokens network=hf network.arch=bert +network.config.num_hidden_layers=2 "
        "+network.config.hidden_size=64 +network.config.num_attention_heads=2 "
        "+network.config.intermediate_size=128 +network.config.is_decoder=true "
        "distribution=gpipe hardware=local_2cpu distribution.balance=[1,1]",
        "the layer counts must sum to the 4 layers of network=bert",
    ),
    _bad("harness", "dataset=tokens network=resnet18", "an image network; dataset=tokens holds"),
    _bad(
        "harness",
        "dataset=mnist network=gpt2_tiny",
        "is a language model and dataset=mnist holds images",
    ),
    _bad(
        "harness",
        "dataset=tokens network=gpt2_small dataset.seq_len=2048",
        "dataset.seq_len=2048 is beyond network gpt2_small's 1024 positions",
    ),
    _bad(
        "harness",
        "dataset=tokens network=llama_tiny dataset.seq_len=0",
        "dataset.seq_len=0 is invalid",
    ),
    _bad(
        "harness",
        "dataset=mnist dataset.seq_len=64",
        "dataset.seq_len=64 is invalid: is a setting of token datasets",
    ),
    _bad(
        "harness",
        "dataset=text network=llama_tiny dataset.root={work} dataset.vocab_size=100",
        "dataset.vocab_size=100 is invalid",
    ),
    _bad(
        "harness",
        "dataset=text network=llama_tiny dataset.root={work} run.output_dir={work}/outputs",
        "holds no .txt file",
    ),
    _bad(
        "harness",
        "dataset=tokens dataset.source=real dataset.root={work}",
        "dataset tokens exists only as synthetic data",
    ),
    _bad(
        "harness",
        "dataset=text network=llama_tiny dataset.source=synthetic",
        "dataset text is read from local files",
    ),
    _bad(
        "harness",
        "network=torchvision network.arch=resnet18 network.blocks=no.such.path "
        "distribution=gpipe hardware=local_2cpu",
        "network.blocks",
    ),
    _bad("harness.recommend", "dataset=tokens network=resnet18", "an image network"),
    _bad("harness.describe", "network=module network.target=nopkg:build", "network.target"),
    _bad(
        "harness.plan",
        "network=module network.target=torch.nn:Identity distribution=gpipe hardware=local_2cpu",
        "expected logits of shape",
    ),
    # plans (distribution=mesh): degrees, tensor parallelism, schedules, the global batch
    _bad(
        "harness",
        "distribution=mesh hardware=local_4cpu network=llama_tiny dataset=tokens "
        "distribution.tp=2 distribution.dp_shard=3",
        "dp_replicate x dp_shard x tp x pp = 1 x 3 x 2 x 1 = 6 must be the cell's 4 workers",
    ),
    _bad(
        "harness",
        "distribution=mesh hardware=local_4cpu network=llama_tiny dataset=tokens distribution.pp=3",
        "dp_replicate x tp x pp = 1 x 1 x 3 must divide the cell's 4 workers",
    ),
    _bad(
        "harness",
        "distribution=mesh hardware=local_2cpu network=resnet18 distribution.tp=2",
        "network resnet18 (network.source=builtin) gives no tensor-parallel plan",
    ),
    _bad(
        "harness",
        "distribution=mesh hardware=local_4cpu network=llama_tiny dataset=tokens distribution.tp=4",
        "num_key_value_heads=2 does not divide among 4 tensor-parallel workers",
    ),
    _bad(
        "harness",
        "distribution=mesh hardware=emulated_2nodes_1gbit hardware.workers_per_node=2 "
        "network=llama_tiny dataset=tokens distribution.tp=4",
        "tensor parallelism of 4 workers spans nodes of 2 workers",
    ),
    _bad(
        "harness",
        "distribution=mesh hardware=local_4cpu network=llama_tiny dataset=tokens "
        "distribution.pp=4 distribution.schedule=interleaved_1f1b",
        "pp x stages_per_rank = 4 x 2 = 8 stages for network=llama_tiny, which has 6 layers",
    ),
    _bad(
        "harness",
        "distribution=mesh hardware=local_4cpu network=llama_tiny dataset=tokens "
        "run.global_batch=6",
        "run.global_batch=6 is invalid: must divide among the plan's 4 data-parallel positions",
    ),
    _bad(
        "harness",
        "distribution=mesh hardware=local_2cpu network=llama_tiny dataset=tokens "
        "run.global_batch=8 distribution.micro_batch_size=3",
        "distribution.micro_batch_size=3 is invalid: must divide each data-parallel position",
    ),
    _bad(
        "harness",
        "distribution=mesh hardware=local_2cpu network=llama_tiny dataset=tokens "
        "distribution.pp=2 distribution.schedule=zbv distribution.stages_per_rank=3",
        "schedule=zbv runs exactly 2 stage(s) per worker",
    ),
    _bad(
        "harness",
        "distribution=mesh distribution.schedule=2f2b",
        "distribution.schedule='2f2b' is invalid: allowed: gpipe, 1f1b",
    ),
    _bad(
        "harness",
        "distribution=ddp hardware=local_2cpu run.global_batch=7",
        "run.global_batch=7 is invalid: must divide among the cell's 2 data-parallel shard(s)",
    ),
    _bad(
        "harness",
        "distribution=fsdp hardware=local_2cpu distribution.mixed_precision=true "
        "distribution.precision=bf16",
        "distribution.mixed_precision=True is invalid",
    ),
    # the cases the tests above name
    *UNKNOWN_NETWORK.values(),
    *IMPOSSIBLE_PIPELINE.values(),
    SWEEP_WITH_UNKNOWN_OPTION,
    *([] if torch_cuda_available() else [GPU_SWEEP]),
    WRONG_FLAG_VALUE,
    MISSPELLED_APPENDED_KEY,
    MALFORMED_OVERRIDE,
    TEARDOWN,
]


def _expand(text: str, work: Path) -> str:
    return text.replace("{work}", str(work)).replace("{file}", str(work / "a_file"))


def _run_in_process(case: Bad, work: Path, capture: Path) -> dict:
    """Run one case's real entry point (`python -m <command>`, through runpy) in this process
    (tests.in_process.run_in_process)."""
    return run_in_process(
        case.command, [_expand(arg, work) for arg in case.args], work, capture, case.env
    )


def _verdict(case: Bad, outcome: dict, work: Path) -> str | None:
    """Why `outcome` breaks the promise, or None when the case was refused as promised: the
    promise for any bad input (tests.in_process.refusal_broken), and a line that says what
    the case's `says` quotes."""
    broken = refusal_broken(outcome)
    if broken is not None:
        return broken
    says = _expand(case.says, work)
    if says not in outcome["stderr"].strip():
        return f"the line does not say {says!r}"
    return None


def run_table(root: Path) -> list[dict]:
    """Every case of BAD_INPUTS in this process, in `root` (one subprocess for the table:
    a fresh interpreter per case costs ~4 s of imports here, ~80 cases would take minutes)."""
    import os

    work, capture = root / "work", root / "capture"
    work.mkdir(), capture.mkdir()
    (work / "a_file").write_text("not a directory\n")
    # Damaged fit.json files: numbers no analysis writes, and arrays nested 100,000 deep.
    (work / "fit_not_finite.json").write_text(
        '{"hardware": {"local_2cpu": {"params": {"contention": NaN, "communication": Infinity}}}}'
    )
    (work / "fit_cells.json").write_text(
        '{"hardware": {"local_2cpu": {"params": {"contention": 1.0}, "cells": 1' + "0" * 30 + "}}}"
    )
    (work / "fit_nested.json").write_text("[" * 100_000 + "]" * 100_000)
    # Anything a case should not have written lands in `work`, where the listing sees it.
    os.environ["DISTBENCH_CACHE_DIR"] = str(work / "cache")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ["PYTHONUNBUFFERED"] = "1"
    report = []
    for case in BAD_INPUTS:
        outcome = _run_in_process(case, work, capture)
        report.append(
            {
                "case": f"python -m {case.command} {' '.join(case.args)}",
                "stderr": outcome["stderr"][-1500:],
                "broken": _verdict(case, outcome, work),
            }
        )
    return report


def test_every_bad_input_in_the_table_is_refused_as_promised(table: list[dict]) -> None:
    """BAD_INPUTS, each through its command's real entry point, in one subprocess."""
    assert len(table) == len(BAD_INPUTS) >= 77
    broken = [row for row in table if row["broken"]]
    print(f"{len(table)} bad inputs tried, {len(table) - len(broken)} refused as promised")
    assert not broken, "\n".join(
        f"{row['case']}: {row['broken']}\n    {row['stderr'][-600:]}" for row in broken
    )


# the subprocess of the test above: python -m tests.faults.test_bad_input DIR
if __name__ == "__main__":
    import json

    _root = Path(sys.argv[1])
    (_root / "report.json").write_text(json.dumps(run_table(_root), indent=1))


# --- What the checks must let through ------------------------------------------------------


def test_commands_about_other_hardware_accept_a_gpu_config() -> None:
    """describe/plan/recommend/analysis describe hardware one need not be on: hardware.device
    is checked against this machine only where a cell runs here."""
    config = validate(compose_config(["hardware=titanrtx_cluster", "dataset=imagenet"]))
    assert config.hardware.device.value == "cuda"


def test_a_gpu_sweep_for_slurm_passes_the_checks_on_a_login_node(
    tmp_path: Path, monkeypatch
) -> None:  # noqa: ANN001
    """A login node submits GPU jobs without a GPU of its own; nothing is written by the check."""
    import shutil

    from launchers.hydra_main import check_hydra_main

    if shutil.which("sbatch") is None:
        pytest.skip("SLURM's sbatch is not installed here")
    monkeypatch.chdir(tmp_path)
    check_hydra_main(
        [
            "+sweep=imagenet_resnet",
            "hydra/launcher=submitit_slurm",
            f"run.output_dir={tmp_path / 'outputs'}",
        ]
    )
    check_hydra_main(["dataset.num_samples=16", "distribution.batch_size=8"])  # a single run
    assert listing(tmp_path) == []


def test_the_writability_check_leaves_nothing_behind(tmp_path: Path) -> None:
    from harness.cli.preflight import check_writable_dir

    check_writable_dir("run.output_dir", str(tmp_path))
    check_writable_dir("run.output_dir", str(tmp_path / "not" / "yet"))
    assert listing(tmp_path) == []


def test_the_reliability_doc_counts_the_tables_rows() -> None:
    """docs/reliability.md says how many bad inputs the table holds: the number it says is the
    table's (a row added here must not leave the doc's count stale)."""
    text = (REPO_ROOT / "docs" / "reliability.md").read_text()
    assert f"a table of {len(BAD_INPUTS)} bad inputs" in text
    assert f"all {len(BAD_INPUTS)} are refused as promised" in text
