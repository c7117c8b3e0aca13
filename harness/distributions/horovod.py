"""`horovod`: data parallelism with Horovod's ring-allreduce and Tensor Fusion.

Horovod's ranks are normally started by `horovodrun`; here they are the cell's workers that
submitit (locally or on SLURM) already started, so the harness does what `horovodrun` would:
rank 0 runs Horovod's rendezvous server, every rank gets the HOROVOD_* environment that names
its place, then `hvd.init()`. The rendezvous address and port travel through the
torch.distributed process group the cell already has. The server and Horovod's gloo sockets
listen on the worker's `listen_address` (loopback on one machine), never on every interface.
Tensor Fusion is configured from `distribution.fusion_threshold_mb` (the `th` of Eq. 5.1) and
`distribution.cycle_time_ms`.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from harness.accepts import number
from harness.config import MAX_BUFFER_MB, DistbenchConfig, DistributionConfig
from harness.distributed import (
    WorkerEnvironment,
    WorkerSession,
    interface_of,
    listen_address,
)
from harness.distributions.base import TrainingContext
from harness.distributions.loop import BatchLoopTrainer
from harness.distributions.spec import DistributionSpec, at_every_count, workers_label
from harness.hardware_profile import HardwareProfile
from harness.predict import memory
from harness.predict.terms import (
    BACKWARD_SHARE,
    CellFacts,
    EpochTerms,
    data_parallel_terms,
    replica_memory,
)

_BYTES_PER_MIB = 1024 * 1024  # Horovod reads its fusion threshold in bytes
MAX_CYCLE_TIME_MS = 1e6  # 1,000 s between fusion cycles: a cell would never finish


@dataclass
class HorovodConfig(DistributionConfig):
    """Horovod's Tensor Fusion settings."""

    data_parallel = True
    name: str = "horovod"
    # Fusion threshold `th` in MB (Eq. 5.1; Horovod's default 64): gradients are fused into
    # buffers of up to this many MB (0: no fusion).
    fusion_threshold_mb: float = field(default=64.0, metadata=number(0, MAX_BUFFER_MB, "MB"))
    # How often, in ms, Horovod's background thread fuses and sends what is ready.
    cycle_time_ms: float = field(default=1.0,
                                 metadata=number(0, MAX_CYCLE_TIME_MS, "ms", low_open=True))


def horovod_settings(config: DistbenchConfig) -> HorovodConfig:
    assert isinstance(config.distribution, HorovodConfig), config.distribution
    return config.distribution


def horovod_trainer(context: TrainingContext) -> BatchLoopTrainer:
    try:
        import horovod.torch as hvd
    except ImportError as err:
        raise RuntimeError("distribution.name=horovod needs Horovod, which scripts/setup.sh "
                           f"builds (scripts/build_horovod.sh): {err}") from err

    distribution = horovod_settings(context.config)
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
    # No hvd.broadcast_optimizer_state: a freshly built optimizer has no state, the same on
    # every rank, and Horovod would initialise it by an SGD step with zero gradients, which with
    # weight decay shrinks every weight and seeds the momentum: a step no other model takes
    # (tests/test_trajectories.py compares the trajectories).
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
    server, where = None, ("", 0)
    if env.is_main:
        server = RendezvousServer(env, listen_address(env))
        where = server.address
    address, port = session.broadcast_from_main(where)
    os.environ.update(horovod_environment(env, address, port, device_type,
                                          fusion_threshold_mb, cycle_time_ms))
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
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="horovod-rendezvous", daemon=True)
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


def horovod_environment(env: WorkerEnvironment, rendezvous_addr: str, port: int,
                        device_type: str, fusion_threshold_mb: float,
                        cycle_time_ms: float) -> dict[str, str]:
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



def horovod_allreduces(gradient_mb: float, gradient_tensors: int, threshold_mb: float,
                       cycle_time_ms: float, backward_s: float) -> int:
    """Horovod's allreduces per step: every cycle (`cycle_time_ms`) its background thread
    fuses the gradients that became ready since the last one into one allreduce (at most
    `threshold_mb` each). A backward pass spanning many cycles hands over a few tensors per
    cycle, so the count is the number of cycles it spans, bounded by the tensors (one each)
    and at least what the threshold forces (Tensor Fusion's buffers)."""
    by_threshold = math.ceil(gradient_mb / threshold_mb) if threshold_mb > 0 else gradient_tensors
    cycles = math.ceil(backward_s * 1000 / cycle_time_ms)
    return max(1, by_threshold, min(gradient_tensors, cycles))


def epoch_terms(config: DistbenchConfig, facts: CellFacts,
                profile: HardwareProfile | None) -> EpochTerms:
    """Eq. 5.1 with Tensor Fusion: the last fused buffer exposed on a GPU; on CPU workers
    every per-cycle fusion's allreduce, and the background thread's share of the cores."""
    assert profile is not None
    settings = horovod_settings(config)
    messages = horovod_allreduces(facts.gradient_mb, facts.gradient_tensors,
                                  settings.fusion_threshold_mb, settings.cycle_time_ms,
                                  BACKWARD_SHARE * facts.step_seconds)
    return data_parallel_terms(config, facts, profile,
                               exposed_threshold_mb=settings.fusion_threshold_mb,
                               messages=messages, background=True)


def memory_per_worker(config: DistbenchConfig, facts: CellFacts) -> list[memory.WorkerMemory]:
    """A replica per worker, plus the fusion buffer. Horovod reads its threshold in MiB (this
    module's trainer): 64 -> 67.1 MB."""
    buffer = memory.horovod_buffer_mb(facts.gradient_mb,
                                      horovod_settings(config).fusion_threshold_mb * 1.048576)
    return [replica_memory(config, facts, buffer_mb=buffer)] * config.world_size


SPEC = DistributionSpec(
    name="horovod", title="Horovod", settings=HorovodConfig, trainer=horovod_trainer,
    epoch_terms=epoch_terms, memory_per_worker=memory_per_worker,
    candidates=at_every_count(HorovodConfig), label=workers_label("horovod"))
