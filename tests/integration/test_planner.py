"""`python -m harness.recommend --plans` and `--predict` as a user runs them: a 70B model on a
cluster nobody here has, ranked from data sheets, and one plan priced as JSON."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from harness.commands.compose import compose_config
from harness.config.schema import validate
from tests.helpers import REPO_ROOT
from tests.in_process import listing


def _recommend(
    *args: str, cwd: Path, python_flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *python_flags, "-m", "harness.recommend", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
    )


def _remembered_only(home: Path) -> list[str]:
    """What a planning command wrote under `home`, but the network's remembered facts (its
    shape and input check, workloads.networks.remembered): nothing else."""
    cache = home / ".cache" / "distbench"
    return listing(home, leave_out=[cache / "network-checks", cache / "decoder-shapes"])


PLANS_70B = (
    "--plans",
    "network=llama3_70b",
    "hardware=h100_cluster",
    "hardware.nodes=32",
    "run.global_batch=256",
)


def test_planning_70b_on_32_nodes_recommends_a_plan_that_trains(tmp_path: Path) -> None:
    done = _recommend(*PLANS_70B, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("plans for network=llama3_70b (70.6 B parameters, sequence 8192)")
    assert lines[1].startswith("source: data sheets")
    assert "need more than a GPU's memory" in lines[2]
    recommended = [line for line in lines if line.startswith("recommended: ")]
    assert len(recommended) == 1
    command = recommended[0].split(": ", 2)[2]
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "harness"]
    cell = validate(compose_config(words[3:]))  # the command is a cell distbench accepts
    assert cell.world_size == 256 and cell.run.global_batch == 256
    # nothing measured, nothing written but the network's facts
    assert _remembered_only(tmp_path) == [".cache", ".cache/distbench"]
    assert len(list((tmp_path / ".cache").rglob("*.json"))) == 2

    # asked again, the same answer, without importing transformers (nor torch) to read them
    again = _recommend(*PLANS_70B, cwd=tmp_path, python_flags=("-X", "importtime"))
    assert again.returncode == 0, again.stderr[-2000:]

    def answer(text: list[str]) -> list[str]:  # but the search's seconds
        return [line for line in text if not line.startswith("priced ")]

    assert answer(again.stdout.splitlines()) == answer(lines)
    imported = {line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines()}
    assert "transformers" not in imported and "torch" not in imported


def test_one_plan_priced_as_json(tmp_path: Path) -> None:
    done = _recommend(
        "--predict",
        "network=llama3_8b",
        "hardware=h100_node",
        "distribution=mesh",
        "distribution.precision=bf16_mixed",
        "distribution.activation_checkpointing=selective",
        "distribution.micro_batch_size=2",
        "run.global_batch=16",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    answer = json.loads(done.stdout)
    assert answer["plan"] == "fsdp8 mb2 ac=sel2 bf16"
    assert answer["gpus"] == 8 and answer["global_batch"] == 16
    # Llama 3.1 8B as torchtitan ran it needs more than an 80 GB H100 holds
    assert answer["fits"] is False and answer["bound"] == "memory"
    assert answer["memory_per_rank_gib"] > answer["device_memory_gib"]
    assert answer["step_seconds"] > 0 and 0 < answer["mfu"] < 1
    assert set(answer["memory_gib"]) >= {"weights", "optimizer", "activations", "logits"}
    assert _remembered_only(tmp_path) == [".cache", ".cache/distbench"]
