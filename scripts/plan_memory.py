"""Each recorded plan cell's measured peak memory per rank beside what the plan's memory model
predicts for that rank (`harness.distributions.mesh.rank_memory`), and, for a cell run under a
memory limit (`hardware.device_memory_gb`), whether the model said it would fit.

    .venv/bin/python scripts/plan_memory.py outputs/sweeps/calibrate_plans

It reads every result.json below the folder, gathers the network's facts on this machine (its
sizes traced, what autograd saves and a worker's runtime memory measured, kept under
`--facts`), and prints one Markdown row per cell, then the mean absolute percentage error over
every rank of every cell that ended `ok`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.distributions.mesh import MeshConfig
from harness.predict.cell import memory_per_worker_mb
from harness.predict.facts.cache import cache_for
from harness.predict.facts.gather import gather
from harness.records.recorded_runs import config_from_record
from harness.worker.measurements import WorkerMeasurements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a sweep's folder of plan cells")
    parser.add_argument("--facts", type=Path, default=Path("outputs/facts"), help="facts kept")
    args = parser.parse_args()
    cache = cache_for(5, measurements=WorkerMeasurements(), facts_root=args.facts)
    print(
        "| plan | network | status | measured peak per rank (MB) | predicted per rank (MB) | "
        "error per rank | limit (MB): predicted fit |"
    )
    print("|---|---|---|---|---|---|---|")
    errors: list[float] = []
    for path in sorted(args.folder.glob("**/result.json")):
        result = json.loads(path.read_text())
        config = config_from_record(result["config"])
        if not isinstance(config.distribution, MeshConfig):
            continue
        predicted = memory_per_worker_mb(config, gather(config, cache, timed=False))
        metrics = result.get("metrics") or {}
        peaks = [metrics.get(f"peak_memory_mb_rank{rank}") for rank in range(config.world_size)]
        measured = [peak for peak in peaks if peak is not None]
        rank_errors = [
            100 * (guess - peak) / peak for guess, peak in zip(predicted, peaks) if peak is not None
        ]
        if result["status"] == "ok":
            errors += [abs(error) for error in rank_errors]
        limit = config.hardware.device_memory_gb
        verdict = "-"
        if limit is not None:
            fits = max(predicted) <= limit * 1000
            verdict = f"{limit * 1000:.0f}: {'fits' if fits else 'does not fit'}"
        shown = (
            f"{min(measured):.0f}-{max(measured):.0f}" if measured else "-",
            f"{min(predicted):.0f}-{max(predicted):.0f}",
            f"{min(rank_errors):+.0f} to {max(rank_errors):+.0f} %" if rank_errors else "-",
        )
        print(
            f"| {result['run_name']} | {config.network.label} | {result['status']} | "
            f"{shown[0]} | {shown[1]} | {shown[2]} | {verdict} |"
        )
    if errors:
        print(
            f"\nper-rank MAPE {sum(errors) / len(errors):.1f} %, worst {max(errors):.1f} % "
            f"over {len(errors)} ranks of the cells that ended ok"
        )


if __name__ == "__main__":
    main()
