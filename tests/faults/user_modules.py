"""Network factories that misbehave while distbench checks them (`network=module
network.target=tests.faults.user_modules:<name>`): the bad-input table's rows for a user's code
(workloads.networks.user_code)."""

from __future__ import annotations

import sys

from torch import nn


def exits() -> nn.Module:
    sys.exit(0)


def floods_then_fails() -> nn.Module:
    for line in range(20_000):  # about 400 kB
        print(f"a line the factory prints while it is checked, {line}")
    raise ValueError("no model today")
