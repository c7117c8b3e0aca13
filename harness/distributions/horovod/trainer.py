"""How `horovod` trains (its spec, what it costs and offers: the package's __init__). Imported
by a worker only: predicting and the commands never load a trainer."""

from __future__ import annotations

import os
import threading
from typing import Any

from harness.distributions.base import TrainingContext
from harness.distributions.horovod import horovod_settings
from harness.distributions.loop import BatchLoopTrainer
from harness.runtime.distributed import Peers
from harness.system.worker_env import WorkerEnvironment, interface_of, listen_address

_BYTES_PER_MIB = 1024 * 1024  # Horovod reads its fusion threshold in bytes


def horovod_trainer(context: TrainingContext) -> BatchLoopTrainer:
    try:
        import horovod.torch as hvd
    except ImportError as err:
        raise RuntimeError(
            "distribution.name=horovod needs Horovod, which scripts/setup.sh "
            f"builds (scripts/build_horovod.sh): {err}"
        ) from err

    distribution = horovod_settings(context.config)
    rendezvous = init_horovod(
        context.peers,
        context.device.type,
        fusion_threshold_mb=distribution.fusion_threshold_mb,
        cycle_time_ms=distribution.cycle_time_ms,
    )
    model = context.workload.model.to(context.device)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # every replica starts equal
    trainer = BatchLoopTrainer(
        context,
        model,
        wrap_optimizer=lambda optimizer: hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters()
        ),
        gradient_sync=HorovodGradientSync(),
    )
    # No hvd.broadcast_optimizer_state: a freshly built optimizer has no state, the same on
    # every rank, and Horovod would initialise it by an SGD step with zero gradients, which with
    # weight decay shrinks every weight and seeds the momentum: a step no other model takes
    # (tests/integration/test_trajectories.py compares the trajectories).
    trainer.keep_alive.append(rendezvous)  # rank 0's server must outlive every rank's training
    # Horovod's background thread wakes every cycle_time_ms on the cores the worker shares
    # (CPU workers): left running, it is what the reference kernel after the cell would time
    # (on local_2cpu its cells' kernel read 28-57 ms where every other model's read 26.3-27.7).
    trainer.finishers.append(hvd.shutdown)
    return trainer


class HorovodGradientSync:
    """Horovod starts each gradient's allreduce from a backward hook and waits for them all in
    `optimizer.synchronize()`: the time spent there is the batch's `comm_wait`."""

    def waited_in_backward(self) -> float:
        return 0.0  # backward only starts the allreduces

    def wait(self, optimizer: Any) -> None:
        optimizer.synchronize()

    def step(self, optimizer: Any) -> None:
        with optimizer.skip_synchronize():  # synchronize() already ran, in comm_wait
            optimizer.step()


def init_horovod(
    peers: Peers, device_type: str, *, fusion_threshold_mb: float, cycle_time_ms: float
) -> Any:
    """Start Horovod on this worker without horovodrun; return rank 0's rendezvous server."""
    import horovod.torch as hvd

    env = peers.env
    server, where = None, ("", 0)
    if env.is_main:
        server = RendezvousServer(env, listen_address(env))
        where = server.address
    address, port = peers.broadcast_from_main(where)
    os.environ.update(
        horovod_environment(env, address, port, device_type, fusion_threshold_mb, cycle_time_ms)
    )
    hvd.init()
    return server


class RendezvousServer:
    """The rendezvous server horovodrun would run, serving `env`'s host plan on `address`.

    Horovod's own RendezvousServer.start listens on every interface (it binds ('', port)), so
    its HTTP server is run here directly, bound to one address, on a port the kernel picks.
    """

    def __init__(self, env: WorkerEnvironment, address: str) -> None:
        from horovod.runner.common.util import hosts
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        plan = ",".join(f"{host}:{env.world_size // env.num_nodes}" for host in _host_names(env))
        self._httpd = RendezvousHTTPServer((address, 0), RendezvousHandler, 0)
        self._httpd.init(hosts.get_host_assignments(hosts.parse_hosts(plan), env.world_size))
        # A daemon thread, as in Horovod: it must not keep a finished worker alive.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="horovod-rendezvous", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._thread.join()
        self._httpd.server_close()


def _host_names(env: WorkerEnvironment) -> list[str]:
    """The names the host plan uses, one per node: the job's node names, which resolve to the
    nodes' addresses (Horovod's gloo may look a host name up: a made-up name could resolve to
    another host, or to loopback)."""
    if len(env.hostnames) == env.num_nodes:
        return list(env.hostnames)
    return [f"node{k}" for k in range(env.num_nodes)]


def horovod_environment(
    env: WorkerEnvironment,
    rendezvous_addr: str,
    port: int,
    device_type: str,
    fusion_threshold_mb: float,
    cycle_time_ms: float,
) -> dict[str, str]:
    """What horovodrun would export to this rank (gloo controller)."""
    variables = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_RANK": str(env.rank),
        "HOROVOD_SIZE": str(env.world_size),
        "HOROVOD_LOCAL_RANK": str(env.local_rank),
        "HOROVOD_LOCAL_SIZE": str(env.world_size // env.num_nodes),
        "HOROVOD_CROSS_RANK": str(env.node_rank),
        "HOROVOD_CROSS_SIZE": str(env.num_nodes),
        "HOROVOD_HOSTNAME": _host_names(env)[env.node_rank],
        "HOROVOD_FUSION_THRESHOLD": str(int(fusion_threshold_mb * _BYTES_PER_MIB)),
        "HOROVOD_CYCLE_TIME": str(cycle_time_ms),
    }
    # horovodrun finds the network interface the hosts share; here it is the one that holds
    # this worker's listen address (loopback on one machine).
    interface = interface_of(listen_address(env))
    if interface:
        variables["HOROVOD_GLOO_IFACE"] = interface
    if device_type == "cuda":
        variables.pop("HOROVOD_CPU_OPERATIONS")
    return variables
