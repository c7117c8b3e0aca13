"""A package of the user's adds a network source and a distribution model together, each
registered by an entry point (`distbench.network_sources`, `distbench.distributions`), and no
file of distbench is edited: its modules, their config files and its `dist-info` (what
`pip install` of a package declaring the entry points leaves) lie in a temporary folder on
PYTHONPATH, outside the repository.

The source, `mlp`, builds a multi-layer perceptron whose hidden widths `network.arch` names
(`64x32`), as a module that is no `nn.Sequential`: its layer list is the source's own
(`NetworkSourceSpec.layers`), which a pipeline partitions. The model, `gather_dp`, averages
gradients after the backward pass by all-gathering every worker's flat gradient, and declares
what the hardware probe must measure for it (`DistributionSpec.probed_collectives`). A cell of
that source and that model validates, is refused in one line where a key is wrong, and trains
on two workers (16 samples)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.sync import result_files
from tests.helpers import REPO_ROOT

SOURCE_MODULE = '''\
"""`network.source=mlp`: a multi-layer perceptron, its hidden widths in network.arch."""

from workloads.networks.source import NetworkSourceSpec, function_in

SPEC = NetworkSourceSpec(
    name="mlp",
    build=function_in(f"{__name__}.build", "build_mlp"),
    requires="arch",
    settings=("arch",),
    layers=function_in(f"{__name__}.build", "mlp_layers"),
)
'''

SOURCE_BUILD = '''\
import torch
from torch import nn

from workloads.networks.ref import NetworkError


class MLP(nn.Module):
    """Flattened images in, logits out: its blocks in a ModuleList, no nn.Sequential."""

    def __init__(self, widths, inputs, classes):
        super().__init__()
        sizes = [inputs, *widths]
        hidden = [
            nn.Sequential(nn.Linear(n, m), nn.ReLU()) for n, m in zip(sizes, sizes[1:])
        ]
        self.blocks = nn.ModuleList([nn.Flatten(), *hidden, nn.Linear(sizes[-1], classes)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def build_mlp(ref, dataset):
    try:
        widths = [int(width) for width in ref.arch.split("x")]
    except ValueError:
        raise NetworkError(f"network.arch={ref.arch}: not widths such as 64x32") from None
    if dataset.tokens:
        raise NetworkError(f"network.arch={ref.arch}: an image network; dataset={dataset.name}")
    inputs = dataset.channels * dataset.resolution ** 2
    return MLP(widths, inputs, dataset.num_classes)


def mlp_layers(ref, model):
    return list(model.blocks)
'''

SOURCE_CONFIG = """\
name: mlp
source: mlp
arch: 64x32
"""

MODEL_MODULE = '''\
"""`gather_dp`: data parallelism, gradients averaged by an all-gather after the backward."""

from dataclasses import dataclass

from harness.config.schema import DistbenchConfig, DistributionConfig
from harness.costs.terms import CellFacts, EpochTerms, data_parallel_terms, replica_memory
from harness.distributions.spec import DistributionSpec, at_every_count, trainer_in, workers_label
from harness.profiles.collectives import Collective
from harness.profiles.hardware import HardwareProfile


@dataclass
class GatherDPConfig(DistributionConfig):
    name: str = "gather_dp"


def epoch_terms(config: DistbenchConfig, facts: CellFacts,
                profile: HardwareProfile | None) -> EpochTerms:
    assert profile is not None
    # priced as one allreduce of the whole gradient, exposed after the backward pass
    return data_parallel_terms(config, facts, profile, exposed_threshold_mb=facts.gradient_mb,
                               messages=1)


def memory_per_worker(config, facts):
    return [replica_memory(config, facts, buffer_mb=facts.gradient_mb)] * config.world_size


SPEC = DistributionSpec(
    name="gather_dp", title="all-gather data parallelism", settings=GatherDPConfig,
    trainer=trainer_in(f"{__name__}.trainer", "gather_dp_trainer"), epoch_terms=epoch_terms,
    memory_per_worker=memory_per_worker, candidates=at_every_count(GatherDPConfig),
    label=workers_label("gather_dp"),
    probed_collectives=(Collective.point_to_point, Collective.allreduce, Collective.all_gather))
'''

MODEL_TRAINER = '''\
import torch
import torch.distributed as dist

from harness.distributions.loop import BatchLoopTrainer


class GatherAverage:
    """GradientSync: after backward, every worker's flat gradient all-gathered and averaged."""

    def __init__(self, model):
        self.parameters = [p for p in model.parameters() if p.requires_grad]

    def waited_in_backward(self):
        return 0.0

    def wait(self, optimizer):
        grads = [p.grad for p in self.parameters if p.grad is not None]
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        workers = dist.get_world_size()
        gathered = torch.empty(workers * flat.numel(), dtype=flat.dtype)
        dist.all_gather_into_tensor(gathered, flat)
        mean = gathered.view(workers, -1).mean(0)
        offset = 0
        for grad in grads:
            grad.copy_(mean[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def step(self, optimizer):
        optimizer.step()


def gather_dp_trainer(context):
    model = context.workload.model.to(context.device)
    if not context.peers.env.is_distributed:
        return BatchLoopTrainer(context, model)
    for tensor in model.state_dict().values():  # every replica starts from rank 0's
        dist.broadcast(tensor, 0)
    return BatchLoopTrainer(context, model, gradient_sync=GatherAverage(model))
'''

MODEL_CONFIG = """\
defaults:
  - /gather_dp_schema
  - _self_
name: gather_dp
batch_size: null
backend: null
"""

ENTRY_POINTS = """\
[distbench.network_sources]
mlp = my_extensions.mlp

[distbench.distributions]
gather_dp = my_extensions.gather_dp
"""


@pytest.fixture(scope="module")
def user_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as `pip install` of the user's package leaves it in site-packages."""
    site = tmp_path_factory.mktemp("extensions-site")
    package = site / "my_extensions"
    files = {
        "__init__.py": "",
        "mlp/__init__.py": SOURCE_MODULE,
        "mlp/build.py": SOURCE_BUILD,
        "mlp/conf/network/mlp.yaml": SOURCE_CONFIG,
        "gather_dp/__init__.py": MODEL_MODULE,
        "gather_dp/trainer.py": MODEL_TRAINER,
        "gather_dp/conf/distribution/gather_dp.yaml": MODEL_CONFIG,
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    info = site / "my_extensions-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-extensions\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    assert not site.is_relative_to(REPO_ROOT)
    return site


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": path},
    )


CELL = [
    "network=mlp",
    "distribution=gather_dp",
    "hardware=local_2cpu",
    "dataset=mnist",
    "dataset.num_samples=16",
    "distribution.batch_size=4",
    "run.epochs=1",
    "run.warmup_batches=1",
    "run.progress=false",
    "tracking.enabled=false",
]

# What the registries hold with the package on the path, asked in one process.
REGISTRIES = """\
import json
from harness.distributions.registry import probed_collectives, spec_named
from workloads.datasets.spec import DATASET_SPECS
from workloads.networks import NetworkRef, build_network, layer_count, to_layer_list
from workloads.networks.registry import sources

ref = NetworkRef(name="mlp", source="mlp", arch="64x32")
model = build_network(ref, DATASET_SPECS["mnist"])
print(json.dumps({
    "sources": list(sources()),
    "plan": sources()["mlp"].tensor_parallel_plan,
    "layers": [type(layer).__name__ for layer in to_layer_list(ref, model)],
    "count": layer_count(ref, DATASET_SPECS["mnist"]),
    "declared": sorted(c.value for c in spec_named("gather_dp").probed_collectives),
    "probed": sorted(c.value for c in probed_collectives()),
}))
"""


def test_a_registered_source_and_model_are_options_whose_cells_validate(
    user_site: Path, tmp_path: Path
) -> None:
    helped = _run(user_site, tmp_path, "-m", "harness", "--help")
    assert helped.returncode == 0, helped.stderr
    groups = {
        line.split(": ", 1)[0]: line.split(": ", 1)[1].split(", ")
        for line in helped.stdout.splitlines()
        if line.startswith(("network: ", "distribution: "))
    }
    assert "mlp" in groups["network"] and "gather_dp" in groups["distribution"]
    asked = _run(user_site, tmp_path, "-c", REGISTRIES)
    assert asked.returncode == 0, asked.stderr
    held = json.loads(asked.stdout)
    assert held["sources"] == ["builtin", "module", "torchvision", "timm", "hf", "mlp"]
    assert held["plan"] is None
    assert held["layers"] == ["Flatten", "Sequential", "Sequential", "Linear"]
    assert held["count"] == 4
    assert held["declared"] == ["all_gather", "allreduce", "point_to_point"]
    assert set(held["declared"]) <= set(held["probed"])
    dry = _run(
        user_site, tmp_path, "-m", "harness", *CELL, f"run.output_dir={tmp_path}", "--dry-run"
    )
    assert dry.returncode == 0, dry.stderr
    assert "gather_dp" in dry.stdout and "mlp" in dry.stdout
    # its layer list is the source's: a pipeline of it has at most its four layers' stages
    piped = [
        *(setting for setting in CELL if not setting.startswith(("distribution=", "hardware="))),
        "distribution=gpipe",
        "hardware=local_4cpu",
        "hardware.workers_per_node=5",
    ]
    refused = _run(user_site, tmp_path, "-m", "harness", *piped)
    assert refused.returncode == 2, refused.stderr
    assert "5 pipeline stages for network=mlp, which has 4 layers" in refused.stderr
    # wrong keys are refused in one line, naming the setting and the sources that have it
    for wrong, message in (
        (
            "network.arch=null",
            "network.arch=None is invalid: network.source=mlp needs network.arch",
        ),
        ("network.arch=wide", "network.arch=wide: not widths such as 64x32"),
        (
            "+network.kwargs.depth=2",
            "network.kwargs={'depth': 2} is invalid: is a setting of network.source=module, "
            "torchvision, timm, not of mlp",
        ),
    ):
        refused = _run(user_site, tmp_path, "-m", "harness", *CELL, wrong)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.count("\n") == 1 and message in refused.stderr, refused.stderr


def test_a_cell_of_the_registered_source_and_model_trains(
    user_site: Path, output_root: Path
) -> None:
    done = _run(
        user_site, output_root.parent, "-m", "harness", *CELL, f"run.output_dir={output_root}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = list(result_files(output_root))
    result = json.loads(path.read_text())
    assert result["status"] == "ok", result.get("error")
    assert result["config"]["network"]["source"] == "mlp"
    assert result["config"]["distribution"]["name"] == "gather_dp"
    metrics = result["metrics"]
    assert metrics["world_size"] == 2 and metrics["seconds_per_epoch"] > 0
    assert metrics["replicas_in_sync"] == 1.0  # the all-gathered average is every replica's
