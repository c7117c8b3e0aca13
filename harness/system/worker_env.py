"""Where one worker stands in its cell, read from its job's environment, never from flags.

Every worker of a cell learns its rank, local rank, world size and the master's address from
the job environment that submitit describes (its local executor or SLURM). Every socket a
worker listens on (rank 0's rendezvous store, gloo's and NCCL's, Horovod's) is bound to
`listen_address`: loopback when all of the cell's workers share this machine, else the
address its other nodes reach it by. Nothing listens on every interface.

No torch here: the launchers read and hand out these facts (ports, addresses) without it;
the process group itself is `harness.runtime.distributed`.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

# Ports for the process group's rendezvous: a local launcher picks a free one and hands it to
# the workers in this variable; otherwise (SLURM) it is derived from the job id, so all ranks
# of a job agree on one without talking first, and consecutive jobs differ.
MASTER_PORT_ENV = "DISTBENCH_MASTER_PORT"
_PORT_BASE = 29_500
_PORT_RANGE = 10_000
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class WorkerEnvironment:
    """Where this worker stands in its job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = LOOPBACK
    master_port: int = _PORT_BASE
    job_id: str = "local"
    hostnames: tuple[str, ...] = ()  # the job's nodes, in node-rank order

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 records the cell; the other ranks report to it through the process group."""
        return self.rank == 0


def worker_environment() -> WorkerEnvironment:
    """This worker's place in its submitit job, or a single worker outside any job."""
    import submitit

    try:
        job = submitit.JobEnvironment()
    except RuntimeError:  # not started by submitit: a plain single-process run
        return WorkerEnvironment()
    hostnames = list(job.hostnames)
    return WorkerEnvironment(
        rank=job.global_rank,
        local_rank=job.local_rank,
        world_size=job.num_tasks,
        node_rank=job.node,
        num_nodes=job.num_nodes,
        master_addr=_loopback_if_local(hostnames[0]),
        master_port=int(os.environ.get(MASTER_PORT_ENV) or _port_for(job.job_id)),
        job_id=str(job.job_id),
        hostnames=tuple(hostnames),
    )


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def _port_for(job_id: Any) -> int:
    digits = "".join(ch for ch in str(job_id) if ch.isdigit()) or "0"
    return _PORT_BASE + int(digits) % _PORT_RANGE


def _loopback_if_local(hostname: str) -> str:
    return LOOPBACK if hostname in ("localhost", socket.gethostname()) else hostname


def listen_address(env: WorkerEnvironment) -> str:
    """The address this worker's servers listen on: loopback when every worker of the cell is
    on this machine; otherwise this machine's address on its route to another node of the job
    (the address that node reaches it by; on the local SLURM cluster, whose node names are
    127.0.0.1, loopback again)."""
    if env.num_nodes == 1:
        return LOOPBACK
    if len(env.hostnames) < 2:
        raise RuntimeError(f"a {env.num_nodes}-node job without its nodes' names")
    peer = env.hostnames[1 if env.node_rank == 0 else 0]
    address = source_address_towards(peer)
    if address is None:
        raise RuntimeError(f"no route from this node to {peer}, another node of the job")
    return address


def source_address_towards(host: str) -> str | None:
    """This machine's IPv4 address that traffic to `host` leaves from, or None (no route, or a
    name that does not resolve)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # UDP: selects a route, sends nothing
            return str(probe.getsockname()[0])
    except OSError:
        return None


def interface_of(address: str) -> str | None:
    """The name of the local network interface that holds IPv4 `address`, or None."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return name
    return None


def log_to_stderr() -> None:
    """Logging for a worker process that Hydra's job logging does not reach (a local cell's
    workers, the probe's): INFO and up to stderr, which submitit keeps per worker."""
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    )
