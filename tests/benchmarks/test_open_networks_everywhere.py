"""Benchmark (`-m perf`): four kinds of network from outside distbench's six, each through
every distribution model, locally and as jobs of the 2-node SLURM cluster on this machine
(scripts/slurm_local.sh), recorded in MLflow with images/s or tokens/s:

- a user's module from a package in a temporary directory (a small causal language model, not
  an nn.Sequential, split at its blocks),
- a torchvision model outside the six (`efficientnet_b0`, CIFAR-10),
- a timm model (`resnet10t`, CIFAR-10),
- Hugging Face GPT-2 from its config class (`gpt2_tiny`, synthetic tokens).

Each sweep is one `python -m harness -m +sweep/calibrate_local=<all six>` (every model with
the calibration's settings) as a user types it; the table
of cells (status, s/epoch, throughput) is printed and written to
`outputs/benchmarks/open_networks.json`. Run on a quiet machine:

    .venv/bin/python -m pytest tests/benchmarks/test_open_networks_everywhere.py -m perf -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.distributions.registry import specs
from tests.helpers import REPO_ROOT
from tests.integration.test_open_networks import USER_MODELS

pytestmark = pytest.mark.perf

MODELS = ",".join(sorted(specs()))
SMALL = ["run.epochs=1", "run.warmup_batches=1", "run.progress=false"]
BATCH_8 = ["dataset.num_samples=64", "distribution.batch_size=8"]
NETWORKS = {
    "user module": [
        "network=module",
        "network.target=userlm.models:build",
        "network.blocks=blocks",
        "dataset=tokens",
        "dataset.seq_len=32",
        "optimizer.name=adamw",
        "optimizer.lr=0.003",
        *BATCH_8,
    ],
    # batch 16: GPipe's 4 micro-batches of 2 samples leave EfficientNet-B0's BatchNorm running
    # statistics that evaluate to NaN (the cell is recorded diverged; 4 samples evaluate)
    "torchvision efficientnet_b0": [
        "network=torchvision",
        "network.arch=efficientnet_b0",
        "dataset=cifar10",
        "dataset.num_samples=128",
        "distribution.batch_size=16",
    ],
    "timm resnet10t": ["network=timm", "network.arch=resnet10t", "dataset=cifar10", *BATCH_8],
    "hf gpt2": [
        "network=gpt2_tiny",
        "dataset=tokens",
        "dataset.seq_len=64",
        "optimizer.name=adamw",
        "optimizer.lr=0.003",
        *BATCH_8,
    ],
}
WHERE = {
    "local": ["hardware=local_2cpu"],
    "slurm 2 nodes": ["hydra/launcher=submitit_slurm", "hardware=slurm_local_2nodes"],
}


def _sweep(root: Path, where: str, network: str) -> list[dict]:
    output = root / "outputs" / where.replace(" ", "_") / network.replace(" ", "_")
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(root / "packages"), str(REPO_ROOT)]),
    )
    done = subprocess.run(
        # each model with the calibration's settings (GPipe's 4 micro-batches divide the batch)
        [
            sys.executable,
            "-m",
            "harness",
            "-m",
            f"+sweep/calibrate_local={MODELS}",
            *NETWORKS[network],
            *SMALL,
            *WHERE[where],
            f"run.output_dir={output}",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # the cells' own directories (MLflow's artifact store under output holds copies)
    return [
        json.loads(path.read_text())
        for path in sorted((output / "sweeps").glob("*/*/*/result.json"))
    ]


@pytest.mark.parametrize("where", list(WHERE))
def test_every_kind_of_network_trains_in_every_model(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if where.startswith("slurm"):
        request.getfixturevalue("slurm_cluster")
    package = tmp_path / "packages" / "userlm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(textwrap.dedent(USER_MODELS))
    rows = []
    for network in NETWORKS:
        for result in _sweep(tmp_path, where, network):
            metrics = result.get("metrics", {})
            rows.append(
                {
                    "where": where,
                    "network": network,
                    "cell": result["run_name"],
                    "status": result["status"],
                    "mlflow_run_id": result["mlflow_run_id"],
                    "seconds_per_epoch": metrics.get("seconds_per_epoch"),
                    "images_per_second": metrics.get("images_per_second"),
                    "tokens_per_second": metrics.get("tokens_per_second"),
                }
            )
    for row in rows:
        print(
            f"{row['where']:<14} {row['cell']:<58} {row['status']:<8} "
            f"{row['seconds_per_epoch'] or float('nan'):>8.3f} s/epoch "
            f"{row['images_per_second'] or float('nan'):>8.1f} samples/s "
            f"{row['tokens_per_second'] or float('nan'):>9.0f} tokens/s"
        )
    out = REPO_ROOT / "outputs" / "benchmarks" / f"open_networks_{where.replace(' ', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    assert len(rows) == len(NETWORKS) * len(specs())
    assert all(row["status"] == "ok" and row["mlflow_run_id"] for row in rows), rows
