"""A worker's process group: `joined_peers` opens the torch.distributed process group on
the worker's place in its cell (`harness.system.worker_env`: rank, world, master, listen address)
and closes it on every exit path, so a failing cell never leaves a group (and its sockets) behind.

Every socket a worker listens on (rank 0's rendezvous store, gloo's and NCCL's, Horovod's) is
bound to `listen_address`: loopback when all of the cell's workers share this machine, else
the address its other nodes reach it by. Nothing listens on every interface.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from harness.config.schema import LinkEmulation
from harness.runtime.links import (
    LOOPBACK_INTERFACE,
    InterfaceBytes,
    LinkError,
    describe,
    interface_bytes,
    shape,
)
from harness.system.worker_env import (  # a worker's place, read without torch by the launchers
    WorkerEnvironment,
    interface_of,
    listen_address,
)

log = logging.getLogger(__name__)

# The variables that name the network interface gloo's and NCCL's sockets bind to (each picks
# the interface of this host's name otherwise, which may face every network).
_INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def default_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


@dataclass(frozen=True)
class NodeLink:
    """The link this worker's node talks to the other nodes through: its interface and
    address, its shaping (emulated nodes: `hardware.link`), and the byte counters of that
    interface and of loopback when the process group opened."""

    interface: str
    address: str
    shaping: str | None
    at_start: dict[str, InterfaceBytes]

    def traffic(self) -> dict[str, float]:
        """Megabytes this node's link and its loopback carried since the process group opened
        (the node's namespace on emulated hardware, else this machine's interfaces)."""
        now = interface_bytes()
        moved = {}
        for name, label in ((self.interface, "link"), (LOOPBACK_INTERFACE, "loopback")):
            if name in now and name in self.at_start:
                delta = now[name].since(self.at_start[name])
                moved[f"{label}_sent_mb"] = delta.sent / 1e6
                moved[f"{label}_received_mb"] = delta.received / 1e6
        return moved


@dataclass(frozen=True)
class Peers:
    """This worker among its peers: a worker inside an open process group (or alone, when
    world_size is 1), and the collectives the harness itself runs with the others."""

    env: WorkerEnvironment
    backend: str | None  # None when there is no process group
    # The link to the other nodes, for a worker whose cell spans nodes (else None).
    link: NodeLink | None = None

    def broadcast_from_main(self, value: Any) -> Any:
        """Rank 0's `value`, on every rank."""
        if self.backend is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        """Wait until every rank gets here (nothing for a single worker)."""
        if self.backend is not None:
            dist.barrier()

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (just [value] for a single worker)."""
        if self.backend is None:
            return [value]
        gathered: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(gathered, value)
        return gathered


@contextlib.contextmanager
def joined_peers(
    env: WorkerEnvironment,
    device: torch.device,
    *,
    backend: str | None,
    timeout_s: float,
    link: LinkEmulation | None = None,
) -> Iterator[Peers]:
    """Open the process group for `env` (if it has more than one worker) and always close it.

    `timeout_s` bounds every collective: a peer that died or hangs turns into an error here
    instead of a wait forever. `link` (hardware.link: nodes emulated on one machine) is
    applied to this node's link by its first worker before the group opens.
    """
    if not env.is_distributed:
        yield Peers(env, backend=None)
        return
    backend = backend or default_backend(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    address = listen_address(env)
    timeout = dt.timedelta(seconds=timeout_s)
    node_link = _node_link(env, address, link)
    # Set while the process group is open: later groups (PipeDream's stages) open sockets of
    # their own.
    with _sockets_bound_to(interface_of(address)):
        dist.init_process_group(
            backend=backend,
            store=_rendezvous_store(env, address, timeout),
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
        )
        log.info(
            "rank %d/%d joined the %s process group at %s:%d (listening on %s)",
            env.rank,
            env.world_size,
            backend,
            env.master_addr,
            env.master_port,
            address,
        )
        try:
            yield Peers(env, backend=backend, link=node_link)
        finally:
            with contextlib.suppress(Exception):  # a broken group must not mask the real error
                dist.destroy_process_group()


def _node_link(env: WorkerEnvironment, address: str, link: LinkEmulation | None) -> NodeLink | None:
    """The link of this worker's node when its cell spans nodes, shaped as `link` says by the
    node's first worker (the others share its interface); None on one machine."""
    if env.num_nodes == 1:
        if link is not None:
            raise LinkError(
                "hardware.link is set for a cell on one node: an emulated link "
                "joins nodes (hardware.nodes >= 2)"
            )
        return None
    interface = interface_of(address) or LOOPBACK_INTERFACE
    shaping = None
    if link is not None:
        shaping = shape(interface, link) if env.local_rank == 0 else describe(interface, link)
    return NodeLink(interface, address, shaping, interface_bytes())


def _rendezvous_store(env: WorkerEnvironment, address: str, timeout: dt.timedelta) -> dist.TCPStore:
    """The store the workers meet through, served by rank 0 on `address` only.

    torch's own tcp:// rendezvous listens on every interface and cannot be told an address,
    but its TCPStore takes over a socket that is already listening: rank 0 binds that socket.
    """
    if not env.is_main:
        return dist.TCPStore(
            env.master_addr, env.master_port, env.world_size, False, timeout=timeout
        )
    listener = socket.create_server((address, env.master_port))  # SO_REUSEADDR, as torch's
    # Rank 0's own client dials the address it listens on, which master_addr need not resolve
    # to on this machine (a host name that /etc/hosts maps to 127.0.1.1, say).
    return dist.TCPStore(
        address,
        env.master_port,
        env.world_size,
        True,
        timeout=timeout,
        master_listen_fd=listener.detach(),
    )  # the store owns it from here


@contextlib.contextmanager
def _sockets_bound_to(interface: str | None) -> Iterator[None]:
    """gloo and NCCL bind their sockets to `interface` within this block, unless the user named
    one in the environment (their network, their choice); the variables are restored after."""
    chosen = {
        name: interface
        for name in _INTERFACE_VARIABLES
        if interface is not None and name not in os.environ
    }
    os.environ.update(chosen)
    try:
        yield
    finally:
        for name in chosen:
            os.environ.pop(name, None)
