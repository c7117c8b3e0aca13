"""A user's own network, from a package distbench has never seen, trained by every
distribution model as a user runs it (`python -m harness -m distribution=...`, real gloo
workers, a real MLflow store, MLPerf's compliance checker), on token data: the network and the
task are open axes of the grid."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from harness.distributions.registry import specs
from tests.helpers import REPO_ROOT
from tests.in_process import in_process_command

# A small causal language model written as users write them: not an nn.Sequential, no
# distbench imports; `dataset` (the DatasetSpec) sizes its vocabulary and positions.
USER_MODELS = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(shape[0], shape[1], 3, self.heads, -1) \\
            .permute(2, 0, 3, 1, 4).unbind(0)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(shape))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, dataset, dim: int = 32, depth: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(dataset.vocab_size, dim)
        self.position = nn.Parameter(torch.zeros(dataset.seq_len, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, dataset.vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build(dataset, depth: int = 2) -> nn.Module:
    return TinyLM(dataset, depth=depth)
"""

SEQ_LEN = 32
# The user's language model (USER_MODELS, written as the package userlm), three blocks, on
# token data.
USER_NETWORK = [
    "network=module",
    "network.target=userlm.models:build",
    "+network.kwargs.depth=3",
    "network.blocks=blocks",
    "dataset=tokens",
    f"dataset.seq_len={SEQ_LEN}",
]
MODELS = sorted(specs())


@pytest.fixture(scope="module")
def user_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """result.json of each distribution model's cell of one sweep over the user's network,
    by model; the package lives in a temporary directory on the workers' PYTHONPATH."""
    root = tmp_path_factory.mktemp("open-networks")
    package = root / "packages" / "userlm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(textwrap.dedent(USER_MODELS))
    output = root / "outputs"
    # The sweep's launcher in this process (tests.in_process.in_process_command: its real
    # entry point, exit status and output), its cells' workers processes of their own, as a
    # user's: what is tested is what they train and record, not the launcher's interpreter.
    # The package on the workers' PYTHONPATH (they inherit this process's environment) and on
    # this process's path (where PYTHONPATH put it for a launcher of its own); both put back.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONUNBUFFERED", "1")
        patch.setenv("PYTHONPATH", os.pathsep.join([str(root / "packages"), str(REPO_ROOT)]))
        patch.syspath_prepend(str(root / "packages"))
        done = in_process_command(
            "harness",
            [
                "-m",
                f"distribution={','.join(MODELS)}",
                *USER_NETWORK,
                "dataset.num_samples=64",
                "distribution.batch_size=8",
                "hardware=local_2cpu",
                "run.epochs=1",
                "run.warmup_batches=1",
                "run.progress=false",
                "optimizer.name=adamw",
                "optimizer.lr=0.003",
                f"run.output_dir={output}",
            ],
            cwd=root,
            timeout=900,
        )
    assert done.returncode == 0, done.stderr[-4000:]
    results = [
        json.loads(path.read_text()) for path in (output / "sweeps").glob("*/*/*/result.json")
    ]
    return {result["config"]["distribution"]["name"]: result for result in results}


def test_every_distribution_model_trains_the_users_network(user_sweep: dict[str, dict]) -> None:
    assert sorted(user_sweep) == MODELS
    for model, result in user_sweep.items():
        assert result["status"] == "ok", f"{model}: {result['error']}"
        assert result["run_name"].endswith(f"build-tokens-t{SEQ_LEN}-v256"), result["run_name"]
        metrics = result["metrics"]
        # tokens/s beside samples/s: a sample is SEQ_LEN next-token predictions
        assert metrics["tokens_per_second"] == pytest.approx(metrics["images_per_second"] * SEQ_LEN)
        assert result["mlflow_run_id"], f"{model}: not recorded in MLflow"
        assert 0 <= result["eval_accuracy"][-1] <= 1


def test_the_pipelines_split_it_at_its_blocks(
    user_sweep: dict[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Embedding and positions, 3 blocks, norm and head: a layer list of 5, each block one
    layer, so GPipe's and PipeDream's stages hold whole blocks."""
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from workloads.networks import layer_count

    monkeypatch.syspath_prepend(
        str(Path(user_sweep["sequential"]["output_dir"]).parents[4] / "packages")
    )
    config = validate(
        compose_config(
            [
                *USER_NETWORK,
            ]
        )
    )
    assert layer_count(config.network.ref, config.dataset.spec) == 5


def test_gpipe_trains_the_same_losses_as_sequential(user_sweep: dict[str, dict]) -> None:
    """Same batch (8), same data order, same initial weights, no dropout: GPipe's 4
    micro-batches average to the batch's loss, so the trajectory is sequential's (float
    summation order aside)."""
    sequential, gpipe = (user_sweep[model]["train_loss"] for model in ("sequential", "gpipe"))
    assert gpipe == pytest.approx(sequential, rel=1e-4)


def test_every_cells_mlperf_log_passes_the_checker(user_sweep: dict[str, dict]) -> None:
    from harness.records.compliance import check

    for model, result in user_sweep.items():
        verdict = check(Path(result["output_dir"]) / "mllog.txt")
        assert verdict.ok, f"{model}: {verdict.problems}"
        log = (Path(result["output_dir"]) / "mllog.txt").read_text()
        assert f'"key": "max_sequence_length", "value": {SEQ_LEN}' in log
        assert '"key": "opt_adamw_beta_2"' in log


def test_the_memory_model_predicts_a_transformer_cells_peak(tmp_path: Path) -> None:
    """A Llama-style decoder with AdamW, whose weights, two moment buffers, attention and
    4,096-wide logits are a third of the peak: predicted from the meta-device facts and the
    saved activations within 10 % of the peak the cell measured (-2.9 % when written)."""
    from harness.distributions.registry import config_from_record
    from harness.predict.cell import memory_per_worker_mb
    from harness.predict.facts.cache import cache_for
    from harness.predict.facts.gather import gather
    from harness.worker.measurements import WorkerMeasurements
    from tests.helpers import run_module

    output = tmp_path / "outputs"
    done = run_module(
        "harness",
        [
            "network=llama_tiny",
            "dataset=tokens",
            "dataset.seq_len=128",
            "dataset.vocab_size=4096",
            "distribution.batch_size=16",
            "dataset.num_samples=32",
            "run.epochs=1",
            "run.warmup_batches=1",
            "optimizer.name=adamw",
            "run.progress=false",
            "tracking.enabled=false",
            f"run.output_dir={output}",
        ],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (output / "runs").glob("*/result.json")
    result = json.loads(path.read_text())
    config = config_from_record(result["config"])
    cache = cache_for(
        5, measurements=WorkerMeasurements(), probe=False, facts_root=tmp_path / "facts"
    )
    facts = gather(config, cache, timed=False)
    predicted, measured = (
        max(memory_per_worker_mb(config, facts)),
        result["metrics"]["peak_memory_mb"],
    )
    assert predicted == pytest.approx(measured, rel=0.10), (predicted, measured)


def test_planning_an_8b_model_on_h100s_answers_the_memory_question(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From this CPU-only machine: Llama 3 8B with AdamW (about 122 GB of weights, gradients
    and moments in float32) does not fit a data-parallel worker of an 80 GB H100, sharded or
    pipelined it does; with no step time measured on the GPU yet, the options are not ranked
    by time and the output names the command that measures one there. (The recommender in
    this process: its answer is the point, not its process.)"""
    from harness.recommend import main
    from tests.in_process import command_here

    monkeypatch.chdir(tmp_path)
    done = command_here(
        main,
        [
            "dataset=tokens",
            "network=llama3_8b",
            "dataset.seq_len=2048",
            "optimizer.name=adamw",
            "hardware=h100_node",
            "distribution.batch_size=1",
            f"run.output_dir={tmp_path}",
            "--json",
        ],
        capfd,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    fits = {option["label"]: option["fits_memory"] for option in answer["options"]}
    assert not any(fit for label, fit in fits.items() if label.startswith(("ddp", "horovod")))
    assert fits["sequential"] is False
    assert fits["fsdp x8"] is True and fits["gpipe x8 mb1"] is True
    assert answer["recommended"] is None  # nothing ranks without a step time
    # no sequential cell of it fits one H100 (its weights alone): the output says where a step
    # time can come from instead of a command the weight check would refuse
    missing = answer["missing_step_time"]
    assert "python -m harness" not in missing
    assert (
        "no sequential cell can measure it on hardware=h100_node: its weights, gradients and "
        "optimizer state alone need 128.5 GB on one worker, more than "
        "hardware.device_memory_gb=80"
    ) in missing


def test_a_fit_holds_out_a_whole_family_only_when_there_are_two() -> None:
    """Cells of token data are language models, the others image networks; with one family
    there is nothing to hold out (no family errors), with both every cell gets one."""
    from harness.analysis.fit import CellPrediction, family_held_out
    from harness.analysis.grid import IMAGE_NETWORKS, LANGUAGE_MODELS, MeasuredCell
    from harness.commands.compose import compose_config
    from harness.config.schema import validate

    def cell(*overrides: str) -> MeasuredCell:
        return MeasuredCell(
            run_id="-".join(overrides),
            run_name="cell",
            config=validate(compose_config(list(overrides))),
            seconds_per_epoch=1.0,
            peak_memory_mb=1.0,
        )

    image, language = cell("network=resnet18"), cell("network=llama_tiny", "dataset=tokens")
    assert (image.family, language.family) == (IMAGE_NETWORKS, LANGUAGE_MODELS)
    assert family_held_out([CellPrediction(image, None, 1.0)]) == []  # type: ignore[arg-type]
