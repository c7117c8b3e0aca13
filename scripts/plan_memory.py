"""Each recorded plan cell's measured per-rank peak memory beside what the existing memory model
says of it without plan terms (`distribution=mesh`'s `memory_per_worker`: FSDP2's shards of the
weights, gradients and optimizer state over `dp_shard`, the whole network's activations at one
micro-batch, nothing for tensor parallelism, pipeline stages, checkpointing or precision): the
gap a plan-aware memory model must close.

    .venv/bin/python scripts/plan_memory.py outputs/sweeps/calibrate_plans

It reads every result.json below the folder, gathers the network's facts on this machine (its
sizes traced, what autograd saves and a worker's runtime memory measured, kept under
`--facts`), and prints one Markdown row per cell.
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
    print("| plan | network | peak per rank (MB) | model without plan terms (MB) | error |")
    print("|---|---|---|---|---|")
    for path in sorted(args.folder.glob("**/result.json")):
        result = json.loads(path.read_text())
        config = config_from_record(result["config"])
        if not isinstance(config.distribution, MeshConfig) or result["status"] != "ok":
            continue
        predicted = max(memory_per_worker_mb(config, gather(config, cache, timed=False)))
        metrics = result["metrics"]
        peaks = [value for key, value in metrics.items() if key.startswith("peak_memory_mb_rank")]
        plan, network = result["run_name"].rsplit(" ", 1)
        error = 100 * (predicted - max(peaks)) / max(peaks)
        print(
            f"| {plan} | {network} | {min(peaks):.0f}-{max(peaks):.0f} | {predicted:.0f} | "
            f"{error:+.0f} % |"
        )


if __name__ == "__main__":
    main()
