"""A node's network link as a worker sees it: the interface it talks to other nodes through,
the bytes that crossed it and loopback, and, on emulated nodes, the shaping it applies.

On hardware whose nodes are emulated on one machine (`hardware.link`, launchers.emulated), every
node is a network namespace whose only interfaces are loopback and the link to the others; the
link's rate is a property of the cell, like its cores, so the first worker of each node shapes
the link where traffic leaves the node (tc's token-bucket filter on the interface's egress)
before the process group opens. Every byte between two nodes then crosses one shaped link.

Counters come from /proc/net/dev, which shows the network namespace of the process that reads it:
on an emulated node, that node's own interfaces.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.config.schema import LinkEmulation

PROC_NET_DEV = Path("/proc/net/dev")
LOOPBACK_INTERFACE = "lo"


class LinkError(RuntimeError):
    """The link cannot be shaped or read as the hardware config says."""


@dataclass(frozen=True)
class InterfaceBytes:
    """Bytes an interface received and sent since it came up."""

    received: int
    sent: int

    def since(self, earlier: InterfaceBytes) -> InterfaceBytes:
        return InterfaceBytes(self.received - earlier.received, self.sent - earlier.sent)


def interface_bytes(proc_net_dev: Path = PROC_NET_DEV) -> dict[str, InterfaceBytes]:
    """Every interface of this process's network namespace and its byte counters."""
    counters = {}
    for line in proc_net_dev.read_text().splitlines()[2:]:  # two header lines
        name, _, numbers = line.partition(":")
        fields = numbers.split()
        if len(fields) >= 9:
            counters[name.strip()] = InterfaceBytes(received=int(fields[0]), sent=int(fields[8]))
    return counters


def shaping_of(interface: str) -> dict[str, object] | None:
    """The root qdisc of `interface` as `tc -j` reports it (kind and options), or None where
    tc is missing or says nothing."""
    if shutil.which("tc") is None:
        return None
    shown = subprocess.run(
        ["tc", "-j", "qdisc", "show", "dev", interface, "root"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if shown.returncode != 0 or not shown.stdout.strip():
        return None
    qdiscs = json.loads(shown.stdout)
    return qdiscs[0] if qdiscs else None


def shape(interface: str, link: LinkEmulation) -> str:
    """Shape the egress of `interface` as `link` says (idempotent: `tc qdisc replace`); the
    shaping as a line for the record."""
    if interface == LOOPBACK_INTERFACE:
        raise LinkError(
            "hardware.link is set, but this worker talks to the other nodes over "
            "loopback: it is not on an emulated node (python -m launchers.emulated "
            "up hardware=H brings them up; docs/launchers.md)"
        )
    if shutil.which("tc") is None:
        raise LinkError("hardware.link is set, but `tc` (iproute2) is not installed here")
    command = ["tc", "qdisc", "replace", "dev", interface, "root", *link.tbf_arguments()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise LinkError(f"{' '.join(command)} failed: {done.stderr.strip() or done.returncode}")
    return describe(interface, link)


def describe(interface: str, link: LinkEmulation) -> str:
    """'tbf rate 200mbit burst 256kb latency 50ms on eth0'."""
    return f"{' '.join(link.tbf_arguments())} on {interface}"
