"""`horovod`: data parallelism with Horovod's ring-allreduce and Tensor Fusion.

Horovod's ranks are normally started by `horovodrun`; here they are the cell's workers that
submitit (locally or on SLURM) already started, so the harness does what `horovodrun` would:
rank 0 runs Horovod's rendezvous server, every rank gets the HOROVOD_* environment that names
its place, then `hvd.init()`. The rendezvous port travels through the torch.distributed process
group the cell already has. Tensor Fusion is configured from `distribution.fusion_threshold_mb`
(the `th` of Eq. 5.1) and `distribution.cycle_time_ms`.
"""

from __future__ import annotations

import os
from typing import Any

from harness.distributions.base import TrainingContext
from harness.distributions.loop import BatchLoopTrainer
from launchers.distributed import WorkerEnvironment, WorkerSession

_BYTES_PER_MIB = 1024 * 1024  # Horovod reads its fusion threshold in bytes


def horovod_trainer(context: TrainingContext) -> BatchLoopTrainer:
    try:
        import horovod.torch as hvd
    except ImportError as err:
        raise RuntimeError("distribution.name=horovod needs Horovod, which scripts/setup.sh "
                           f"builds (scripts/build_horovod.sh): {err}") from err

    distribution = context.config.distribution
    rendezvous = init_horovod(context.session, context.device.type,
                              fusion_threshold_mb=distribution.fusion_threshold_mb,
                              cycle_time_ms=distribution.cycle_time_ms)
    model = context.workload.model.to(context.device)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # every replica starts equal
    trainer = BatchLoopTrainer(
        context, model,
        wrap_optimizer=lambda optimizer: hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters()),
        gradient_sync=HorovodGradientSync())
    hvd.broadcast_optimizer_state(trainer.optimizer, root_rank=0)
    trainer.keep_alive.append(rendezvous)  # rank 0's server must outlive every rank's training
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


def init_horovod(session: WorkerSession, device_type: str, *, fusion_threshold_mb: float,
                 cycle_time_ms: float) -> Any:
    """Start Horovod on this worker without horovodrun; return rank 0's rendezvous server."""
    import horovod.torch as hvd

    env = session.env
    server, port = None, 0
    if env.is_main:
        server, port = _start_rendezvous(env)
    port = session.broadcast_from_main(port)
    os.environ.update(horovod_environment(env, port, device_type, fusion_threshold_mb,
                                          cycle_time_ms))
    hvd.init()
    return server


def _start_rendezvous(env: WorkerEnvironment) -> tuple[Any, int]:
    from horovod.runner.common.util import hosts
    from horovod.runner.http.http_server import RendezvousServer

    plan = ",".join(f"{host}:{env.world_size // env.num_nodes}" for host in _host_names(env))
    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(hosts.get_host_assignments(hosts.parse_hosts(plan), env.world_size))
    return server, port


def _host_names(env: WorkerEnvironment) -> list[str]:
    """The names the host plan uses, one per node (node<k>: they only need to be distinct)."""
    return [f"node{k}" for k in range(env.num_nodes)]


def horovod_environment(env: WorkerEnvironment, port: int, device_type: str,
                        fusion_threshold_mb: float, cycle_time_ms: float) -> dict[str, str]:
    """What horovodrun would export to this rank (gloo controller)."""
    variables = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": env.master_addr,
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
    # horovodrun finds the network interface the hosts share; here it is the one this worker
    # reaches the master through (loopback on one machine).
    interface = "lo" if env.num_nodes == 1 else interface_towards(env.master_addr)
    if interface:
        variables["HOROVOD_GLOO_IFACE"] = interface
    if device_type == "cuda":
        variables.pop("HOROVOD_CPU_OPERATIONS")
    return variables


def interface_towards(address: str) -> str | None:
    """The name of the local network interface that traffic to `address` leaves by, or None
    (then gloo picks the interface of this host's name)."""
    import socket

    import psutil

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))  # UDP: selects a route, sends nothing
            local_ip = probe.getsockname()[0]
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local_ip for a in addresses):
            return name
    return None
