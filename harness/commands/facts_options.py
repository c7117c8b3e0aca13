"""The flags of the commands that gather facts (`python -m harness.analysis`,
`python -m harness.recommend`): how long the sequential probe times (`--probe-batches`,
`--probe-spread`) and whether it times at all (`--no-probe`). The rest of their arguments are
config overrides (`parse_known_args`); the cache they build from these flags checks the
values (`harness.predict.facts.policy.FactsPolicy`)."""

from __future__ import annotations

import argparse

from harness.measure.timing_rule import STEADY_SPREAD


def command_parser(
    prog: str, description: str | None, *, probe_spread: float = STEADY_SPREAD
) -> argparse.ArgumentParser:
    """The options of the commands that measure facts (analysis, recommend); the rest of
    their arguments are config overrides (`parse_known_args`). `probe_spread`: the default of
    `--probe-spread`, the spread of the probe's timed batches at which it stops early."""
    from harness.cli.arguments import ArgumentParser  # a wrong flag: one line, exit status 2

    parser = ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--probe-batches",
        type=int,
        default=5,
        help="timed batches of the sequential probe per batch size, at most (default 5)",
    )
    parser.add_argument(
        "--probe-spread",
        type=float,
        default=probe_spread,
        help="stop timing after 3 batches once their interquartile range is "
        f"within this share of their median (default {probe_spread}; 0: "
        "always --probe-batches)",
    )
    parser.add_argument(
        "--no-probe",
        action="store_true",
        help="time no step here: use step times measured earlier on the "
        "hardware's device (<run.output_dir>/facts/<hardware>.json, "
        "MLflow), as always where this machine lacks that device; a "
        "layer profile the facts file lacks is still taken on this CPU "
        "(each layer's share of a step, said when it runs)",
    )
    return parser
