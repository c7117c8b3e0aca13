"""Bad input, as a user meets it: every command answers an invalid config, an unknown name or an
impossible combination with one line on stderr that names the key and what is allowed, exit
status 2 and no traceback, before any cell starts (harness.cli)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from harness.compose import compose_config
from harness.config import ConfigError, validate
from tests.helpers import REPO_ROOT, run_module

NETWORKS = "mobilenetv2, resnet152, resnet18, resnet50, vgg11, vgg16"

# Commands that take config overrides. analysis/recommend are checked once they exist.
COMMANDS = ["harness", "harness.describe", "harness.probe", "harness.plan",
            "harness.analysis", "harness.recommend"]


def _assert_one_line_exit_2(module: str, args: list[str], cwd: Path, *fragments: str) -> None:
    spec = importlib.util.find_spec(module)
    # (origin inside this checkout: a shared editable install can see another checkout's)
    if spec is None or spec.origin is None or REPO_ROOT not in Path(spec.origin).parents:
        pytest.skip(f"{module} does not exist in this checkout yet")
    done = run_module(module, args, cwd=cwd, timeout=180)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("distbench:")]
    assert len(errors) == 1 and errors[0] == done.stderr.strip().splitlines()[-1], done.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert not (cwd / "outputs").exists() or not list((cwd / "outputs").rglob("result.json"))


@pytest.mark.parametrize("module", COMMANDS)
def test_an_unknown_group_option_lists_the_choices(module: str, tmp_path: Path) -> None:
    _assert_one_line_exit_2(module, ["network=resnet19"], tmp_path,
                            f"network=resnet19: unknown; choose one of {NETWORKS}")


@pytest.mark.parametrize("module", ["harness", "harness.plan"])
def test_an_impossible_pipeline_stops_the_command(module: str, tmp_path: Path) -> None:
    _assert_one_line_exit_2(
        module, ["distribution=gpipe", "hardware=local_2cpu", "distribution.batch_size=8",
                 "distribution.micro_batches=4", "distribution.balance=[1,1]",
                 f"run.output_dir={tmp_path / 'outputs'}"], tmp_path,
        "distribution.balance=[1, 1] is invalid", "sum to the 15 layers of network=resnet18")


def test_a_sweep_with_an_unknown_option_stops_before_any_cell(tmp_path: Path) -> None:
    _assert_one_line_exit_2("harness", ["-m", "network=mobilenetv2,resnet19",
                                        "dataset.num_samples=128", "run.epochs=1",
                                        f"run.output_dir={tmp_path / 'outputs'}"], tmp_path,
                            "network=resnet19: unknown; choose one of")


def test_a_misspelled_appended_key_is_not_ignored(tmp_path: Path) -> None:
    _assert_one_line_exit_2("harness", ["+dataset.num_sample=16",
                                        f"run.output_dir={tmp_path / 'outputs'}"], tmp_path,
                            "dataset.num_sample: unknown key; allowed: name, source")


def test_a_malformed_override_is_one_line(tmp_path: Path) -> None:
    _assert_one_line_exit_2("harness.describe", ["run.epochs=[1"], tmp_path,
                            "run.epochs=[1: malformed override")


@pytest.mark.parametrize(("overrides", "fragment"), [
    # more pipeline stages than the network has layers (ResNet-18's list has 15)
    (["distribution=gpipe", "network=resnet18", "hardware.workers_per_node=16",
      "distribution.batch_size=32", "distribution.micro_batches=4"],
     "hardware.workers_per_node=16 is invalid: 16 pipeline stages for network=resnet18, which "
     "has 15 layers; allowed: at most 15 stages"),
    (["distribution=pipedream", "network=resnet18", "hardware.workers_per_node=16",
      "distribution.stages=" + "-".join(["1"] * 16)], "allowed: at most 15 stages"),
    # a replication plan that does not match the worker count
    (["distribution=pipedream", "hardware=local_4cpu", "distribution.stages=2-1"],
     "the replica counts must sum to the 4 workers of hardware=local_4cpu"),
    (["distribution=pipedream", "hardware=local_4cpu", "distribution.stages=2-1-1",
      "distribution.balance=[5,5]"], "needs one layer count per stage (3)"),
    # a balance that does not cover the layer list
    (["distribution=gpipe", "hardware=local_2cpu", "network=resnet18",
      "distribution.balance=[10,10]", "distribution.batch_size=32",
      "distribution.micro_batches=4"], "must sum to the 15 layers of network=resnet18"),
    # a batch smaller than the micro-batch count
    (["distribution=gpipe", "hardware=local_2cpu", "distribution.batch_size=4",
      "distribution.micro_batches=8"], "distribution.micro_batches=8 is invalid: must divide"),
    (["distribution=gpipe", "hardware=local_cpu"], "GPipe needs 2 or more workers"),
    (["distribution=gpipe", "hardware=local_2cpu", "distribution.stages=1-1"],
     "GPipe runs one stage per worker; allowed: null"),
    # fewer samples than one batch per worker
    (["distribution=ddp", "hardware=local_2cpu", "dataset.num_samples=16",
      "distribution.batch_size=16"], "batch size 16 x 2 workers = 32"),
    # NCCL on CPU workers
    (["distribution=ddp", "distribution.backend=nccl"],
     "NCCL needs hardware.device=cuda; allowed on CPU: gloo, or null"),
])
def test_impossible_combinations_are_rejected(overrides: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate(compose_config(overrides))
    assert fragment in str(error.value)


def test_a_valid_pipeline_still_validates() -> None:
    config = validate(compose_config(["distribution=gpipe", "hardware=local_2cpu",
                                      "network=resnet18", "distribution.balance=[10,5]",
                                      "distribution.batch_size=32",
                                      "distribution.micro_batches=4"]))
    assert config.distribution.balance == [10, 5]
