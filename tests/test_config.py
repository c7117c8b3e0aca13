"""Config composition and validation: every grid axis composes, bad input fails early."""

from __future__ import annotations

import itertools

import pytest
from hydra.types import RunMode

from harness.batch_sizes import default_batch_size
from harness.compose import CONF_DIR, compose_config, compose_or_exit
from harness.config import ConfigError, DistbenchConfig, validate
from harness.distributions.gpipe import TABLE_3_3

DATASETS = ["mnist", "cifar10", "imagenet", "highres"]
NETWORKS = ["resnet18", "resnet50", "resnet152", "vgg11", "vgg16", "mobilenetv2"]
TOKEN_DATASETS = ["tokens", "text"]
# Any other network by source, and the language-model presets (workloads/networks/lm.py).
OPEN_NETWORKS = ["module", "torchvision", "timm", "hf"]
LM_PRESETS = ["llama_tiny", "llama3_8b", "gpt2_tiny", "gpt2_small", "gpt2_medium", "gpt2_large",
              "gpt2_xl", "bert_large"]


def test_config_groups_on_disk_match_the_schema() -> None:
    conf = CONF_DIR
    assert sorted(p.stem for p in (conf / "dataset").glob("*.yaml")) == \
        sorted(DATASETS + TOKEN_DATASETS)
    assert sorted(p.stem for p in (conf / "network").glob("*.yaml")) == \
        sorted(NETWORKS + OPEN_NETWORKS + LM_PRESETS)
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
    assert (config.hardware.device.value, config.hardware.nodes,
            config.hardware.workers_per_node) == ("cpu", 1, 1)


def test_batch_sizes_follow_table_3_3() -> None:
    expected = {"mnist": (128, 3072, 24), "cifar10": (64, 2048, 32),
                "imagenet": (32, 384, 12), "highres": (32, 48, 12)}
    for dataset, (per_worker, gpipe_batch, micro_batches) in expected.items():
        for model in ("sequential", "horovod", "ddp", "pipedream"):
            config = validate(compose_config([f"dataset={dataset}", f"distribution={model}",
                                              "hardware=local_2cpu"]))
            assert config.batch_size == per_worker
        gpipe = validate(compose_config([f"dataset={dataset}", "distribution=gpipe",
                                         "hardware=local_2cpu", "dataset.num_samples=4096"]))
        assert TABLE_3_3[dataset] == (gpipe_batch, micro_batches)
        assert gpipe.batch_size == gpipe_batch
        assert gpipe.distribution.step_batch(gpipe) == gpipe_batch // micro_batches


def test_batch_size_override_wins_over_the_table() -> None:
    assert validate(compose_config(["distribution.batch_size=7"])).batch_size == 7


@pytest.mark.parametrize(("override", "fragment"), [
    (["dataset.num_samples=-5"], "dataset.num_samples=-5 is invalid: must be a positive number"),
    (["dataset.num_samples=0"], "dataset.num_samples=0"),
    (["run.epochs=0"], "run.epochs=0 is invalid: must be 1 or more"),
    (["run.warmup_batches=-1"], "run.warmup_batches=-1"),
    (["hardware.nodes=0"], "hardware.nodes=0"),
    (["distribution.batch_size=-1"], "distribution.batch_size=-1"),
    (["optimizer.momentum=1.5"], "optimizer.momentum=1.5 is invalid: must be in [0, 1)"),
    (["dataset=highres", "dataset.source=real", "dataset.root=/data"],
     "dataset highres exists only as synthetic data; allowed: synthetic"),
    (["dataset.source=real"], "dataset.root=None is invalid"),
    (["dataset.num_samples=10"], "an epoch needs at least one full batch per worker (batch "
                                 "size 128 x 1 workers = 128)"),
    (["distribution=ddp", "hardware=local_2cpu", "dataset.num_samples=200"],
     "batch size 128 x 2 workers = 256"),
    (["distribution=gpipe", "hardware=local_2cpu", "distribution.batch_size=8",
      "distribution.micro_batches=16"],
     "distribution.micro_batches=16 is invalid: must divide the GPipe batch"),
    (["distribution=gpipe", "hardware=local_2cpu", "distribution.batch_size=100"],
     "distribution.micro_batches=24 is invalid: must divide the GPipe batch"),
    (["distribution=ddp", "distribution.backend=mpi"], "allowed: gloo, nccl"),
])
def test_invalid_values_name_the_key_and_what_is_allowed(override: list[str],
                                                          fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate(compose_config(override))
    assert fragment in str(error.value)


@pytest.mark.parametrize(("override", "fragments"), [
    ("network=resnet19", ["network=resnet19: unknown; choose one of", "resnet18", "mobilenetv2",
                          "vgg16"]),
    ("dataset=svhn", ["dataset=svhn: unknown; choose one of", "cifar10", "imagenet"]),
    ("hardware.device=tpu", ["hardware.device", "cpu, cuda"]),
    ("run.epochs=abc", ["run.epochs", "abc"]),
    ("dataset.bogus=1", ["dataset.bogus"]),
    ("distribution.name=allreduce", ["distribution.name", "sequential", "horovod", "pipedream"]),
])
def test_unknown_names_fail_with_one_line_and_exit_2(
        override: str, fragments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        compose_or_exit([override])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and message.startswith("distbench: invalid config:")
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize(("sweep", "experiment"), [
    ("smoke", "smoke"), ("local_data_parallel", "local_data_parallel"),
    # the thesis' grid and its flagship share their cells, so one experiment holds both
    ("imagenet_resnet", "thesis"), ("thesis_grid", "thesis")])
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


@pytest.mark.parametrize(("hardware", "stages"), [("local_2cpu", "1-1"),
                                                   ("local_4cpu", "1-1-1-1")])
def test_a_straight_pipedream_is_one_stage_per_worker(hardware: str, stages: str) -> None:
    config = validate(compose_config(["distribution=pipedream_straight",
                                      f"hardware={hardware}", "network=vgg11"]))
    assert config.distribution.name == "pipedream"
    assert config.distribution.stages == stages
