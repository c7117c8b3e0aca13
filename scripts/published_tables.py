"""Published multi-GPU training runs (docs/published/*.csv) predicted from data sheets alone.

    .venv/bin/python scripts/published_tables.py [--write]

For every row: the plan, the measured and predicted seconds per step (and tokens per second
per GPU), the error, what bounds the step, and, where the table gives it, the peak memory per
GPU measured and predicted, with Korthikanti et al.'s closed form for one block beside the
counted one. Then per table the mean absolute percentage error (MAPE) and the worst row, and
for every group of plans of one model on one cluster whether the plan predicted fastest was the
measured fastest (and how much throughput the predicted choice loses). `--write` keeps the
overall step-time error in harness/predict/plans/validation.json, which the planner prints as
its source's error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.commands.compose import compose_config  # noqa: E402
from harness.config.schema import DistbenchConfig, validate  # noqa: E402
from harness.distributions.mesh.plan_shape import plan_label  # noqa: E402
from harness.predict.plans.cluster import cluster_of  # noqa: E402
from harness.predict.plans.published import Predicted, compare, predict_row, tables  # noqa: E402
from harness.predict.plans.source import VALIDATION  # noqa: E402


def hardware_config(name: str, nodes: int) -> DistbenchConfig:
    """The hardware config of a row: its data sheet at the row's node count."""
    return validate(
        compose_config(
            [f"hardware={name}", f"hardware.nodes={nodes}", "hydra/launcher=submitit_slurm"]
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write", action="store_true", help="keep the error in validation.json")
    flags = parser.parse_args()
    every: list[Predicted] = []
    for name, (source, rows) in tables().items():
        print(f"\n### {name}\n\n{source}\n")
        print(
            "| row | plan | GPUs | measured s/step | predicted s/step | error | tokens/s/GPU "
            "measured / predicted | MFU predicted | bound | memory GiB measured / predicted | "
            "block activations GiB counted / Korthikanti |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        predicted = []
        for row in rows:
            config = hardware_config(row.hardware, row.nodes)
            one = predict_row(row, cluster_of(config.hardware))
            predicted.append(one)
            measured = row.measured_step
            rate = row.measured_tokens_per_s_per_gpu
            memory = (
                f"{row.measured_memory_gib:.1f} / {one.memory_gib:.1f} ({one.memory_error:+.0%})"
                if row.measured_memory_gib is not None and one.memory_error is not None
                else f"- / {one.memory_gib:.1f}"
            )
            print(
                f"| {row.row} | {plan_label(row.plan)} | {row.plan.world} | "
                f"{measured:.3f} | {one.step_s:.3f} | {one.step_error:+.1%} | "
                f"{rate if rate is not None else '-'} / {one.tokens_per_s_per_gpu:.0f} | "
                f"{one.mfu:.1%} | {one.bound} | {memory} | "
                f"{one.counted_block_gib:.2f} / {one.korthikanti_block_gib:.2f} |"
            )
        errors = [abs(one.step_error) for one in predicted if one.step_error is not None]
        print(
            f"\nstep time: MAPE {statistics.mean(errors):.1%}, worst {max(errors):.1%} "
            f"over {len(errors)} rows"
        )
        for comparison in compare(predicted):
            verdict = (
                "right"
                if comparison.measured_fastest == comparison.predicted_fastest
                else f"predicted {comparison.predicted_fastest}, {comparison.lost:.1%} slower"
            )
            print(
                f"ranking {comparison.group}: measured fastest "
                f"{comparison.measured_fastest}: {verdict}"
            )
        every += predicted
    errors = [abs(one.step_error) for one in every if one.step_error is not None]
    summary = {
        "mape": round(statistics.mean(errors), 4),
        "worst": round(max(errors), 4),
        "rows": len(errors),
        "measured": f"{', '.join(tables())}; scripts/published_tables.py, {datetime.date.today()}",
    }
    print(
        f"\nall tables: step time MAPE {summary['mape']:.1%}, worst "
        f"{summary['worst']:.1%} over {summary['rows']} rows"
    )
    if flags.write:
        VALIDATION.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"kept in {VALIDATION}")


if __name__ == "__main__":
    main()
