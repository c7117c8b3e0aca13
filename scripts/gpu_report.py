"""`python scripts/gpu_report.py DIR [--json FILE]`: the cells measured under DIR (every
result.json below it), with the memory model's prediction beside each worker's measured peak.

What a cell measured is compared with the part of the prediction that its measurement counts. On
CUDA the harness records the CUDA allocator's peak (`torch.cuda.max_memory_allocated`), which leaves
the CUDA context out: the prediction then is every term less the context (the part of the runtime
share, `predict.runtime`, outside torch's allocator, printed in its own column; the math libraries'
workspaces, the share's other part, are in the allocator's peak). On a CPU the recorded peak is the
process's resident set, and the whole prediction counts. `scripts/gpu_check.sh` runs this after its
cells (docs/benchmarks/2026-11-25-cuda-h100-h200.md, "CUDA on one H100, then on one H200 (2026-11-25
to 2026-11-28)"; docs/benchmarks/2026-12-01-cuda-allocator-history.md, "The memory model against the
CUDA allocator's history (one H200, 2026-12-01)").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from a checkout: the harness beside it

from harness.distributions.registry import config_from_record  # noqa: E402
from harness.predict.cell import memory_terms_per_worker  # noqa: E402
from harness.predict.facts.cache import FactsCache  # noqa: E402
from harness.predict.facts.gather import gather  # noqa: E402
from harness.predict.facts.policy import FactsPolicy  # noqa: E402
from harness.worker.measurements import WorkerMeasurements  # noqa: E402


def worker_peaks(result: dict[str, Any]) -> list[float]:
    """Each worker's measured peak MB, rank order (one value for a one-worker cell)."""
    metrics = result["metrics"]
    ranks = sorted(
        (int(key.rsplit("rank", 1)[1]), value)
        for key, value in metrics.items()
        if key.startswith("peak_memory_mb_rank")
    )
    return [value for _, value in ranks] or [metrics["peak_memory_mb"]]


def compare_memory(result: dict[str, Any], cache: FactsCache) -> dict[str, Any]:
    """Predicted against measured peak per worker; the error is (predicted - measured) /
    measured. A prediction that cannot be made is reported with its reason."""
    config = config_from_record(result["config"])
    try:
        facts = gather(config, cache, timed=False)
        terms = memory_terms_per_worker(config, facts)
    except Exception as err:  # noqa: BLE001 - a report row, not a crash of the report
        return {"prediction_error": f"{type(err).__name__}: {err}"}
    # the part of the runtime share the recorded peak leaves out (predict.cell.recorded_peak_mb)
    predicted = [term.total - facts.context_mb for term in terms]
    measured = worker_peaks(result)
    return {
        "runtime_mb": terms[0].runtime,
        "context_mb": facts.context_mb,
        "predicted_mb": predicted,
        "measured_mb": measured,
        "error": [(p - m) / m for p, m in zip(predicted, measured)],
        "terms": {name: value for name, value in vars(terms[0]).items()},
    }


def summarise(result: dict[str, Any], cache: FactsCache) -> dict[str, Any]:
    """One cell's row: its name, status, seconds per epoch (median, min, max over every
    repeat's epochs), throughput and memory."""
    row: dict[str, Any] = {
        "cell": result["run_name"],
        "status": result["status"],
        "error_text": (result.get("error") or "")[:300],
        "device": result["environment"].get("device_name"),
        "memory_kind": result["environment"].get("memory_kind"),
    }
    epochs = result.get("epoch_seconds") or []
    if result["status"] == "ok" and epochs:
        metrics = result["metrics"]
        row.update(
            seconds_per_epoch_median=statistics.median(epochs),
            seconds_per_epoch_min=min(epochs),
            seconds_per_epoch_max=max(epochs),
            epochs=len(epochs),
            repeats=len(result.get("repeats") or [1]),
            samples_per_second=metrics.get("images_per_second"),
            tokens_per_second=metrics.get("tokens_per_second"),
            **compare_memory(result, cache),
        )
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'cell':44} {'status':7} {'s/epoch med':>11} {'[min, max]':>19} "
        f"{'samples/s':>10} {'peak MB':>9} {'pred MB':>9} {'error':>8} {'ctx MB':>7}"
    ]
    for row in rows:
        if "seconds_per_epoch_median" not in row:
            lines.append(f"{row['cell']:44} {row['status']:7} {row['error_text'][:120]}")
            continue
        spread = f"[{row['seconds_per_epoch_min']:.3f}, {row['seconds_per_epoch_max']:.3f}]"
        measured = predicted = error = runtime = "-"
        if "measured_mb" in row:
            measured = "/".join(f"{m:.0f}" for m in row["measured_mb"])
            predicted = "/".join(f"{p:.0f}" for p in row["predicted_mb"])
            error = "/".join(f"{e:+.0%}" for e in row["error"])
            runtime = f"{row['context_mb']:.0f}"
        lines.append(
            f"{row['cell']:44} {row['status']:7} {row['seconds_per_epoch_median']:11.4f} "
            f"{spread:>19} {row['samples_per_second'] or 0:10.0f} {measured:>9} "
            f"{predicted:>9} {error:>8} {runtime:>7}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_report.py", description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path, help="where the cells' result.json files are")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    paths = sorted(args.directory.rglob("result.json"), key=lambda p: p.stat().st_mtime)
    # memory facts only: no step is timed
    cache = FactsCache(FactsPolicy(probe=False), WorkerMeasurements())
    rows = [summarise(json.loads(path.read_text()), cache) for path in paths]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
