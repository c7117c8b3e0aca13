"""`python -m harness.describe dataset=X network=Y`: facts about a workload, as JSON.

The performance models need these facts: parameter and gradient sizes (data-parallel
communication), the layer list and each layer's output size (pipeline partitioning and
activation transfers). Shapes are traced on PyTorch's "meta" device, so describing even
ResNet-152 on 512x512 images costs no compute and no memory.
"""

from __future__ import annotations

import argparse
import json
import sys

from harness.cli.arguments import overrides_of, overrides_parser
from harness.cli.errors import command
from harness.commands.compose import compose_or_exit
from harness.measure.network_facts import describe


def parser() -> argparse.ArgumentParser:
    return overrides_parser("python -m harness.describe", __doc__)


@command
def main(argv: list[str] | None = None) -> None:
    config = compose_or_exit(overrides_of(parser(), argv))
    facts = describe(config.network.ref, config.dataset.spec)
    facts["distribution"] = config.distribution.name
    facts["batch_size"] = config.batch_size
    json.dump(facts, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
