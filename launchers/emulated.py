"""Nodes emulated on one machine: their own addresses, links with real bandwidth limits, their
own cores, and a real SLURM cluster across them.

    python -m launchers.emulated up hardware=emulated_2nodes_200mbit   # bring the nodes up
    python -m launchers.emulated status                                # what runs, link counters
    python -m launchers.emulated down                                  # remove all of it

`up` makes `hardware.nodes` nodes (it needs root, iproute2 and SLURM: `bash
scripts/slurm_local.sh install`):

- node k is a network namespace, `distbench-node<k>`, whose only interfaces are its loopback and
  `eth0`, one end of a veth pair with its own address (198.18.0.<10+k>/24); the other end,
  `distbench-v<k>`, is a port of the bridge `distbench0` (198.18.0.1), which exists only inside
  this machine and routes nowhere. 198.18.0.0/15 is the range set aside for benchmarking
  networks (RFC 2544): it collides with no network this machine is on;
- its link is shaped where traffic leaves the node (`tc qdisc ... tbf` on eth0's egress, as
  `hardware.link` says), so every byte between two nodes crosses one shaped link; each cell on
  the hardware shapes it again as its own config says (harness.runtime.links), so one cluster serves
  sweeps over link rates;
- its own share of the cores: its slurmd, and so every job step on it, runs under `taskset`
  with cores of its own (this machine's cores split evenly between the nodes);
- SLURM: slurmctld in this machine's own namespace on the bridge's address, one slurmd per node
  inside the node's namespace with `NodeAddr` = the node's address, node names (`enode<k>`) in
  /etc/hosts. `hydra/launcher=submitit_slurm hardware=<the same hardware>` runs cells on it.

`down` ends every job, daemon and process in the nodes, removes the namespaces, links, bridge
and hosts lines, and checks that none is left. Both are idempotent. The loopback cluster of
`scripts/slurm_local.sh` and this one share /etc/slurm/slurm.conf: one runs at a time.

On a shared machine `up` notes (in `DISTBENCH_EMULATED_DIR`, before it makes anything) what it
starts and writes outside it: the process ids of slurmctld and of munged where it started one,
the slurm.conf it replaced. `down` stops those processes by their ids (never by name), ends the
processes inside the nodes' namespaces, puts the earlier slurm.conf back (or removes its own),
removes the hosts lines it marked, and touches nothing else: with no cluster noted it touches
nothing at all, and says so (or what of an emulated cluster it sees that another directory's
note must have started).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.cli.errors import StateError, command
from harness.config.schema import ConfigError, HardwareConfig, LinkEmulation

STATE_DIR = Path(os.environ.get("DISTBENCH_EMULATED_DIR", "/tmp/distbench-emulated"))
SLURM_CONF = Path("/etc/slurm/slurm.conf")
HOSTS_FILE = Path("/etc/hosts")
HOSTS_MARK = "# distbench-emulated"
BRIDGE = "distbench0"
NAMESPACE_PREFIX = "distbench-node"
VETH_PREFIX = "distbench-v"
NODE_INTERFACE = "eth0"
NODE_NAME_PREFIX = "enode"
SUBNET = ipaddress.ip_network("198.18.0.0/24")
FIRST_NODE_HOST = 10  # node k has host number 10 + k: 198.18.0.11, .12, ...
# Nodes up and idle in sinfo within this; namespaces and links gone within that.
UP_TIMEOUT_S = 60.0
GONE_TIMEOUT_S = 30.0


class EmulationError(StateError):
    """This machine cannot bring the emulated nodes up or down: the one line says why."""


@dataclass(frozen=True)
class Node:
    """One emulated node."""

    index: int  # 1, 2, ...
    cores: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{NODE_NAME_PREFIX}{self.index}"

    @property
    def namespace(self) -> str:
        return f"{NAMESPACE_PREFIX}{self.index}"

    @property
    def veth(self) -> str:
        return f"{VETH_PREFIX}{self.index}"

    @property
    def address(self) -> str:
        return str(SUBNET.network_address + FIRST_NODE_HOST + self.index)


@dataclass(frozen=True)
class Cluster:
    """The nodes of one emulated hardware, as `up` builds them."""

    hardware: str
    nodes: tuple[Node, ...]
    link: LinkEmulation
    memory_mb_per_node: int
    # The workers a node runs at once, which SLURM must see as its CPUs to place them: the
    # hardware's workers per node where they outnumber the node's cores (they then share the
    # cores the node is pinned to, as local_4cpu's four workers share this machine's two);
    # 0: the node's cores.
    slots_per_node: int = 0

    @property
    def bridge_address(self) -> str:
        return str(SUBNET.network_address + 1)

    @classmethod
    def for_hardware(
        cls, hardware: HardwareConfig, cores: int | None = None, memory_mb: int | None = None
    ) -> Cluster:
        """`hardware.nodes` nodes with this machine's cores split evenly between them (a node
        gets at least one; with more nodes than cores, nodes share them round robin)."""
        if hardware.link is None:
            raise ConfigError(
                f"hardware={hardware.name} is invalid here: it sets no "
                f"hardware.link; allowed: an emulated hardware (conf/hardware/"
                f"emulated_*.yaml)"
            )
        if hardware.nodes < 2:
            raise ConfigError(
                f"hardware.nodes={hardware.nodes} is invalid for emulated nodes: allowed: 2 or more"
            )
        if hardware.nodes > 200:
            raise ConfigError(
                f"hardware.nodes={hardware.nodes} is invalid for emulated nodes: "
                f"allowed: at most 200 on one machine (one /24 subnet)"
            )
        cores = cores or os.cpu_count() or 1
        per_node = max(1, cores // hardware.nodes)
        nodes = tuple(
            Node(k + 1, tuple((k * per_node + c) % cores for c in range(per_node)))
            for k in range(hardware.nodes)
        )
        memory_mb = memory_mb or _memory_mb()
        return cls(
            hardware.name,
            nodes,
            hardware.link,
            max(1, memory_mb // hardware.nodes),
            slots_per_node=max(per_node, hardware.workers_per_node),
        )

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Cluster:
        return cls(
            data["hardware"],
            tuple(Node(n["index"], tuple(n["cores"])) for n in data["nodes"]),
            LinkEmulation(**data["link"]),
            int(data["memory_mb_per_node"]),
            int(data.get("slots_per_node", 0)),
        )


# --- commands ---------------------------------------------------------------------------------


def run(*command: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a system command; one line naming it when it fails."""
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise EmulationError(
            f"`{' '.join(command)}` failed ({done.returncode}): "
            f"{' '.join(done.stderr.split())[:300]}"
        )
    return done


def in_namespace(node: Node, *command: str) -> list[str]:
    """`command` in the node's network namespace only. Not `ip netns exec`, which also gives it
    a mount namespace with /sys mounted again: slurmd would find no cgroup file system there."""
    return ["nsenter", f"--net=/run/netns/{node.namespace}", *command]


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 1024


def check_machine() -> None:
    """Root, iproute2, and SLURM's daemons: what `up` needs, in one line if something lacks."""
    if os.geteuid() != 0:
        raise EmulationError("emulated nodes need root (network namespaces, tc, slurmd)")
    missing = [
        tool
        for tool in ("ip", "tc", "nsenter", "taskset", "slurmctld", "slurmd", "munged", "sinfo")
        if shutil.which(tool) is None
    ]
    if missing:
        raise EmulationError(
            f"emulated nodes need {', '.join(missing)}: install SLURM with "
            f"`bash scripts/slurm_local.sh install` (iproute2 and util-linux "
            f"bring ip, tc, nsenter, taskset)"
        )


# --- state ------------------------------------------------------------------------------------


def _state_file() -> Path:
    return STATE_DIR / "cluster.json"


def current() -> Cluster | None:
    """The emulated cluster this machine runs, as `up` noted it (None if none)."""
    try:
        return Cluster.from_json(_read_note()["cluster"])
    except (KeyError, TypeError, ValueError):
        return None


def _read_note() -> dict:
    """What `up` noted (empty: nothing noted in STATE_DIR)."""
    try:
        note = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return {}
    return note if isinstance(note, dict) else {}


def _note(**facts: object) -> None:
    """Add `facts` to the note, written whole (a crash leaves the earlier note, not half of it)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    temporary = _state_file().with_suffix(".tmp")
    temporary.write_text(json.dumps(_read_note() | facts, indent=1))
    temporary.replace(_state_file())


def _noted_pid(key: str, name: str) -> int | None:
    """The noted process id `key`, if that process still runs under the name `name` (a pid the
    kernel gave to another program since is not ours)."""
    pid = _read_note().get(key)
    return pid if isinstance(pid, int) and pid in daemon_pids(name) else None


# --- the network --------------------------------------------------------------------------------


def namespaces() -> list[str]:
    """The emulated nodes' namespaces that exist now."""
    listed = run("ip", "netns", "list", check=False).stdout.split("\n")
    return sorted(line.split()[0] for line in listed if line.strip().startswith(NAMESPACE_PREFIX))


def links() -> list[str]:
    """The bridge and the nodes' veth ends in this namespace that exist now."""
    shown = json.loads(run("ip", "-j", "link", "show", check=False).stdout or "[]")
    return sorted(
        entry["ifname"]
        for entry in shown
        if entry["ifname"] == BRIDGE or entry["ifname"].startswith(VETH_PREFIX)
    )


def bring_up_network(cluster: Cluster) -> None:
    """The bridge, one namespace and veth pair per node, addresses, routes, shaped links."""
    prefix = SUBNET.prefixlen
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "add", f"{cluster.bridge_address}/{prefix}", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    for node in cluster.nodes:
        run("ip", "netns", "add", node.namespace)
        run(
            "ip",
            "link",
            "add",
            node.veth,
            "type",
            "veth",
            "peer",
            "name",
            NODE_INTERFACE,
            "netns",
            node.namespace,
        )
        run("ip", "link", "set", node.veth, "master", BRIDGE)
        run("ip", "link", "set", node.veth, "up")
        run(
            "ip",
            "-n",
            node.namespace,
            "addr",
            "add",
            f"{node.address}/{prefix}",
            "dev",
            NODE_INTERFACE,
        )
        run("ip", "-n", node.namespace, "link", "set", "lo", "up")
        run("ip", "-n", node.namespace, "link", "set", NODE_INTERFACE, "up")
    shape_links(cluster, cluster.link)


def shape_links(cluster: Cluster, link: LinkEmulation) -> None:
    """Shape every node's link where traffic leaves the node (as a cell does:
    harness.runtime.links)."""
    for node in cluster.nodes:
        run(
            *in_namespace(
                node, "tc", "qdisc", "replace", "dev", NODE_INTERFACE, "root", *link.tbf_arguments()
            )
        )


def remove_network() -> None:
    """Every namespace, veth and the bridge, waiting until the kernel has let them go."""
    for namespace in namespaces():
        _kill_processes_in(namespace)
        run("ip", "netns", "del", namespace, check=False)
    for name in links():
        run("ip", "link", "del", name, check=False)
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while (namespaces() or links()) and time.monotonic() < deadline:
        time.sleep(0.2)  # a deleted namespace's veth ends go away asynchronously


def _kill_processes_in(namespace: str) -> None:
    """SIGKILL every process of `namespace` (a node's slurmd, job steps, workers) and wait."""
    for _ in range(50):
        pids = [int(p) for p in run("ip", "netns", "pids", namespace, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


# --- /etc/hosts -------------------------------------------------------------------------------


def write_hosts(cluster: Cluster) -> None:
    """Node names resolve to the nodes' addresses (submitit names a job's nodes by them)."""
    kept = [line for line in _hosts_lines() if HOSTS_MARK not in line]
    added = [f"{node.address} {node.name} {HOSTS_MARK}" for node in cluster.nodes]
    _write_hosts(kept + added)


def remove_hosts() -> None:
    lines = _hosts_lines()
    kept = [line for line in lines if HOSTS_MARK not in line]
    if kept != lines:
        _write_hosts(kept)


def _hosts_lines() -> list[str]:
    return HOSTS_FILE.read_text().splitlines()


def _write_hosts(lines: Sequence[str]) -> None:
    # In place, not by rename: /etc/hosts may be a bind mount (containers), which a rename
    # would fail to replace.
    HOSTS_FILE.write_text("\n".join(lines) + "\n")


# --- SLURM ------------------------------------------------------------------------------------


def slurm_conf(cluster: Cluster, hostname: str) -> str:
    """slurm.conf of the emulated cluster: the controller on the bridge's address, one node per
    namespace at its own address, with its own cores and memory (and as many CPUs as the
    workers it runs at once: `Cluster.slots_per_node`)."""
    state = STATE_DIR
    nodes = "\n".join(
        f"NodeName={node.name} NodeHostname={hostname} NodeAddr={node.address} "
        f"CPUs={max(len(node.cores), cluster.slots_per_node)} "
        f"RealMemory={cluster.memory_mb_per_node}"
        for node in cluster.nodes
    )
    names = ",".join(node.name for node in cluster.nodes)
    return f"""# Written by python -m launchers.emulated up (distbench); removed by `down`.
ClusterName=distbench
FirstJobId={first_job_id()}
SlurmctldHost={hostname}({cluster.bridge_address})
AuthType=auth/munge
SlurmUser=root
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool-%n
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd-%n.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
{nodes}
PartitionName=local Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def first_job_id(now: float | None = None) -> int:
    """The first job id of a cluster brought up now. `slurmctld -c` (no jobs of an earlier
    cluster resumed) would start the ids again from 1, and a re-run sweep follows the job its
    note names (launchers.slurm_resume): ids from the clock (100 a second, repeating after a
    week) keep a new cluster's jobs apart from an earlier one's."""
    seconds = int(time.time() if now is None else now)
    return (seconds % 600_000) * 100 + 1


def _daemon_running(name: str) -> bool:
    """Whether a live process of that name runs (a zombie, ended but not yet reaped by the
    machine's init, does not count)."""
    return bool(daemon_pids(name))


def daemon_pids(name: str) -> list[int]:
    import psutil

    found = []
    for process in psutil.process_iter(["name", "status"]):
        if process.info["name"] == name and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process.pid)
    return found


def start_slurm(cluster: Cluster) -> None:
    """munged (if none runs), slurmctld, and one slurmd per node inside its namespace on its
    cores; each process id this starts outside the nodes, and the slurm.conf it replaces,
    noted for `down`."""
    hostname = run("hostname").stdout.strip()
    for node in cluster.nodes:
        (STATE_DIR / f"spool-{node.name}").mkdir(parents=True, exist_ok=True)
    (STATE_DIR / "ctld").mkdir(parents=True, exist_ok=True)
    SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
    written = slurm_conf(cluster, hostname)
    if "slurm_conf_before" not in _read_note():
        before = SLURM_CONF.read_text() if SLURM_CONF.exists() else None
        _note(slurm_conf_before=before)
    _note(slurm_conf_written=written)
    SLURM_CONF.write_text(written)
    if not _daemon_running("munged"):
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        _note(munged_pid=_started_daemon("munged", "runuser", "-u", "munge", "--", "munged"))
    _note(slurmctld_pid=_started_daemon("slurmctld", "slurmctld", "-c"))  # -c: no old jobs
    for node in cluster.nodes:
        cores = ",".join(map(str, node.cores))
        run(*in_namespace(node, "taskset", "-c", cores, "slurmd", "-N", node.name))


def _started_daemon(name: str, *command: str) -> int | None:
    """Run `command`, which starts the daemon `name` in the background, and return the id of
    the process of that name it started (None if none appeared within seconds)."""
    before = set(daemon_pids(name))
    run(*command)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        started = sorted(set(daemon_pids(name)) - before)
        if started:
            return started[0]
        time.sleep(0.1)
    return None


def nodes_idle(cluster: Cluster) -> bool:
    shown = run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split("\n")
    states = dict(line.split()[:2] for line in shown if len(line.split()) >= 2)
    return all(
        states.get(node.name, "").rstrip("*") in ("idle", "mixed", "allocated")
        for node in cluster.nodes
    )


def stop_slurm() -> None:
    """Cancel the jobs of the noted slurmctld and stop it, by its id; its nodes' slurmd run in
    the nodes' namespaces, whose processes `remove_network` ends. Another SLURM cluster's jobs
    and daemons are left alone: nothing is asked of a controller that is not the noted one."""
    controller = _noted_pid("slurmctld_pid", "slurmctld")
    if controller is None:
        return
    if _slurm_conf_is_ours() and run("scontrol", "ping", check=False).returncode == 0:
        jobs = run("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if jobs:
            run("scancel", "--full", *jobs, check=False)
        run("scontrol", "shutdown", check=False)
    _end_process(controller, "slurmctld")


def _end_process(pid: int, name: str) -> None:
    """SIGTERM the process `pid` (still named `name`), SIGKILL it after 15 s, wait until it is
    gone."""
    for sent, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        if pid not in daemon_pids(name):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sent)
        deadline = time.monotonic() + wait_s
        while pid in daemon_pids(name) and time.monotonic() < deadline:
            time.sleep(0.1)


def _slurm_conf_is_ours() -> bool:
    written = _read_note().get("slurm_conf_written")
    try:
        return written is not None and SLURM_CONF.read_text() == written
    except OSError:
        return False


def restore_slurm_conf() -> None:
    """The slurm.conf `up` replaced, back (or its own removed); one another program rewrote
    since is left as it is."""
    note = _read_note()
    if "slurm_conf_written" not in note or not _slurm_conf_is_ours():
        return
    before = note.get("slurm_conf_before")
    if isinstance(before, str):
        SLURM_CONF.write_text(before)
    else:
        SLURM_CONF.unlink(missing_ok=True)


# --- up / down / status -------------------------------------------------------------------------


def up(cluster: Cluster) -> Cluster:
    """Bring `cluster` up (idempotent: the same cluster up already is only re-shaped)."""
    check_machine()
    running = current()
    if running is not None and _same_nodes(running, cluster) and _healthy(running):
        shape_links(running, cluster.link)
        reshaped = dataclasses.replace(running, hardware=cluster.hardware, link=cluster.link)
        _note(cluster=reshaped.to_json())
        return cluster
    if running is not None:
        down()
    seen = _unnoted_leftovers()
    if seen:
        raise EmulationError(_unnoted_message(seen))
    if _daemon_running("slurmctld") or _daemon_running("slurmd"):
        raise EmulationError(
            "another SLURM cluster runs on this machine (bash "
            "scripts/slurm_local.sh start?): stop it first (bash "
            "scripts/slurm_local.sh stop); the emulated nodes bring their own"
        )
    _note(cluster=cluster.to_json())  # first: `down` finds whatever is made from here on
    try:
        bring_up_network(cluster)
        write_hosts(cluster)
        start_slurm(cluster)
        _wait_until(
            lambda: nodes_idle(cluster),
            UP_TIMEOUT_S,
            f"the SLURM nodes did not come up; logs in {STATE_DIR}",
        )
    except BaseException:
        down()
        raise
    return cluster


def _same_nodes(a: Cluster, b: Cluster) -> bool:
    return a.nodes == b.nodes and a.memory_mb_per_node == b.memory_mb_per_node


def _healthy(cluster: Cluster) -> bool:
    return (
        namespaces() == sorted(node.namespace for node in cluster.nodes)
        and _daemon_running("slurmctld")
        and nodes_idle(cluster)
    )


def _wait_until(condition: object, timeout_s: float, failure: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise EmulationError(failure)
        time.sleep(0.5)


def down() -> bool:
    """Remove the noted cluster's nodes, links, daemons, hosts lines and slurm.conf; check that
    none is left. False: nothing was noted nor seen, and nothing was touched. Raises
    EmulationError where an emulated cluster is seen that no note here names (brought up with
    another DISTBENCH_EMULATED_DIR), touching nothing of it."""
    if not _read_note():
        seen = _unnoted_leftovers()
        if seen:
            raise EmulationError(_unnoted_message(seen))
        return False
    stop_slurm()
    remove_network()
    remove_hosts()
    munged = _noted_pid("munged_pid", "munged")
    if munged is not None:
        _end_process(munged, "munged")
    restore_slurm_conf()
    left = leftovers()
    if left:
        raise EmulationError(f"left after tear-down: {', '.join(left)}")
    with contextlib.suppress(OSError):
        _state_file().unlink()
    return True


def _unnoted_leftovers() -> list[str]:
    """What of an emulated cluster exists now (namespaces, links, hosts lines)."""
    left = [f"namespace {name}" for name in namespaces()]
    left += [f"link {name}" for name in links()]
    if any(HOSTS_MARK in line for line in _hosts_lines()):
        left.append(f"lines of {HOSTS_FILE}")
    return left


def _unnoted_message(seen: Sequence[str]) -> str:
    return (
        f"no emulated cluster is noted in {STATE_DIR}, yet {', '.join(seen)} exist: brought "
        f"up with another DISTBENCH_EMULATED_DIR? Run down with that one; nothing was touched"
    )


def leftovers() -> list[str]:
    """What of the noted cluster exists now (empty once `down` is done)."""
    left = _unnoted_leftovers()
    for key, name in (("slurmctld_pid", "slurmctld"), ("munged_pid", "munged")):
        pid = _noted_pid(key, name)
        if pid is not None:
            left.append(f"{name} (process {pid})")
    if _slurm_conf_is_ours():
        left.append(str(SLURM_CONF))
    return left


def status_lines() -> list[str]:
    """The running cluster: its nodes, cores, link shaping and counters."""
    cluster = current()
    if cluster is None:
        left = leftovers()
        return ["no emulated cluster is up" + (f" (but {', '.join(left)})" if left else "")]
    lines = [
        f"hardware {cluster.hardware}: {len(cluster.nodes)} nodes on bridge {BRIDGE} "
        f"({cluster.bridge_address})"
    ]
    for node in cluster.nodes:
        counters = run(*in_namespace(node, "cat", "/proc/net/dev"), check=False).stdout
        qdisc = (
            run(
                "tc", "-n", node.namespace, "qdisc", "show", "dev", NODE_INTERFACE, check=False
            ).stdout.strip()
            or "(none)"
        )
        lines.append(
            f"{node.name} {node.address} ns {node.namespace} cores "
            f"{','.join(map(str, node.cores))}: {qdisc.splitlines()[0]}"
        )
        lines += traffic_table(counters)
    lines.append(run("sinfo", "-N", check=False).stdout.rstrip())
    return lines


def traffic_table(proc_net_dev: str) -> list[str]:
    """A node's interfaces' traffic since they were made, from its /proc/net/dev: one row per
    interface (its loopback and its link), bytes and packets each way."""
    heading = ("interface", "received MB", "packets", "sent MB", "packets")
    rows = ["    {:<10} {:>12} {:>10} {:>12} {:>10}".format(*heading)]
    for line in proc_net_dev.splitlines()[2:]:  # two lines of headings
        name, _, numbers = line.partition(":")
        fields = numbers.split()
        if name.strip() not in (NODE_INTERFACE, "lo") or len(fields) < 10:
            continue
        received, received_packets, sent, sent_packets = (int(fields[i]) for i in (0, 1, 8, 9))
        rows.append(
            f"    {name.strip():<10} {received / 1e6:>12.2f} {received_packets:>10,} "
            f"{sent / 1e6:>12.2f} {sent_packets:>10,}"
        )
    return rows


@command
def main(argv: Sequence[str] | None = None) -> None:
    from harness.cli.arguments import ArgumentParser
    from harness.commands.compose import compose_config
    from harness.config.schema import validate

    parser = ArgumentParser(
        prog="python -m launchers.emulated", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="up: the hardware to emulate (hardware=emulated_2nodes_1gbit) "
        "and any hardware.* override",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.action != "up" and args.overrides:
        parser.error(f"{args.action} takes no overrides")
    if args.action == "up":
        config = validate(compose_config(args.overrides))
        cluster = up(Cluster.for_hardware(config.hardware))
        print(
            f"[emulated] up: {len(cluster.nodes)} nodes of hardware={cluster.hardware}, "
            f"links {' '.join(cluster.link.tbf_arguments())}"
        )
    elif args.action == "down":
        if down():
            print("[emulated] down: no namespace, link, daemon, hosts line or slurm.conf left")
        else:
            print(f"[emulated] nothing was up (no cluster noted in {STATE_DIR}): nothing touched")
            return
    print("\n".join(status_lines()))


@contextlib.contextmanager
def emulated_cluster(hardware: HardwareConfig) -> Iterator[Cluster]:
    """The cluster of `hardware` for the duration of a block (tests, benchmarks)."""
    cluster = up(Cluster.for_hardware(hardware))
    try:
        yield cluster
    finally:
        down()


if __name__ == "__main__":
    main()
