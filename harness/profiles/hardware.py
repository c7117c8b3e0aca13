"""A hardware profile: how fast the workers of a hardware configuration talk to each other.

The performance models read links (latency L_ij and bandwidth BW_ij between workers i and j,
Table 5.1 of docs/thesis.md) and allreduce costs from here. A profile is either measured by
`python -m harness.probe` (the role NVIDIA's p2pBandwidthLatencyTest played in the thesis) or,
as Table 4.1 allows, built from the intra- and inter-node speeds given in the hardware config.

Units inside: seconds and bytes per second; the JSON file and the config use microseconds and
MB/s (decimal), as people quote them.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.cli.errors import StateError
from harness.config.accepts import finite_number
from harness.config.schema import ConfigError, HardwareConfig
from harness.config.units import BYTES_PER_MB
from harness.profiles.collectives import AFTER_COMPUTE
from harness.profiles.rounds import ROUNDS_FACT, largest_spread
from workloads.datasets.atomic import write_json_atomic

PROFILE_FILE = "hardware_profile.json"
# The facts key of what an allreduce between nodes takes from a CPU worker's compute.
COMPUTE_LOST_FACT = "compute_lost_ms_per_mb"
# The facts key of an all-gather and a reduce-scatter among all the (CPU) workers, each timed
# after a stretch of compute as FSDP issues them
# (`harness.worker.probe_worker.measure_collectives_after_compute`).
COLLECTIVES_AFTER_COMPUTE_FACT = "collectives_after_compute"


@dataclass(frozen=True)
class Cost:
    """The Hockney model of a transfer: seconds = latency + bytes / bandwidth."""

    latency_s: float
    bandwidth_bytes_per_s: float

    def seconds(self, nbytes: float, *, burst_bytes: float = 0.0) -> float:
        """One message of `nbytes`; its first `burst_bytes` pass at once (an emulated link's
        token bucket: `predict.terms.burst_bytes`)."""
        return self.seconds_for(nbytes, burst_bytes=burst_bytes)

    def seconds_for(
        self, nbytes: float, *, bandwidth_scale: float = 1.0, burst_bytes: float = 0.0
    ) -> float:
        """`seconds`, with only `bandwidth_scale` of the bandwidth achieved (a fitted factor)."""
        return self.latency_s + max(nbytes - burst_bytes, 0.0) / (
            self.bandwidth_bytes_per_s * bandwidth_scale
        )

    def as_json(self) -> dict[str, float]:
        return {
            "latency_us": self.latency_s * 1e6,
            "bandwidth_mbps": self.bandwidth_bytes_per_s / BYTES_PER_MB,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cost:
        """ValueError naming a latency or bandwidth no transfer could have (found by fuzzing:
        a bandwidth of 0 or a list was read far from the file, as a ZeroDivisionError)."""
        latency, bandwidth = data["latency_us"], data["bandwidth_mbps"]
        if not (
            finite_number(latency) and latency >= 0 and finite_number(bandwidth) and bandwidth > 0
        ):
            raise ValueError(
                f"latency_us {json.dumps(latency)}, bandwidth_mbps "
                f"{json.dumps(bandwidth)}: not a latency >= 0 and a bandwidth > 0"
            )
        return cls(latency / 1e6, bandwidth * BYTES_PER_MB)


def _check_facts(facts: object) -> None:
    """TypeError naming a profile fact the predictions or the probe's summary read that is not
    what `harness.probe` writes (found by fuzzing: each was read far from the file)."""
    if not isinstance(facts, dict):
        raise TypeError(f"facts is a JSON {type(facts).__name__}, not an object")
    lost = facts.get(COMPUTE_LOST_FACT)
    if lost is not None and not (finite_number(lost) and lost >= 0):
        raise TypeError(f"facts.{COMPUTE_LOST_FACT} is {json.dumps(lost)}")
    rounds = facts.get(ROUNDS_FACT)
    if rounds is not None and not (
        isinstance(rounds, dict)
        and finite_number(rounds.get("rounds", 1))
        and isinstance(rounds.get("spread") or {}, dict)
        and all(finite_number(v) for v in (rounds.get("spread") or {}).values())
    ):
        raise TypeError(f"facts.{ROUNDS_FACT} is not a count of rounds with a spread per figure")
    after = facts.get(COLLECTIVES_AFTER_COMPUTE_FACT)
    if after is not None and not _sizes_and_times(after):
        raise TypeError(
            f"facts.{COLLECTIVES_AFTER_COMPUTE_FACT} is not a worker count with "
            f"times per message size"
        )


def _sizes_and_times(after: object) -> bool:
    """Whether `after` is what the probe keeps of collectives timed after compute."""
    if not isinstance(after, dict) or not finite_number(after.get("compute_before_ms", 0)):
        return False
    sizes = after.get("bytes")
    if not isinstance(sizes, list) or not all(finite_number(n) and n >= 0 for n in sizes):
        return False
    return all(
        isinstance(after.get(name), list)
        and len(after[name]) == len(sizes)
        and all(finite_number(t) and t >= 0 for t in after[name])
        for name in (collective.value for collective in AFTER_COMPUTE)
        if name in after
    )


def _count(value: object, what: str, least: int = 0) -> int:
    """A worker index (or a count of at least `least`) of a profile; ValueError naming it
    otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{what} {json.dumps(value)} is not a worker index or count")
    return value


def fit_cost(nbytes: list[float], seconds: list[float]) -> Cost:
    """Latency and bandwidth from timings at several message sizes.

    Bandwidth is the least-squares slope over all sizes (the large messages decide it);
    latency is the time of the smallest message, measured rather than extrapolated, since
    the fit's intercept is dominated by the large messages' noise.
    """
    if len(nbytes) != len(seconds) or len(nbytes) < 2:
        raise ValueError("a latency/bandwidth fit needs two or more (size, seconds) points")
    n = len(nbytes)
    mean_x, mean_y = sum(nbytes) / n, sum(seconds) / n
    spread = sum((x - mean_x) ** 2 for x in nbytes)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(nbytes, seconds)) / spread
    smallest = min(range(n), key=lambda i: nbytes[i])
    if slope <= 0:  # noise swamped the size dependence: take the largest message's rate
        largest = max(range(n), key=lambda i: nbytes[i])
        slope = seconds[largest] / nbytes[largest]
    return Cost(latency_s=seconds[smallest], bandwidth_bytes_per_s=1 / slope)


@dataclass(frozen=True)
class MeasuredCurve:
    """A transfer's seconds against its size where no straight line holds (an emulated link's
    bucket lets a small message through at once; a large one meets TCP's losses at the
    link's queue): priced between two measured sizes on the straight line through them (so
    continuous), above the largest at the slope of the two largest (never below the largest's
    time), below the smallest at its time."""

    nbytes: tuple[float, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if (
            len(self.nbytes) != len(self.seconds)
            or len(self.nbytes) < 2
            or list(self.nbytes) != sorted(set(self.nbytes))
        ):
            raise ValueError(
                f"a measured curve needs two or more distinct sizes, in order, "
                f"each with its seconds: {self.nbytes} / {self.seconds}"
            )

    def seconds_at(self, nbytes: float) -> float:
        sizes, seconds = self.nbytes, self.seconds
        if nbytes <= sizes[0]:
            return seconds[0]
        if nbytes >= sizes[-1]:
            slope = max(seconds[-1] - seconds[-2], 0.0) / (sizes[-1] - sizes[-2])
            return seconds[-1] + slope * (nbytes - sizes[-1])
        high = bisect.bisect_left(sizes, nbytes)  # the first measured size >= nbytes
        low = high - 1
        share = (nbytes - sizes[low]) / (sizes[high] - sizes[low])
        return seconds[low] + share * (seconds[high] - seconds[low])


@dataclass(frozen=True)
class Link:
    """Point-to-point transfers from worker `src` to worker `dst`."""

    src: int
    dst: int
    same_node: bool
    cost: Cost
    samples: dict[str, list[float]] = field(default_factory=dict)  # bytes, seconds (measured)


@dataclass(frozen=True)
class AllreduceCost:
    """An allreduce among the first `workers` workers, against its message size."""

    workers: int
    cost: Cost
    samples: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class HardwareProfile:
    hardware: str
    source: str  # "measured" (harness.probe) or "config" (Table 4.1 speeds)
    workers: int
    nodes: int
    links: list[Link]
    allreduce: list[AllreduceCost] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # device, backend, hosts, machine, when

    def link(self, src: int, dst: int) -> Cost:
        """L and BW from `src` to `dst` (a link measured one way serves both ways)."""
        for link in self.links:
            if {link.src, link.dst} == {src, dst}:
                return link.cost
        raise KeyError(
            f"the profile of {self.hardware} has no link between workers {src} "
            f"and {dst} ({self.workers} workers)"
        )

    def allreduce_cost(self, workers: int) -> Cost:
        for entry in self.allreduce:
            if entry.workers == workers:
                return entry.cost
        raise KeyError(
            f"the profile of {self.hardware} has no allreduce among {workers} "
            f"workers; measured: {[e.workers for e in self.allreduce]}"
        )

    def compute_lost_s_per_mb(self) -> float:
        """Seconds of a CPU worker's compute an allreduce between nodes takes per MB while it
        runs beside it (`harness.worker.probe_worker.measure_compute_lost`); 0 where the
        probe measured none (one machine, GPUs, a profile from before it measured this)."""
        return float(self.facts.get(COMPUTE_LOST_FACT, 0.0)) / 1e3

    def collective_after_compute(self, collective: str, workers: int) -> MeasuredCurve | None:
        """`collective` ("all_gather": the gathered bytes; "reduce_scatter": the bytes
        reduced) among `workers` CPU workers, timed after compute as FSDP issues it; None where
        the probe measured none among that many (GPUs, a profile from before it measured this)
        or at fewer than two sizes."""
        measured = self.facts.get(COLLECTIVES_AFTER_COMPUTE_FACT)
        if not measured or measured.get("workers") != workers or collective not in measured:
            return None
        by_size = dict(
            zip((float(n) for n in measured["bytes"]), (float(s) for s in measured[collective]))
        )
        sizes = sorted(by_size)
        if len(sizes) < 2:  # probe.message_bytes=[8,8]: no line to price on
            return None
        return MeasuredCurve(tuple(sizes), tuple(by_size[size] for size in sizes))

    def to_json(self) -> dict[str, Any]:
        def entry(item: Link | AllreduceCost) -> dict[str, Any]:
            data = {k: v for k, v in asdict(item).items() if k != "cost"}
            return {**data, **item.cost.as_json()}

        return {
            "hardware": self.hardware,
            "source": self.source,
            "workers": self.workers,
            "nodes": self.nodes,
            "facts": self.facts,
            "links": [entry(link) for link in self.links],
            "allreduce": [entry(a) for a in self.allreduce],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HardwareProfile:
        links = [
            Link(
                _count(d["src"], "src"),
                _count(d["dst"], "dst"),
                bool(d["same_node"]),
                Cost.from_json(d),
                d.get("samples") or {},
            )
            for d in data["links"]
        ]
        allreduce = [
            AllreduceCost(
                _count(d["workers"], "allreduce workers", 2),
                Cost.from_json(d),
                d.get("samples") or {},
            )
            for d in data.get("allreduce") or []
        ]
        facts = data.get("facts") or {}
        _check_facts(facts)
        facts = {name: value for name, value in facts.items() if value is not None}  # no fact
        return cls(
            data["hardware"],
            data["source"],
            data["workers"],
            data["nodes"],
            links,
            allreduce,
            facts,
        )

    def save(self, path: Path) -> Path:
        write_json_atomic(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: Path) -> HardwareProfile:
        """The profile `harness.probe` wrote at `path`; StateError (one line: the file, what
        is wrong, how to recover) for one that is truncated or not a profile, instead of a
        JSON or KeyError far from it."""
        try:
            profile = cls.from_json(json.loads(Path(path).read_text()))
            if not (profile.links or profile.allreduce):
                raise ValueError("it holds no measured link")
            return profile
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            what = f"missing {err}" if isinstance(err, KeyError) else str(err)
            raise StateError(
                f"{path}: not a hardware profile of harness.probe ({what}); move "
                f"it aside (mv {path} {path}.broken) to use the config's speeds, "
                f"or measure again with python -m harness.probe"
            ) from err

    @classmethod
    def from_config(cls, hardware: HardwareConfig) -> HardwareProfile:
        """A profile from the speeds the user gave (Table 4.1): workers on one node talk at
        the intra-node speed, workers on different nodes at the inter-node speed. Only the
        speeds of links that exist are needed (nodes of one worker have no intra-node link)."""
        per_node, costs = hardware.workers_per_node, dict[bool, Cost]()

        def cost(same_node: bool) -> Cost:  # asked for only where such a link exists
            if same_node not in costs:
                costs[same_node] = _configured_cost(
                    hardware, "intra_node" if same_node else "inter_node"
                )
            return costs[same_node]

        pairs = [
            (i, j) for i in range(hardware.world_size) for j in range(i + 1, hardware.world_size)
        ]
        links = [
            Link(i, j, i // per_node == j // per_node, cost(i // per_node == j // per_node))
            for i, j in pairs
        ]
        return cls(hardware.name, "config", hardware.world_size, hardware.nodes, links)


def _configured_cost(hardware: HardwareConfig, kind: str) -> Cost:
    bandwidth = getattr(hardware, f"{kind}_bandwidth_mbps")
    latency = getattr(hardware, f"{kind}_latency_us")
    if bandwidth is None or latency is None:
        raise ConfigError(
            f"hardware.{kind}_bandwidth_mbps={bandwidth} / hardware.{kind}_latency_us="
            f"{latency}: both are needed to model {hardware.name} without a measured profile; "
            f"give them, or measure with `python -m harness.probe hardware={hardware.name}`"
        )
    return Cost(latency / 1e6, bandwidth * BYTES_PER_MB)


def link_line(hardware: HardwareConfig, profile: HardwareProfile | None) -> str | None:
    """Where the links' speeds come from (none for a single worker, which never talks)."""
    if profile is None:
        return None
    if profile.source != "measured":
        return (
            f"links: hardware {hardware.name}'s configured speeds (no harness.probe "
            f"profile yet; python -m harness.probe hardware={hardware.name} measures them)"
        )
    machine = profile.facts.get("machine")  # absent from profiles probed before it was kept
    line = (
        f"links: measured by harness.probe"
        f"{f' on {machine}' if machine else ''}, {_measured_at(profile)}"
    )
    rounds = profile.facts.get(ROUNDS_FACT)
    spread = largest_spread(rounds)
    if rounds is not None and spread is not None:  # a profile from before rounds has none
        line += (
            f", in {rounds['rounds']} rounds (their spread up to {spread:.0%}: "
            f"harness.probe's own noise)"
        )
    if profile.compute_lost_s_per_mb() > 0:
        line += (
            f"; an allreduce between nodes takes {1e3 * profile.compute_lost_s_per_mb():.2f}"
            f" ms of a worker's compute per MB"
        )
    return line


def links_label(profile: HardwareProfile | None) -> str | None:
    """Which links a prediction priced, in a word a fit keeps (fit.json's `links`): "measured
    <when harness.probe measured them>", "configured" (the config's speeds); None for one
    worker."""
    if profile is None:
        return None
    if profile.source != "measured":
        return "configured"
    return f"measured {_measured_at(profile)}"


def _measured_at(profile: HardwareProfile) -> str:
    return str(profile.facts.get("measured_at", "at an unknown time"))


def profile_path(output_root: Path, hardware: str) -> Path:
    """Where the latest measured profile of `hardware` is kept for the predictors."""
    return Path(output_root) / "hardware_profiles" / f"{hardware}.json"


def profile_for(hardware: HardwareConfig, output_root: Path) -> HardwareProfile | None:
    """The profile the predictors use for `hardware`: the latest one `harness.probe` measured,
    else one from the speeds in its config; None for a single worker, which never talks."""
    measured = profile_path(output_root, hardware.name)
    if measured.exists():
        return HardwareProfile.load(measured)
    if hardware.world_size == 1:
        return None
    return HardwareProfile.from_config(hardware)
