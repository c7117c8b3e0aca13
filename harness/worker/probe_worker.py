"""What each worker of `python -m harness.probe` runs: the collectives the registered
distribution models declare (`harness.distributions.registry.probed_collectives`: ping-pong
between every pair of workers, allreduce among the first k, ...), over the process group a
cell's workers use; rank 0 assembles and writes the hardware profile. The command
(`harness.probe`) starts these workers and never imports torch itself, so its --help and bad
input answer at once."""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import logging
import math
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from harness.config.schema import DistbenchConfig, ProbeConfig, validate
from harness.distributions.registry import probed_collectives
from harness.measure.allocator import keep_freed_memory
from harness.measure.metrics import median_seconds
from harness.profiles.collectives import AFTER_COMPUTE, Collective
from harness.profiles.hardware import (
    COLLECTIVES_AFTER_COMPUTE_FACT,
    COMPUTE_LOST_FACT,
    PROFILE_FILE,
    AllreduceCost,
    HardwareProfile,
    Link,
    fit_cost,
)
from harness.profiles.rounds import ROUNDS_FACT, median_across_rounds, rounds_fact
from harness.runtime.distributed import Peers, joined_peers
from harness.runtime.environment import machine_name
from harness.system.worker_env import log_to_stderr, worker_environment

log = logging.getLogger(__name__)


def _timed(operation: Callable[[], object], device: torch.device, probe: ProbeConfig) -> float:
    """Median seconds of `operation` over the probe's timed repetitions (its return value,
    such as a collective's work handle, is ignored: the device is synchronised after each)."""
    return median_seconds(operation, device, warmup=probe.warmup, repeats=probe.repeats)


def measure_pair(
    peer: int, initiator: bool, device: torch.device, probe: ProbeConfig
) -> list[float]:
    """One-way seconds to `peer` at each message size (measured by the initiator)."""
    one_way = []
    for nbytes in probe.message_bytes:
        buffer = torch.zeros(nbytes, dtype=torch.uint8, device=device)

        def ping_pong(buffer: torch.Tensor = buffer) -> None:
            if initiator:
                dist.send(buffer, peer)
                dist.recv(buffer, peer)
            else:
                dist.recv(buffer, peer)
                dist.send(buffer, peer)

        one_way.append(_timed(ping_pong, device, probe) / 2)
    return one_way


def measure_links(
    peers: Peers, device: torch.device, probe: ProbeConfig
) -> dict[tuple[int, int], list[float]]:
    """One-way seconds per size for every pair (i < j), as measured by worker i."""
    rank, measured = peers.env.rank, {}
    for low, high in itertools.combinations(range(peers.env.world_size), 2):
        if rank in (low, high):
            seconds = measure_pair(high if rank == low else low, rank == low, device, probe)
            if rank == low:
                measured[(low, high)] = seconds
        dist.barrier()  # one pair at a time: pairs must not share the network while timed
    return measured


def measure_allreduce(
    peers: Peers, device: torch.device, probe: ProbeConfig
) -> dict[int, list[float]]:
    """Seconds per size of an allreduce among the first k workers, for k = 2..W (rank 0's
    view: every member waits for the slowest, so one member's clock is the group's)."""
    measured = {}
    for workers in range(2, peers.env.world_size + 1):
        group = dist.new_group(list(range(workers)))  # every rank takes part in creating it
        if peers.env.rank < workers:
            # a member gets the group itself; only non-members get torch's NON_GROUP_MEMBER
            assert isinstance(group, dist.ProcessGroup)
            measured[workers] = _allreduce_seconds(group, device, probe)
        dist.barrier()
    return measured


def _allreduce_seconds(
    group: dist.ProcessGroup, device: torch.device, probe: ProbeConfig
) -> list[float]:
    """Seconds of an allreduce within `group` at each message size (a member's view)."""
    seconds = []
    for nbytes in probe.message_bytes:
        tensor = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32, device=device)
        dist.barrier(group=group)
        seconds.append(
            _timed(functools.partial(dist.all_reduce, tensor, group=group), device, probe)
        )
    return seconds


# What the cores compute while a collective runs beside them: a few products of 384 x 384
# matrices, about 3 ms on one core of this VM (short against any collective it is timed
# against, so that the last one, which runs past the collective's end, matters little).
_KERNEL_SIZE, _KERNEL_PRODUCTS = 384, 4
# A collective of at most this many bytes (the largest probe size below it): on a 100 Mbit/s
# link 8 MB takes 0.7 s, and the measurement repeats it.
_COMPUTE_LOST_MAX_BYTES = 8_388_608
# Timed repeats of the allreduce beside the kernel, at the least, and the kernel's timings
# alone before each (about 30 ms of them).
_COMPUTE_LOST_FEWEST_REPEATS, _KERNEL_TIMINGS_ALONE = 5, 9


def _kernel_operands() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(_KERNEL_SIZE, _KERNEL_SIZE), torch.full((_KERNEL_SIZE, _KERNEL_SIZE), 0.5)


def _kernel(left: torch.Tensor, right: torch.Tensor) -> None:
    for _ in range(_KERNEL_PRODUCTS):
        torch.mm(left, right)


def measure_compute_lost(peers: Peers, probe: ProbeConfig) -> float:
    """Milliseconds of a CPU worker's compute lost per MB of an allreduce that runs beside it
    (this worker's median over the repeats). A gloo collective between nodes is socket writes
    and reads, copies and additions: work on the cores that compute, taken from whatever they
    compute meanwhile. Measured as the harness's workers meet it: a kernel run over and over
    on this worker's cores while the allreduce is in flight, its time against the kernel's
    time alone (`predict.overlap.Timeline`: the compute beside a collective is that much
    longer).

    The loss is a few per cent of the time the allreduce is in flight (on a 200 Mbit/s link,
    about 15 ms of 330), so each repeat times the kernel alone just before it (a drift of the
    cores' speed between a timing made once and the repeat reads as a loss of either sign),
    keeps the loss's sign until the median, and at least `_COMPUTE_LOST_FEWEST_REPEATS` are
    timed: one repeat per worker read anywhere from 0 to 9.9 ms/MB on the same link."""
    left, right = _kernel_operands()
    nbytes = max(
        [n for n in probe.message_bytes if n <= _COMPUTE_LOST_MAX_BYTES]
        or [min(probe.message_bytes)]
    )
    tensor = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32)
    megabytes = tensor.numel() * 4 / 1e6
    lost_ms_per_mb = []
    repeats = max(probe.repeats // 2, _COMPUTE_LOST_FEWEST_REPEATS)
    for repeat in range(probe.warmup + repeats):
        kernel_s = _kernel_seconds_alone(left, right)
        dist.barrier()
        start = time.perf_counter()
        work = dist.all_reduce(tensor, async_op=True)
        kernels = 0
        while not work.is_completed():
            _kernel(left, right)
            kernels += 1
        lost_s = time.perf_counter() - start - kernels * kernel_s
        work.wait()
        if repeat >= probe.warmup:
            lost_ms_per_mb.append(lost_s * 1e3 / megabytes)
    return max(statistics.median(lost_ms_per_mb), 0.0)


def _kernel_seconds_alone(left: torch.Tensor, right: torch.Tensor) -> float:
    """The kernel's median time over `_KERNEL_TIMINGS_ALONE` runs (the first one untimed)."""
    _kernel(left, right)
    seconds = []
    for _ in range(_KERNEL_TIMINGS_ALONE):
        start = time.perf_counter()
        _kernel(left, right)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


# The compute before each of FSDP's collectives as the probe times them: a unit's forward or
# backward on the calibration's networks takes a few to a few tens of ms on one core, and 20
# ms refills an emulated link's 256 KB bucket at 100 Mbit/s.
_COMPUTE_BEFORE_COLLECTIVE_S = 0.02


def measure_collectives_after_compute(
    probe: ProbeConfig, timed: tuple[Collective, ...] = AFTER_COMPUTE
) -> dict[str, list[float]]:
    """Mean seconds of an all-gather (of `size` bytes gathered) and a reduce-scatter (of `size`
    bytes reduced), those of them `timed` names, among all the workers at each probe size, each
    after `_COMPUTE_BEFORE_COLLECTIVE_S` of compute on this worker's cores, as FSDP issues them
    (this worker's clock: a member's is the group's). Neither is a fixed share of an allreduce of
    the same bytes timed back to back (docs/benchmarks/2026-11-29-fsdp-collectives-after-compute.md,
    "FSDP2's collectives between nodes, timed after compute (2026-11-29)"): across two emulated
    nodes an all-gather of a few MB after compute took 0.7 of one where its bytes on the wire are
    half of one (a single bulk send per direction meets TCP's losses at the link's queue, which the
    allreduce's chunks, each waiting on the other worker's, do not), one within the link's bucket
    passed at once; on one machine's cores a 33.6 MB all-gather took 1.3 of one (0.75 back to back).
    The mean, not the median: a step pays the sum of its collectives, and a small one after compute
    took either about 0.5 or about 3.8 ms, one time or the other; so a size is repeated, where it is
    quick, until 1 s of it is timed (`_more_repeats`)."""
    workers = dist.get_world_size()
    left, right = _kernel_operands()
    fewest = max(probe.repeats // 2, 3)
    measured: dict[str, list[float]] = {collective.value: [] for collective in timed}
    for nbytes in probe.message_bytes:
        elements = max(nbytes // 4 // workers, 1) * workers
        whole, shard = torch.zeros(elements), torch.zeros(elements // workers)
        collectives = {
            Collective.all_gather: functools.partial(dist.all_gather_into_tensor, whole, shard),
            Collective.reduce_scatter: functools.partial(dist.reduce_scatter_tensor, shard, whole),
        }
        for name, collective in ((c.value, collectives[c]) for c in timed):
            dist.barrier()
            seconds = _timed_after_compute(collective, probe.warmup, fewest, (left, right))
            seconds += _timed_after_compute(
                collective, 0, _more_repeats(seconds, fewest), (left, right)
            )
            measured[name].append(statistics.fmean(seconds))
    return measured


def _timed_after_compute(
    collective: Callable[[], object],
    warmup: int,
    repeats: int,
    operands: tuple[torch.Tensor, torch.Tensor],
) -> list[float]:
    """Seconds of `repeats` runs of `collective` after `warmup` ones, each after
    `_COMPUTE_BEFORE_COLLECTIVE_S` of compute."""
    seconds = []
    for repeat in range(warmup + repeats):
        computed_until = time.perf_counter() + _COMPUTE_BEFORE_COLLECTIVE_S
        while time.perf_counter() < computed_until:
            _kernel(*operands)
        start = time.perf_counter()
        collective()
        if repeat >= warmup:
            seconds.append(time.perf_counter() - start)
    return seconds


def _more_repeats(seconds: list[float], fewest: int) -> int:
    """Further runs until 1 s of a size is timed, at most 3 times `fewest` (a quick
    collective's mean over many, a slow one's over a few): decided on the group's slowest
    total, so that every worker runs as many."""
    total = torch.tensor([sum(seconds)], dtype=torch.float64)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    if total.item() >= 1.0:
        return 0
    mean = total.item() / len(seconds)
    return min(math.ceil((1.0 - total.item()) / max(mean, 1e-9)), 3 * fewest)


def probe_worker(cfg: DictConfig, output_dir: Path) -> dict[str, Any] | None:
    """One worker of the probe; rank 0 assembles, writes and returns the profile."""
    log_to_stderr()
    from harness.worker.run import (
        select_device,  # the run module imports much; only workers need it
    )

    config = validate(cfg)
    env = worker_environment()
    device = select_device(config, env.local_rank)
    keep_freed_memory()  # its compute timed as a cell's workers step (harness.measure.allocator)
    with joined_peers(
        env,
        device,
        backend=config.distribution.backend,
        timeout_s=config.run.progress_timeout_s,
        link=config.hardware.link,
    ) as peers:
        if not env.is_distributed:
            raise RuntimeError(
                f"hardware={config.hardware.name} has one worker: there is "
                f"nothing to probe between workers"
            )
        collectives = probed_collectives()  # what the registered models' terms read
        log.info(
            "rank %d: probing %s, %d round(s)",
            env.rank,
            _probing(collectives, env.world_size),
            config.probe.rounds,
        )
        rounds = [
            measure_round(peers, device, config, collectives) for _ in range(config.probe.rounds)
        ]
        # The node as the scheduler names it (SLURM's test cluster runs its nodes on one host).
        hosts = peers.all_gather(os.environ.get("SLURMD_NODENAME", socket.gethostname()))
        shaping = peers.all_gather(None if peers.link is None else peers.link.shaping)
    if not env.is_main:
        return None
    figures = round_figures(rounds)
    profile = assemble_profile(config, device, peers, figures, hosts)
    profile.facts[ROUNDS_FACT] = rounds_fact(figures)
    if any(shaping):  # emulated nodes: how each node's link was shaped (hardware.link)
        profile.facts["link_shaping"] = shaping
    if rounds[0].lost is not None:  # every worker's; the models read the median
        lost = median_across_rounds(figures[_LOST])
        profile.facts[COMPUTE_LOST_FACT] = statistics.median(lost)
        profile.facts["compute_lost_ms_per_mb_per_worker"] = lost
    if rounds[0].after_compute is not None:
        profile.facts[COLLECTIVES_AFTER_COMPUTE_FACT] = {
            "workers": env.world_size,
            "compute_before_ms": _COMPUTE_BEFORE_COLLECTIVE_S * 1e3,
            "bytes": [float(n) for n in config.probe.message_bytes],
            **{
                name: median_across_rounds(figures[_after_compute(name)])
                for name in rounds[0].after_compute
            },
        }
    profile.save(output_dir / PROFILE_FILE)
    return profile.to_json()


@dataclass(frozen=True)
class ProbeRound:
    """One round of every figure, as rank 0 holds them (every worker's links and losses)."""

    links: dict[tuple[int, int], list[float]]  # (i, j), i < j -> one-way seconds per size
    allreduce: dict[int, list[float]]  # among the first k -> seconds per size
    lost: list[float] | None  # per worker, ms of compute per MB (CPU workers between nodes)
    after_compute: dict[str, list[float]] | None  # all_gather, reduce_scatter -> s per size


def measure_round(
    peers: Peers,
    device: torch.device,
    config: DistbenchConfig,
    collectives: frozenset[Collective] = frozenset(Collective),
) -> ProbeRound:
    """Every figure of `collectives` once (`probe.rounds` of these, one after the other: a
    disturbance of a few seconds meets one round, and each figure is the median across
    them), each where a model's terms read it."""
    links: dict[tuple[int, int], list[float]] = {}
    if Collective.point_to_point in collectives:
        by_rank = peers.all_gather(measure_links(peers, device, config.probe))
        links = {pair: seconds for measured in by_rank for pair, seconds in measured.items()}
    allreduce = (
        measure_allreduce(peers, device, config.probe)
        if Collective.allreduce in collectives
        else {}
    )
    # Only where it is used: CPU workers on nodes of their own, whose allreduces run
    # beside the backward (on one machine they take their turn; a GPU's run on its links).
    lost = (
        peers.all_gather(measure_compute_lost(peers, config.probe))
        if Collective.allreduce_beside_compute in collectives
        and device.type == "cpu"
        and config.hardware.nodes > 1
        else None
    )
    # Collectives that take their turn with a CPU worker's compute, timed after it
    timed = tuple(collective for collective in AFTER_COMPUTE if collective in collectives)
    after_compute = (
        measure_collectives_after_compute(config.probe, timed)
        if device.type == "cpu" and timed
        else None
    )
    return ProbeRound(links, allreduce, lost, after_compute)


def _probing(collectives: frozenset[Collective], workers: int) -> str:
    """What a round measures, for the log: its links and allreduces."""
    parts = []
    if Collective.point_to_point in collectives:
        parts.append(f"{workers * (workers - 1) // 2} links")
    if Collective.allreduce in collectives:
        parts.append(f"allreduce among 2..{workers} workers")
    return " and ".join(parts) or "no links and no allreduce"


_LOST = "compute lost"


def _link(pair: tuple[int, int]) -> str:
    return f"link {pair[0]}-{pair[1]}"


def _allreduce(workers: int) -> str:
    return f"allreduce among {workers}"


def _after_compute(collective: str) -> str:
    return f"{collective} after compute"


def round_figures(rounds: list[ProbeRound]) -> dict[str, list[list[float]]]:
    """Each figure's values per round, by the name the profile's rounds fact gives it."""
    first = rounds[0]
    figures = {_link(pair): [r.links[pair] for r in rounds] for pair in sorted(first.links)}
    figures.update(
        {_allreduce(k): [r.allreduce[k] for r in rounds] for k in sorted(first.allreduce)}
    )
    if first.lost is not None:
        figures[_LOST] = [r.lost or [] for r in rounds]
    if first.after_compute is not None:
        figures.update(
            {
                _after_compute(name): [(r.after_compute or {})[name] for r in rounds]
                for name in first.after_compute
            }
        )
    return figures


def assemble_profile(
    config: DistbenchConfig,
    device: torch.device,
    peers: Peers,
    figures: dict[str, list[list[float]]],
    hosts: list[str],
) -> HardwareProfile:
    """The profile of the figures' medians across the rounds (`round_figures`)."""
    sizes = [float(n) for n in config.probe.message_bytes]
    per_node = config.hardware.workers_per_node
    pairs = itertools.combinations(range(peers.env.world_size), 2)
    workers = range(2, peers.env.world_size + 1)
    # (those measured: the probe measures what the registered models declare)
    links = {
        pair: median_across_rounds(figures[_link(pair)]) for pair in pairs if _link(pair) in figures
    }
    allreduce = {
        k: median_across_rounds(figures[_allreduce(k)]) for k in workers if _allreduce(k) in figures
    }
    measured_links = [
        Link(
            low,
            high,
            low // per_node == high // per_node,
            fit_cost(sizes, seconds),
            {"bytes": sizes, "seconds": seconds},
        )
        for (low, high), seconds in links.items()
    ]
    measured_allreduce = [
        AllreduceCost(k, fit_cost(sizes, seconds), {"bytes": sizes, "seconds": seconds})
        for k, seconds in allreduce.items()
    ]
    # The machine rank 0 runs on: link speeds over loopback or shared memory are the host's,
    # as a step time is (`harness.runtime.environment.machine_name`).
    facts = {
        "device": device.type,
        "backend": peers.backend,
        "hosts": hosts,
        "machine": machine_name(device.type),
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "repeats": config.probe.repeats,
    }
    return HardwareProfile(
        config.hardware.name,
        "measured",
        peers.env.world_size,
        config.hardware.nodes,
        measured_links,
        measured_allreduce,
        facts,
    )
