"""Config composition and validation: every grid axis composes, bad input fails early."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra.types import RunMode

from harness.commands.compose import CONF_DIR, compose_config, compose_or_exit
from harness.config.batch_sizes import default_batch_size
from harness.config.schema import ConfigError, DistbenchConfig, resolved_container, validate
from harness.distributions.gpipe import TABLE_3_3

DATASETS = ["mnist", "cifar10", "imagenet", "highres"]
NETWORKS = ["resnet18", "resnet50", "resnet152", "vgg11", "vgg16", "mobilenetv2"]
TOKEN_DATASETS = ["tokens", "text"]
# Any other network by source, and the language-model presets (workloads/networks/lm.py).
OPEN_NETWORKS = ["module", "torchvision", "timm", "hf"]
LM_PRESETS = [
    "llama_tiny",
    "llama3_8b",
    "llama3_70b",
    "llama3_405b",
    "gpt2_tiny",
    "gpt2_small",
    "gpt2_medium",
    "gpt2_large",
    "gpt2_xl",
    "bert_large",
]


def test_config_groups_on_disk_match_the_schema() -> None:
    conf = CONF_DIR
    assert sorted(p.stem for p in (conf / "dataset").glob("*.yaml")) == sorted(
        DATASETS + TOKEN_DATASETS
    )
    assert sorted(p.stem for p in (conf / "network").glob("*.yaml")) == sorted(
        NETWORKS + OPEN_NETWORKS + LM_PRESETS
    )
    assert (conf / "distribution" / "sequential.yaml").exists()
    assert {"local_cpu", "titanrtx_cluster"} <= {p.stem for p in (conf / "hardware").glob("*.yaml")}


@pytest.mark.parametrize(("dataset", "network"), list(itertools.product(DATASETS, NETWORKS)))
def test_every_dataset_network_pair_composes(dataset: str, network: str) -> None:
    config = validate(compose_config([f"dataset={dataset}", f"network={network}"]))
    assert isinstance(config, DistbenchConfig)
    assert config.dataset.name.value == dataset
    assert config.network.name == network
    assert config.batch_size == default_batch_size(dataset)


def test_defaults_are_the_documented_ones() -> None:
    config = validate(compose_config([]))
    assert (config.run.epochs, config.run.seed, config.run.output_dir) == (3, 0, "outputs")
    assert config.dataset.name.value == "mnist" and config.dataset.source.value == "synthetic"
    assert config.dataset.num_samples is None  # full dataset
    assert config.distribution.name == "sequential"
    assert (
        config.hardware.device.value,
        config.hardware.nodes,
        config.hardware.workers_per_node,
    ) == ("cpu", 1, 1)


def test_batch_sizes_follow_table_3_3() -> None:
    expected = {
        "mnist": (128, 3072, 24),
        "cifar10": (64, 2048, 32),
        "imagenet": (32, 384, 12),
        "highres": (32, 48, 12),
    }
    for dataset, (per_worker, gpipe_batch, micro_batches) in expected.items():
        for model in ("sequential", "horovod", "ddp", "pipedream"):
            config = validate(
                compose_config(
                    [f"dataset={dataset}", f"distribution={model}", "hardware=local_2cpu"]
                )
            )
            assert config.batch_size == per_worker
        gpipe = validate(
            compose_config(
                [
                    f"dataset={dataset}",
                    "distribution=gpipe",
                    "hardware=local_2cpu",
                    "dataset.num_samples=4096",
                ]
            )
        )
        assert TABLE_3_3[dataset] == (gpipe_batch, micro_batches)
        assert gpipe.batch_size == gpipe_batch
        assert gpipe.distribution.step_batch(gpipe) == gpipe_batch // micro_batches


def test_batch_size_override_wins_over_the_table() -> None:
    assert validate(compose_config(["distribution.batch_size=7"])).batch_size == 7


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        (
            ["dataset.num_samples=-5"],
            "dataset.num_samples=-5 is invalid: must be a positive number",
        ),
        (["dataset.num_samples=0"], "dataset.num_samples=0"),
        (["run.epochs=0"], "run.epochs=0 is invalid: must be 1 or more"),
        (["run.warmup_batches=-1"], "run.warmup_batches=-1"),
        (["hardware.nodes=0"], "hardware.nodes=0"),
        (["distribution.batch_size=-1"], "distribution.batch_size=-1"),
        (["optimizer.momentum=1.5"], "optimizer.momentum=1.5 is invalid: must be in [0, 1)"),
        (
            ["dataset=highres", "dataset.source=real", "dataset.root=/data"],
            "dataset highres exists only as synthetic data; allowed: synthetic",
        ),
        (["dataset.source=real"], "dataset.root=None is invalid"),
        (
            ["dataset.num_samples=10"],
            "an epoch needs at least one full batch per worker (batch size 128 x 1 workers = 128)",
        ),
        (
            ["distribution=ddp", "hardware=local_2cpu", "dataset.num_samples=200"],
            "batch size 128 x 2 workers = 256",
        ),
        (
            [
                "distribution=gpipe",
                "hardware=local_2cpu",
                "distribution.batch_size=8",
                "distribution.micro_batches=16",
            ],
            "distribution.micro_batches=16 is invalid: must divide the GPipe batch",
        ),
        # an explicit micro-batch count that does not divide the batch names the ones that do
        (
            [
                "distribution=gpipe",
                "hardware=local_2cpu",
                "distribution.batch_size=100",
                "distribution.micro_batches=24",
            ],
            "distribution.micro_batches=24 is invalid: must divide the GPipe batch "
            "(distribution.batch_size=100) into equal micro-batches of 1 sample or more; allowed: "
            "divisors of 100 nearest 24: 20, 25, or null",
        ),
        (
            [
                "distribution=gpipe",
                "hardware=local_2cpu",
                "distribution.batch_size=8",
                "distribution.micro_batches=3",
            ],
            "allowed: divisors of 8: 1, 2, 4, 8, or null",
        ),
        (["distribution=ddp", "distribution.backend=mpi"], "allowed: gloo, nccl"),
    ],
)
def test_invalid_values_name_the_key_and_what_is_allowed(
    override: list[str], fragment: str
) -> None:
    with pytest.raises(ConfigError) as error:
        validate(compose_config(override))
    assert fragment in str(error.value)


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        (
            "network=resnet19",
            ["network=resnet19: unknown; choose one of", "resnet18", "mobilenetv2", "vgg16"],
        ),
        ("dataset=svhn", ["dataset=svhn: unknown; choose one of", "cifar10", "imagenet"]),
        ("hardware.device=tpu", ["hardware.device", "cpu, cuda"]),
        ("run.epochs=abc", ["run.epochs", "abc"]),
        ("dataset.bogus=1", ["dataset.bogus"]),
        (
            "distribution.name=allreduce",
            ["distribution.name", "sequential", "horovod", "pipedream"],
        ),
    ],
)
def test_unknown_names_fail_with_one_line_and_exit_2(
    override: str, fragments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        compose_or_exit([override])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and message.startswith("distbench: invalid config:")
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize(
    ("sweep", "experiment"),
    [
        ("smoke", "smoke"),
        ("local_data_parallel", "local_data_parallel"),
        # the thesis' grid and its flagship share their cells, so one experiment holds both
        ("imagenet_resnet", "thesis"),
        ("thesis_grid", "thesis"),
    ],
)
def test_sweep_configs_turn_on_multirun_by_themselves(sweep: str, experiment: str) -> None:
    cfg = compose_config([f"+sweep={sweep}"], with_hydra=True)
    assert cfg.hydra.mode == RunMode.MULTIRUN
    assert "network" in cfg.hydra.sweeper.params
    assert cfg.tracking.experiment == experiment
    validate(cfg)


def test_smoke_sweep_is_small() -> None:
    config = validate(compose_config(["+sweep=smoke"]))
    assert config.dataset.num_samples is not None and config.dataset.num_samples <= 512
    assert config.run.epochs <= 3


def test_world_size_follows_hardware_except_for_the_sequential_baseline() -> None:
    assert validate(compose_config(["hardware=local_2cpu"])).world_size == 1
    assert validate(compose_config(["distribution=ddp", "hardware=local_2cpu"])).world_size == 2
    cluster = validate(compose_config(["distribution=ddp", "hardware=titanrtx_cluster"]))
    assert cluster.world_size == 16


def test_a_multi_node_cell_is_refused_by_the_single_machine_launcher() -> None:
    from launchers.cells import single_node_workers

    local = validate(compose_config(["distribution=ddp", "hardware=local_2cpu"]))
    assert single_node_workers(local) == 2
    cluster = validate(compose_config(["distribution=ddp", "hardware=titanrtx_cluster"]))
    with pytest.raises(ConfigError, match="hardware.nodes=4 is invalid here.*submitit_slurm"):
        single_node_workers(cluster)


@pytest.mark.parametrize(("hardware", "stages"), [("local_2cpu", "1-1"), ("local_4cpu", "1-1-1-1")])
def test_a_straight_pipedream_is_one_stage_per_worker(hardware: str, stages: str) -> None:
    config = validate(
        compose_config(["distribution=pipedream_straight", f"hardware={hardware}", "network=vgg11"])
    )
    assert config.distribution.name == "pipedream"
    assert config.distribution.stages == stages


# --- GPipe's micro-batches follow the batch ----------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "micro_batches"),
    [
        ([], 24),  # Table 3.3's batch (3072) and count
        (["distribution.batch_size=32"], 16),  # the largest divisor of 32 up to mnist's 24
        (["distribution.batch_size=100"], 20),
        (["distribution.batch_size=7"], 7),  # micro-batches of one sample
        (["dataset=cifar10", "distribution.batch_size=48"], 24),  # up to cifar10's 32
        (["distribution.batch_size=32", "distribution.micro_batches=4"], 4),  # a setting wins
    ],
)
def test_gpipe_micro_batches_follow_the_batch(overrides: list[str], micro_batches: int) -> None:
    config = validate(
        compose_config(
            ["distribution=gpipe", "hardware=local_2cpu", "dataset.num_samples=4096", *overrides]
        )
    )
    assert config.distribution.micro_batch_count(config) == micro_batches
    assert config.batch_size % micro_batches == 0
    assert f" mb{micro_batches} " in config.run_name


# --- Refused sizes name the value that works ---------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        (
            ["distribution=ddp", "hardware=local_2cpu", "dataset.num_samples=128", "run.epochs=1"],
            "dataset.num_samples=128 is invalid: an epoch needs at least one full batch per worker "
            "(batch size 128 x 2 workers = 256); allowed: dataset.num_samples=256 or more, or the "
            "largest distribution.batch_size that works: 64",
        ),
        (
            ["distribution.batch_size=100000"],  # the whole dataset (num_samples null) is too small
            "distribution.batch_size=100000 is invalid: an epoch needs at least one full batch per "
            "worker (batch size 100000 x 1 workers = 100000), but dataset=mnist has 70000 samples "
            "(dataset.num_samples=null); largest distribution.batch_size that works: 70000",
        ),
        (
            ["distribution=ddp", "hardware=local_2cpu", "dataset.num_samples=1"],
            "allowed: dataset.num_samples=256 or more",
        ),  # no batch size fits one sample per worker
        # a pipeline batch with a micro-batch setting: a multiple of it
        (
            [
                "distribution=gpipe",
                "hardware=local_2cpu",
                "distribution.batch_size=64",
                "distribution.micro_batches=4",
                "dataset.num_samples=30",
            ],
            "allowed: dataset.num_samples=64 or more, or the largest distribution.batch_size that "
            "works: 28",
        ),
        (
            [
                "distribution=gpipe",
                "hardware=local_2cpu",
                "network=resnet18",
                "distribution.balance=[10,10]",
                "distribution.batch_size=32",
            ],
            "must sum to the 15 layers of network=resnet18 (dataset=mnist); allowed: e.g. [8,7], "
            "or null",
        ),
        (
            [
                "distribution=pipedream",
                "hardware=local_4cpu",
                "distribution.stages=2-1-1",
                "distribution.balance=[5,5]",
            ],
            "needs one layer count per stage (3); allowed: e.g. [5,5,5]",
        ),
        (
            ["distribution=fsdp", "hardware=local_4cpu", "distribution.shard_degree=3"],
            "must divide the cell's 4 workers (hardware.nodes x hardware.workers_per_node); "
            "allowed: divisors of 4: 1, 2, 4, or null",
        ),
        # PipeDream's batch division would drop every batch: refused before a worker starts
        (
            [
                "distribution=pipedream",
                "hardware=local_4cpu",
                "distribution.stages=4",
                "distribution.batch_size=64",
                "dataset.num_samples=200",
            ],
            "dataset.num_samples=200 is invalid: distribution.stages=4 shares batches evenly in "
            "multiples of 4, and batch_division=drop needs 4 or more batches of 64 per epoch (or "
            "distribution.batch_division=oversample); allowed: dataset.num_samples=256 or more, or "
            "the largest distribution.batch_size that works: 50",
        ),
    ],
)
def test_a_refused_size_names_the_value_that_works(overrides: list[str], fix: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate(compose_config(overrides))
    assert fix in str(error.value) and "\n" not in str(error.value)


def test_the_suggested_sizes_validate() -> None:
    """What the refusals above suggest is accepted."""
    for overrides in (
        [
            "distribution=ddp",
            "hardware=local_2cpu",
            "dataset.num_samples=128",
            "distribution.batch_size=64",
        ],
        [
            "distribution=gpipe",
            "hardware=local_2cpu",
            "distribution.batch_size=28",
            "distribution.micro_batches=4",
            "dataset.num_samples=30",
        ],
        [
            "distribution=pipedream",
            "hardware=local_4cpu",
            "distribution.stages=4",
            "distribution.batch_size=50",
            "dataset.num_samples=200",
        ],
        [
            "distribution=pipedream",
            "hardware=local_4cpu",
            "distribution.stages=4",
            "distribution.batch_size=64",
            "dataset.num_samples=200",
            "distribution.batch_division=oversample",
        ],
    ):
        validate(compose_config(overrides))


# --- One model's settings in a sweep over models -----------------------------------------------

PER_MODEL = ["hardware=local_2cpu", "dataset.num_samples=64", "distribution.batch_size=32"]


def test_a_per_model_setting_applies_to_its_model_only() -> None:
    from harness.records.resume import cell_key

    gpipe = compose_config(
        [
            "distribution=gpipe",
            *PER_MODEL,
            "+per_model.gpipe.micro_batches=4",
            "+per_model.gpipe.recompute=never",
        ]
    )
    config = validate(gpipe)
    assert (config.distribution.micro_batches, config.distribution.recompute.value) == (4, "never")
    assert config.per_model == {}  # applied: the typed cell holds the effective settings only
    recorded = resolved_container(gpipe)  # result.json's config, MLflow's params
    assert recorded["distribution"]["micro_batches"] == 4 and "per_model" not in recorded
    # it wins over distribution.<key> in its model's cells
    assert (
        validate(
            compose_config(
                [
                    "distribution=gpipe",
                    *PER_MODEL,
                    "distribution.micro_batches=8",
                    "+per_model.gpipe.micro_batches=4",
                ]
            )
        ).distribution.micro_batches
        == 4
    )
    # another model's cell ignores it: the same cell, the same record and key as without it
    ddp, plain = (
        compose_config(["distribution=ddp", *PER_MODEL, *extra])
        for extra in (["+per_model.gpipe.micro_batches=4"], [])
    )
    assert validate(ddp) == validate(plain)
    assert resolved_container(ddp) == resolved_container(plain)
    assert cell_key(ddp) == cell_key(plain)
    # presets share their model's name
    straight = validate(
        compose_config(
            [
                "distribution=pipedream_straight",
                *PER_MODEL,
                "+per_model.pipedream.batch_division=oversample",
            ]
        )
    )
    assert straight.distribution.batch_division.value == "oversample"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "+per_model.gpip.micro_batches=4",
            "per_model.gpip: unknown distribution model; allowed: "
            "ddp, fsdp, gpipe, horovod, mesh, pipedream, sequential",
        ),
        (
            "+per_model.gpipe.bogus=1",
            "per_model.gpipe.bogus: unknown key; allowed: batch_size, "
            "backend, balance, micro_batches, recompute",
        ),
        ("+per_model.gpipe.name=ddp", "per_model.gpipe.name: unknown key"),
        (
            "+per_model.gpipe.micro_batches=abc",
            "per_model.gpipe.micro_batches=abc is invalid: Value "
            "'abc' of type 'str' could not be converted to "
            "Integer",
        ),
        (
            "+per_model.gpipe.recompute=sometimes",
            "per_model.gpipe.recompute=sometimes is invalid: "
            "Invalid value 'sometimes', expected one of",
        ),
        (
            "+per_model.gpipe.micro_batches=0",
            "per_model.gpipe.micro_batches=0 is invalid: must be a positive number",
        ),
    ],
)
def test_a_per_model_entry_is_checked_in_every_cell(entry: str, message: str) -> None:
    """Checked against its model's settings even where the cell runs another model."""
    with pytest.raises(ConfigError) as error:
        validate(compose_config(["distribution=sequential", *PER_MODEL, entry]))
    assert message in str(error.value)


@pytest.mark.parametrize(
    "override", ["distribution.micro_batches=4", "+distribution.micro_batches=4"]
)
def test_another_models_key_names_the_per_model_form(
    override: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hydra's error (a key the schema lacks) and ours (an appended one) say the same."""
    monkeypatch.setattr("sys.argv", ["harness", "distribution=ddp", override])
    with pytest.raises(SystemExit):
        compose_or_exit(["distribution=ddp", override])
    assert capsys.readouterr().err.strip() == (
        "distbench: invalid config: distribution.micro_batches: unknown key; allowed: name, "
        "batch_size, backend, activation_checkpointing, checkpoint_every, precision, "
        "bucket_cap_mb; micro_batches is a setting of distribution=gpipe, "
        "not ddp: in a sweep over models use +per_model.gpipe.micro_batches=4"
    )


def test_a_sweep_over_models_takes_one_models_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep over three models with one model's setting: every cell validates as its launcher will
    compose it, and the dry run shows GPipe's cell with the setting and the others without."""
    from launchers.hydra_main import check_hydra_main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        check_hydra_main(
            [
                "-m",
                "distribution=sequential,ddp,gpipe",
                *PER_MODEL,
                "+per_model.gpipe.micro_batches=4",
                f"run.output_dir={tmp_path / 'outputs'}",
                "--dry-run",
            ]
        )
    assert exit_info.value.code == 0
    rows = capsys.readouterr().out
    assert "0 sequential 1x1 b32 " in rows and "1 ddp 1x2 b32 " in rows
    assert "2 gpipe 1x2 mb4 b32 " in rows
    assert list(tmp_path.iterdir()) == []


# --- Internal schemas are not options -----------------------------------------------------------


def test_the_models_schemas_are_not_distribution_options() -> None:
    """`distribution=ddp_schema` used to run the bare schema; completion offered it."""
    from hydra import initialize_config_module
    from hydra._internal.core_plugins.bash_completion import BashCompletion
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import MissingConfigException

    from harness.commands.compose import CONFIG_MODULE

    with pytest.raises(MissingConfigException):
        compose_config(["distribution=ddp_schema"])
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        completion = BashCompletion(loader)  # what `-sc query=bash` prints for COMP_LINE
        offered = completion._query(config_name="config", line="distribution=")
        assert "distribution=ddp" in offered and "distribution=pipedream_straight" in offered
        assert not [name for name in offered if "schema" in name], offered
        assert sorted(loader.get_group_options("distribution")) == sorted(
            p.stem for p in (CONF_DIR / "distribution").glob("*.yaml")
        )
