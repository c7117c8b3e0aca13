"""The runtime share of a worker's memory: what its process holds besides the model, measured.

A CPU worker's measured peak is its process's peak resident set, and most of that is not the
model: the interpreter, torch's libraries (code pages, and the relocated data of a CUDA build
of torch, which count as anonymous memory), the harness' own imports (Hydra, the trainers),
the data set and its loader, and the pages of the kernels the first training step touches.
None of it depends on the network, so it is measured once per data set, in a fresh process
that does what a worker does before its model exists, then trains a tiny network of the same
kinds of layers for two steps and reports its resident set (the tiny network's own bytes are
negligible). That carries to a network no cell has measured, where a constant fitted to the
cells would carry only the networks it was fitted on.

On CUDA the share is the context (what the driver, cuBLAS and cuDNN take on the device besides
torch's tensors: the device's used memory, `torch.cuda.mem_get_info`, less what torch's
allocator reserved), plus the workspaces cuBLAS and cuBLASLt take from torch's allocator at a
worker's first matrix product and keep for the process (32 MiB each on an H200; what the
allocator still holds once the tiny network, its optimizer and its batch are gone). The CUDA
peak the harness records (`max_memory_allocated`) counts the workspaces and leaves the context
out, so a comparison with it subtracts the context (`RuntimeProbe.reading()`'s `context_mb`,
kept apart in the facts file: `harness.profiles.runtime.RuntimeShare`,
`predict.cell.recorded_peak_mb`), while what is to fit a device counts both.

`python -m harness.worker.runtime_memory '<json>'` is the probe (its argument: the data set's
settings, threads, device); `measure_runtime_mb` runs it, `RuntimeProbe` starts it and reads it
later: it measures memory, not time, so it may run beside work that times nothing (the
recommender describes the network meanwhile), never beside a timing.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.cli.cell_results import failure_reason
from harness.cli.errors import StateError
from harness.config.schema import DistbenchConfig
from harness.config.units import BYTES_PER_MB
from harness.system.processes import ends_with_parent

_PROBE_BATCH = 2


def measure_runtime_mb(config: DistbenchConfig, *, timeout_s: float = 300.0) -> float:
    """The runtime share of a worker of `config` (module docstring), in MB."""
    return RuntimeProbe(config).result(timeout_s=timeout_s)


class RuntimeProbe:
    """The probe of a worker of `config` (module docstring), started; `result` waits for its
    MB. A command ended by SIGTERM or SIGKILL leaves no probe running; `stop` ends it."""

    def __init__(self, config: DistbenchConfig) -> None:
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "harness.worker.runtime_memory",
                    json.dumps(_request(config)),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=ends_with_parent(),
            )
        except OSError as err:
            raise ProbeFailed(f"the runtime memory probe failed: {err}") from err

    def result(self, *, timeout_s: float = 300.0) -> float:
        return self.reading(timeout_s=timeout_s)["runtime_mb"]

    def reading(self, *, timeout_s: float = 300.0) -> dict[str, float]:
        """The probe's whole reading: `runtime_mb`, and on CUDA its parts `context_mb` and
        `workspaces_mb`."""
        try:
            stdout, stderr = self.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            self.stop()
            raise ProbeFailed(f"the runtime memory probe failed: {err}") from err
        if self.process.returncode != 0:
            raise ProbeFailed(
                f"the runtime memory probe failed "
                f"({_ending(self.process.returncode)}): "
                f"{failure_reason(stderr, width=300)}"
            )
        return {
            key: float(value) for key, value in json.loads(stdout.strip().splitlines()[-1]).items()
        }

    def stop(self) -> None:
        self.process.kill()
        self.process.communicate()


def _request(config: DistbenchConfig) -> dict[str, Any]:
    """What the probe process is told of the worker (its command-line argument, as JSON)."""
    dataset = config.dataset
    return {
        "dataset": dataset.name.value,
        "source": dataset.source.value,
        "num_samples": dataset.num_samples,
        "num_workers": dataset.num_workers,
        "cache_dir": str(Path(dataset.cache_dir).expanduser()),
        "root": dataset.root,
        "unique": dataset.synthetic_unique_samples,
        "seed": config.run.seed,
        "batch_size": config.batch_size,
        "threads": config.hardware.cpu_threads,
        "device": config.hardware.device.value,
        "seq_len": dataset.seq_len,
        "vocab_size": dataset.vocab_size,
        "network": None
        if config.network.ref.is_builtin
        else dataclasses.asdict(config.network.ref),
    }


class ProbeFailed(StateError):
    """The probe's process failed: this machine (memory, a library) could not run a worker's
    start; one line with its exit and its last error line (harness.cli.errors.one_door)."""


def _ending(returncode: int) -> str:
    """ "exit status 1", or "killed by SIGKILL" for a negative return code."""
    if returncode < 0:
        import signal

        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


def _resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / BYTES_PER_MB
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / BYTES_PER_MB


def _tiny_language_model(vocab_size: int):  # noqa: ANN202
    """A few dimensions wide: embedding, normalisation, causal attention, a projection, the
    kinds of kernels a transformer's step touches."""
    import torch
    from torch import nn

    class TinyLanguageModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab_size, 8)
            self.norm = nn.RMSNorm(8)
            self.qkv = nn.Linear(8, 24)
            self.head = nn.Linear(8, vocab_size)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.norm(self.embed(tokens))
            q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
            attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.head(nn.functional.silu(x + attended.squeeze(1)))

    return TinyLanguageModel()


def _tiny_network(channels: int, classes: int):  # noqa: ANN202
    """A few channels wide, with every kind of layer the benchmark networks use."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(channels, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU6(),
        nn.Conv2d(8, 8, 1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten(1),
        nn.Dropout(0.2),
        nn.Linear(8, classes),
    )


def _probe(request: dict[str, Any]) -> dict[str, float]:
    """In a fresh process: a worker's imports, its data, two steps of a tiny network."""
    import hydra  # noqa: F401 - what a worker imports: Hydra, torch, the engine
    import submitit  # noqa: F401 - the launcher's worker entry point
    import torch

    import harness.worker.run  # noqa: F401
    from harness.config.schema import OptimizerConfig
    from harness.distributions.registry import specs
    from harness.measure.allocator import keep_freed_memory
    from harness.runtime.workload import build_optimizer
    from workloads.datasets import EpochLoader, build_dataset, dataset_spec
    from workloads.datasets.loader import dataset_length
    from workloads.task import task_loss

    specs()  # every model's module, trainers among them
    keep_freed_memory()  # as a worker allocates
    if request["threads"] is not None:
        torch.set_num_threads(request["threads"])
    cuda = request["device"] == "cuda"
    spec = dataset_spec(request["dataset"]).with_tokens(
        request.get("seq_len"), request.get("vocab_size")
    )
    if request.get("network"):  # its library's imports, nothing allocated (meta device)
        from workloads.networks import NetworkRef, build_network

        fields = {
            key: value for key, value in request["network"].items() if not key.startswith("_")
        }
        with torch.device("meta"):
            build_network(NetworkRef(**fields), spec)
    data = build_dataset(
        spec,
        source=request["source"],
        num_samples=request["num_samples"],
        seed=request["seed"],
        cache_dir=request["cache_dir"],
        root=request["root"],
        synthetic_unique_samples=request["unique"],
    )
    batch = min(request["batch_size"], dataset_length(data))
    loader = EpochLoader(data, batch, seed=request["seed"], num_workers=request["num_workers"])
    device = torch.device("cuda" if cuda else "cpu")
    model = (
        _tiny_language_model(spec.vocab_size)
        if spec.tokens
        else _tiny_network(spec.channels, spec.num_classes)
    ).to(device)
    optimizer = build_optimizer(model.parameters(), OptimizerConfig())
    images, labels = next(iter(loader))
    images, labels = images[:_PROBE_BATCH].to(device), labels[:_PROBE_BATCH].to(device)
    for _ in range(2):
        loss = task_loss(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if cuda:
        del model, optimizer, images, labels, loss  # the tiny network's: not the share
        return _cuda_share()
    return {"runtime_mb": _resident_mb()}


def _cuda_share() -> dict[str, float]:
    """The context, and the math libraries' workspaces in torch's allocator (module
    docstring), with no tensor of the probe's left. A matrix product and a linear layer with
    a bias first: the steadiness check's kernel and a network's classifier, the calls that
    make cuBLAS's and cuBLASLt's workspaces in a worker."""
    import gc

    import torch

    operand = torch.ones(64, 64, device="cuda")
    torch.mm(operand, operand)
    torch.nn.functional.linear(operand, operand, operand[0])
    del operand
    gc.collect()
    torch.cuda.synchronize()
    workspaces = torch.cuda.memory_allocated() / BYTES_PER_MB
    # Used on the device less what torch's allocator reserved: the context (and what any
    # other process holds there: run the probe on an idle device).
    free, total = torch.cuda.mem_get_info()
    context = (total - free - torch.cuda.memory_reserved()) / BYTES_PER_MB
    return {"runtime_mb": context + workspaces, "context_mb": context, "workspaces_mb": workspaces}


if __name__ == "__main__":
    print(json.dumps(_probe(json.loads(sys.argv[1]))))
