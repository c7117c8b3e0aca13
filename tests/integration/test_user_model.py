"""A distribution model of the user's own, in a package of theirs, registered as a Python plugin is
(an entry point of the group `distbench.distributions`, `harness.distributions.plugins`), with no
file of distbench edited: its module, its config and its trainer live in a temporary folder on
PYTHONPATH with the package's `dist-info` (what `pip install` of a package declaring the entry point
leaves), and `distribution=flat_dp` is then an option like a built-in one: listed by --help, its
setting checked, its time predicted by the dry run, and a real 2-worker cell trained with it.

The model, `flat_dp`, is one a researcher would add to compare with DDP: data parallelism
whose gradients are averaged after the backward pass by `chunks` allreduces of one flat
buffer (no buckets, no overlap with the backward)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.sync import result_files
from tests.helpers import REPO_ROOT

SPEC_MODULE = '''\
"""`flat_dp`: data parallelism, gradients averaged after the backward pass (a user's model)."""

from dataclasses import dataclass, field

from harness.config.accepts import number
from harness.config.schema import DistbenchConfig, DistributionConfig
from harness.distributions.spec import DistributionSpec, at_every_count, trainer_in, workers_label
from harness.profiles.hardware import HardwareProfile
from harness.costs.terms import CellFacts, EpochTerms, data_parallel_terms, replica_memory


@dataclass
class FlatDPConfig(DistributionConfig):
    name: str = "flat_dp"
    chunks: int = field(default=1, metadata=number(1, 1024, "allreduces"))


def epoch_terms(config: DistbenchConfig, facts: CellFacts,
                profile: HardwareProfile | None) -> EpochTerms:
    assert profile is not None and isinstance(config.distribution, FlatDPConfig)
    # the whole gradient is exposed: nothing runs beside the backward pass
    return data_parallel_terms(config, facts, profile, exposed_threshold_mb=facts.gradient_mb,
                               messages=config.distribution.chunks)


def memory_per_worker(config, facts):
    return [replica_memory(config, facts, buffer_mb=facts.gradient_mb)] * config.world_size


SPEC = DistributionSpec(
    name="flat_dp", title="flat allreduce data parallelism", settings=FlatDPConfig,
    trainer=trainer_in(f"{__name__}.trainer", "flat_dp_trainer"), epoch_terms=epoch_terms,
    memory_per_worker=memory_per_worker, candidates=at_every_count(FlatDPConfig),
    label=workers_label("flat_dp"))
'''

TRAINER_MODULE = '''\
import torch
import torch.distributed as dist

from harness.distributions.loop import BatchLoopTrainer


class FlatAllreduce:
    """GradientSync: after backward, every gradient averaged through one flat buffer."""

    def __init__(self, model, chunks):
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.chunks = chunks

    def waited_in_backward(self):
        return 0.0

    def wait(self, optimizer):
        grads = [p.grad for p in self.parameters if p.grad is not None]
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        for piece in flat.chunk(self.chunks):  # views of `flat`: reduced in place
            dist.all_reduce(piece)
        flat /= dist.get_world_size()
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def step(self, optimizer):
        optimizer.step()


def flat_dp_trainer(context):
    model = context.workload.model.to(context.device)
    if not context.peers.env.is_distributed:
        return BatchLoopTrainer(context, model)
    for tensor in model.state_dict().values():  # every replica starts from rank 0's
        dist.broadcast(tensor, 0)
    sync = FlatAllreduce(model, context.config.distribution.chunks)
    return BatchLoopTrainer(context, model, gradient_sync=sync)
'''

CONFIG_FILE = """\
defaults:
  - /flat_dp_schema
  - _self_
name: flat_dp
batch_size: null
backend: null
chunks: 2
"""


@pytest.fixture(scope="module")
def user_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as `pip install` of the user's package leaves it in site-packages."""
    site = tmp_path_factory.mktemp("user-site")
    package = site / "my_models" / "flat_dp"
    (package / "conf" / "distribution").mkdir(parents=True)
    (site / "my_models" / "__init__.py").write_text("")
    (package / "__init__.py").write_text(SPEC_MODULE)
    (package / "trainer.py").write_text(TRAINER_MODULE)
    (package / "conf" / "distribution" / "flat_dp.yaml").write_text(CONFIG_FILE)
    info = site / "my_models-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-models\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[distbench.distributions]\nflat_dp = my_models.flat_dp\n"
    )
    assert not site.is_relative_to(REPO_ROOT)
    return site


def _harness(site: Path, cwd: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": path},
    )


CELL = [
    "distribution=flat_dp",
    "hardware=local_2cpu",
    "dataset=mnist",
    "network=mobilenetv2",
    "dataset.num_samples=32",
    "distribution.batch_size=8",
    "run.epochs=1",
    "run.warmup_batches=1",
    "run.progress=false",
    "tracking.enabled=false",
]


def test_a_registered_model_is_an_option_whose_settings_are_checked(
    user_site: Path, tmp_path: Path
) -> None:
    helped = _harness(user_site, tmp_path, "harness", "--help")
    assert helped.returncode == 0, helped.stderr
    group = next(line for line in helped.stdout.splitlines() if line.startswith("distribution:"))
    assert "flat_dp" in group.split(": ", 1)[1].split(", ")
    refused = _harness(user_site, tmp_path, "harness", *CELL, "distribution.chunks=0")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "distribution.chunks=0" in refused.stderr
    dry = _harness(user_site, tmp_path, "harness", *CELL, f"run.output_dir={tmp_path}", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "flat_dp" in dry.stdout
    # Without the package the option does not exist, and the error lists the built-in ones.
    unknown = subprocess.run(
        [sys.executable, "-m", "harness", *CELL],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert unknown.returncode == 2 and "ddp" in unknown.stderr


def test_a_registered_model_trains_a_two_worker_cell(user_site: Path, output_root: Path) -> None:
    done = _harness(
        user_site, output_root.parent, "harness", *CELL, f"run.output_dir={output_root}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = list(result_files(output_root))
    result = json.loads(path.read_text())
    assert result["status"] == "ok", result.get("error")
    assert result["config"]["distribution"]["name"] == "flat_dp"
    assert result["config"]["distribution"]["chunks"] == 2  # its config file's value
    metrics = result["metrics"]
    assert metrics["world_size"] == 2 and metrics["seconds_per_epoch"] > 0
    # its averaging is real: the two replicas ended equal, and its wait was measured
    assert metrics["replicas_in_sync"] == 1.0
    assert metrics["comm_wait_seconds_per_epoch"] > 0


def test_a_registration_that_cannot_be_loaded_is_refused_in_one_line(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "broken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[distbench.distributions]\nnope = no_such_module\n")
    for module, args in (("harness", ["distribution=ddp", "--dry-run"]), ("harness.describe", [])):
        done = _harness(site, tmp_path, module, *args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert "nope = no_such_module" in done.stderr and "No module named" in done.stderr
