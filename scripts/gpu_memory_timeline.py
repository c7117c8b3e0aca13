"""`python scripts/gpu_memory_timeline.py [--networks ...] [--batches ...] [--json FILE]`: where
a training step's CUDA allocator peak comes from, beside the memory model's terms.

The first run on an H100 (docs/benchmarks/2026-11-25-cuda-h100-h200.md, "The CUDA path's first run
on a GPU: one H100 (2026-11-25)") found the memory model off the CUDA allocator's peak in one shape:
the predicted peak grows 16-29 % faster with the batch than the measured one, and its part that does
not grow with the batch is 80-150 MB too low. Two causes were named and not separated: autograd
saving less per sample on CUDA than the CPU measurement of `predict.activations` says, and
cuBLAS/cuDNN workspaces counted in `max_memory_allocated`. This script separates them, for
sequential cells (one worker, the harness's own network, optimizer and data):

- what autograd saves, measured by `predict.activations.measure` on the CPU (what the model
  uses) and on the GPU (the same hooks, the GPU's kernels);
- one steady training step on the GPU, on the allocator's counters, relative to what the
  process held before the cell's workload was built (`held`): allocated before the step
  (weights, optimizer state, the batch; `extra` is the rest), after the forward (+ what the
  forward keeps), the peak of the forward, the peak of the backward (+ gradients and the
  backward's temporaries) and of the optimizer step;
- the model's terms for the same cell (`predict.cell.memory_terms_per_worker`, the CUDA
  context left out as `max_memory_allocated` leaves it out).

With `--owners NETWORK:BATCH ...` it runs real cells instead, in this process, as a worker
runs them (`harness.worker.run.run_cell`, the harness's data, warm-up, epochs and evaluation),
with the CUDA allocator's history on, and names what is alive at the trace's peak: each live
block's size grouped by the innermost frame of this repository's code that allocated it, beside
the cell's recorded peak. That is where a real cell's peak parts from the bare step's.

Needs a CUDA device; runs from a checkout (`harness/conf` linked to `conf/` where distbench is not
installed), as scripts/gpu_check.sh does. Run on one H200:
docs/benchmarks/2026-11-25-cuda-h100-h200.md, "Where the CUDA peak comes from (one H200,
2026-11-28)" (the bare steps) and docs/benchmarks/2026-12-01-cuda-allocator-history.md, "The memory
model against the CUDA allocator's history (one H200, 2026-12-01)" (`--owners`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.config.units import BYTES_PER_MB
from harness.costs import activations
from harness.measure import saved_activations
from harness.predict.cell import memory_terms_per_worker
from harness.predict.facts.cache import FactsCache
from harness.predict.facts.gather import gather
from harness.predict.facts.policy import FactsPolicy
from harness.worker.measurements import WorkerMeasurements

# The saved bytes of a network on a device, measured once whatever the batch (they are affine
# in it: `predict.activations`).
_saved: dict[tuple[str, str], activations.SavedActivations] = {}


def saved_mb(config: Any, batch: int, device: str) -> tuple[float, float, float]:
    """(per sample, constant, total at `batch`) MB autograd saves in one forward, on `device`."""
    key = (config.network.key, device)
    if key not in _saved:
        _saved[key] = saved_activations.measure(
            config.network.ref, config.dataset.spec, device=device
        )
    measured = _saved[key]
    per_sample = sum(layer.mb_per_sample() for layer in measured.layers)
    constant = sum(layer.mb_constant() for layer in measured.layers)
    total = activations.stage_saved_mb(measured.layers, 0, len(measured.layers), batch)
    return per_sample, constant, total


def step_timeline(config: Any) -> dict[str, float]:
    """The allocator's counters (MB) over one steady training step on the GPU."""
    import gc

    import torch

    from harness.measure.steadiness import reference_seconds
    from harness.runtime.workload import build_workload
    from workloads.task import task_loss

    gc.collect()  # what an earlier cell or measurement left unreachable goes first
    torch.cuda.empty_cache()
    # What the process holds on the device already (the CUDA measurement of the saved bytes,
    # an earlier cell): every counter below is relative to it.
    baseline = torch.cuda.memory_allocated()
    workload = build_workload(config)
    device = torch.device("cuda", 0)
    model = workload.model.to(device).train()
    optimizer = workload.make_optimizer(model.parameters())
    batches = iter(workload.loader)

    def mark(marks: dict[str, float], after: str, peak: str | None) -> None:
        """The allocator's counters at the end of a phase (the device synchronised first),
        then a fresh peak for the next phase."""
        torch.cuda.synchronize()
        marks[after] = (torch.cuda.memory_allocated() - baseline) / BYTES_PER_MB
        if peak is not None:
            marks[peak] = (torch.cuda.max_memory_allocated() - baseline) / BYTES_PER_MB
        torch.cuda.reset_peak_memory_stats()

    def step(marks: dict[str, float]) -> None:
        images, labels = next(batches)
        images, labels = images.to(device), labels.to(device)
        mark(marks, "before_step", None)
        loss = task_loss(model(images), labels)
        mark(marks, "after_forward", "forward_peak")
        loss.backward()
        mark(marks, "after_backward", "backward_peak")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mark(marks, "after_step", "optimizer_peak")

    # As a worker measures (harness.worker.run): the peak from before the warm-up's first
    # step (the optimizer's state is created in it), and the reference kernel of the
    # steadiness check between the warm-up and the timed epochs.
    first: dict[str, float] = {}
    step(first)
    for _ in range(2):  # warm-up: the allocator's pools, the optimizer's state
        step({})
    torch.cuda.reset_peak_memory_stats()
    reference_seconds(device)
    kernel_peak = (torch.cuda.max_memory_allocated() - baseline) / BYTES_PER_MB
    torch.cuda.reset_peak_memory_stats()
    marks: dict[str, float] = {}
    step(marks)
    marks["first_step_peak"] = max(
        first["forward_peak"], first["backward_peak"], first["optimizer_peak"]
    )
    marks["reference_kernel_peak"] = kernel_peak
    marks["weights"] = sum(p.numel() * p.element_size() for p in model.parameters()) / BYTES_PER_MB
    marks["optimizer_state"] = (
        sum(
            t.numel() * t.element_size()
            for state in optimizer.state.values()
            for t in state.values()
            if torch.is_tensor(t)
        )
        / BYTES_PER_MB
    )
    marks["held_before"] = baseline / BYTES_PER_MB
    return marks


def measure_cell(network: str, batch: int, hardware: str, facts: FactsCache) -> dict[str, Any]:
    config = validate(
        compose_config(
            [
                f"network={network}",
                "dataset=cifar10",
                f"hardware={hardware}",
                f"distribution.batch_size={batch}",
                f"dataset.num_samples={batch * 5}",
                "tracking.enabled=false",
            ]
        )
    )
    terms = memory_terms_per_worker(config, gather(config, facts, timed=False))[0]
    row: dict[str, Any] = {
        "network": network,
        "batch": batch,
        "model_terms": {k: round(v, 1) for k, v in vars(terms).items()},
        "model_peak_without_runtime": round(terms.total - terms.runtime, 1),
    }
    for device in ("cpu", "cuda"):
        per_sample, constant, total = saved_mb(config, batch, device)
        row[f"saved_{device}"] = {
            "mb_per_sample": round(per_sample, 3),
            "mb_constant": round(constant, 2),
            "mb_total": round(total, 1),
        }
    import torch

    marks = step_timeline(config)
    torch.cuda.empty_cache()  # the step's network and optimizer are gone: the next cell's
    row["timeline"] = {k: round(v, 1) for k, v in marks.items()}
    row["measured_peak"] = round(
        max(marks["forward_peak"], marks["backward_peak"], marks["optimizer_peak"]), 1
    )
    return row


def left_out_of_the_peak(entries: list[dict[str, Any]]) -> set[int]:
    """The entries of blocks the worker leaves out of a cell's peak: those the steadiness
    check's reference kernels (`machine_speed`) allocate and free again (timed before the peak
    is reset and inside `PeakMemory.left_out()` after it). What the kernels leave allocated
    (cuBLAS's workspace, made at their first matrix product) stays in."""
    skipped: set[int] = set()
    open_allocs: dict[int, int] = {}  # address -> index of its alloc under machine_speed
    for index, entry in enumerate(entries):
        if entry["action"] == "alloc" and any(
            frame["name"] == "machine_speed" for frame in entry.get("frames") or []
        ):
            open_allocs[entry["addr"]] = index
        elif entry["action"] == "free_completed" and entry["addr"] in open_allocs:
            skipped.update((open_allocs.pop(entry["addr"]), index))
    return skipped


def peak_owners(entries: list[dict[str, Any]], top: int = 12) -> dict[str, Any]:
    """Replay the allocator's history (`alloc` adds a block, `free_completed` removes it),
    without what the worker leaves out (`left_out_of_the_peak`): the peak of the allocated
    bytes, and the blocks alive at it grouped by who allocated them (the innermost frame of
    this repository's code, and the innermost frame of all)."""
    skipped = left_out_of_the_peak(entries)
    entries = [entry for index, entry in enumerate(entries) if index not in skipped]
    allocated, peak, peak_at = 0, 0, -1
    for index, entry in enumerate(entries):
        if entry["action"] == "alloc":
            allocated += entry["size"]
        elif entry["action"] == "free_completed":
            allocated -= entry["size"]
        if allocated > peak:
            peak, peak_at = allocated, index
    live: dict[int, dict[str, Any]] = {}
    for entry in entries[: peak_at + 1]:
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry
        elif entry["action"] == "free_completed":
            live.pop(entry["addr"], None)
    groups: dict[str, list[int]] = {}
    for entry in live.values():
        groups.setdefault(_owner(entry.get("frames") or []), []).append(entry["size"])
    ranked = sorted(groups.items(), key=lambda item: -sum(item[1]))
    return {
        "peak_mb": round(peak / BYTES_PER_MB, 1),
        "entries": len(entries),
        "peak_at_entry": peak_at,
        "owners": [
            {"mb": round(sum(sizes) / BYTES_PER_MB, 1), "blocks": len(sizes), "where": where}
            for where, sizes in ranked[:top]
        ],
    }


def _owner(frames: list[dict[str, Any]]) -> str:
    """`repo_file:line function <- innermost function`: who allocated a block."""

    def text(frame: dict[str, Any]) -> str:
        return f"{frame['filename'].rsplit('/', 1)[-1]}:{frame['line']} {frame['name']}"

    ours = next(
        (
            frame
            for frame in frames
            if any(part in frame["filename"] for part in ("/harness/", "/workloads/"))
        ),
        None,
    )
    innermost = text(frames[0]) if frames else "?"
    return f"{text(ours)} <- {innermost}" if ours is not None else innermost


def owners_of_a_real_cell(network: str, batch: int, hardware: str) -> dict[str, Any]:
    """A real cell (CIFAR-10, one epoch, as `gpu_check.sh`'s memory_grid runs it) in this
    process with the allocator's history on: its recorded peak and who holds the trace's."""
    import tempfile
    from pathlib import Path

    import torch

    from harness.records.cell import check_cell
    from harness.worker.run import run_cell

    overrides = [
        f"network={network}",
        "dataset=cifar10",
        f"hardware={hardware}",
        f"distribution.batch_size={batch}",
        "dataset.num_samples=1024",
        "run.epochs=1",
        "run.warmup_batches=2",
        "run.progress=false",
        "tracking.enabled=false",
    ]
    gc_collect_everything()
    torch.cuda.memory._record_memory_history(
        enabled="all", context="alloc", stacks="python", max_entries=2_000_000
    )
    with tempfile.TemporaryDirectory() as out:
        overrides.append(f"run.output_dir={out}")
        result = run_cell(check_cell(compose_config(overrides)), output_dir=Path(out) / "cell")
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    entries = [entry for trace in snapshot["device_traces"] for entry in trace]
    row = {
        "network": network,
        "batch": batch,
        "status": result["status"],
        "recorded_peak_mb": result.get("metrics", {}).get("peak_memory_mb"),
        **peak_owners(entries),
    }
    gc_collect_everything()
    return row


def gc_collect_everything() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def print_owners(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(
            f"\n{row['network']} b{row['batch']} ({row['status']}): recorded peak "
            f"{row['recorded_peak_mb']} MB; the trace's peak {row['peak_mb']} MB at entry "
            f"{row['peak_at_entry']} of {row['entries']}; alive there:"
        )
        for owner in row["owners"]:
            print(f"  {owner['mb']:9.1f} MB {owner['blocks']:5d} blocks  {owner['where']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu_memory_timeline.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--networks", nargs="+", default=["resnet18", "resnet50", "vgg16", "mobilenetv2"]
    )
    parser.add_argument("--batches", nargs="+", type=int, default=[32, 128])
    parser.add_argument("--hardware", default="h100_1gpu")
    parser.add_argument("--json", help="also write the rows as JSON here")
    parser.add_argument(
        "--owners",
        nargs="+",
        metavar="NETWORK:BATCH",
        help="run these real cells with the allocator's history and name "
        "what is alive at their peak (instead of the bare steps)",
    )
    args = parser.parse_args(argv)
    if args.owners:
        rows = []
        for cell in args.owners:
            network, batch = cell.split(":")
            rows.append(owners_of_a_real_cell(network, int(batch), args.hardware))
            print_owners(rows[-1:])
        if args.json:
            with open(args.json, "w") as stream:
                json.dump(rows, stream, indent=1)
        return 0
    rows = []
    # one network's facts serve each of its batches
    facts = FactsCache(FactsPolicy(probe=False), WorkerMeasurements())
    print(
        f"{'network':12} {'batch':>5} {'model':>8} {'peak':>8} {'fwd+':>8} {'bwd peak+':>9} "
        f"{'model act+bwd':>13} {'saved cpu':>9} {'saved gpu':>9} {'/sample cpu':>11} "
        f"{'/sample gpu':>11} {'held':>6} {'extra':>6} {'1st step':>8} {'kernel':>6}",
        flush=True,
    )
    for network in args.networks:
        for batch in args.batches:
            try:
                row = measure_cell(network, batch, args.hardware, facts)
            except Exception as err:  # noqa: BLE001 - a row of the report, the rest goes on
                print(f"{network:12} {batch:5} failed: {type(err).__name__}: {err}", flush=True)
                continue
            rows.append(row)
            t, m = row["timeline"], row["model_terms"]
            print(
                f"{network:12} {batch:5} {row['model_peak_without_runtime']:8.0f} "
                f"{row['measured_peak']:8.0f} {t['after_forward'] - t['before_step']:8.0f} "
                f"{t['backward_peak'] - t['after_forward']:9.0f} "
                f"{m['activations'] + m['backward']:13.0f} "
                f"{row['saved_cpu']['mb_total']:9.0f} {row['saved_cuda']['mb_total']:9.0f} "
                f"{row['saved_cpu']['mb_per_sample']:11.3f} "
                f"{row['saved_cuda']['mb_per_sample']:11.3f} {t['held_before']:6.0f} "
                f"{t['before_step'] - t['weights'] - t['optimizer_state']:6.0f} "
                f"{t['first_step_peak']:8.0f} {t['reference_kernel_peak']:6.0f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(rows, stream, indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
