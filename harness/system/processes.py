"""Processes as the kernel knows them (through psutil): who a process is, what runs below it,
and how to end a whole tree of them whatever signals it ignores.

A process is known by its pid *and* its start time (`ProcessId`): once a process has ended, the
kernel may give its pid to another, which must never be taken for it (signalled, waited for,
or believed alive). A zombie (ended, not yet reaped by its parent) counts as gone.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger(__name__)

# The signals that end a tree of processes, in turn: SIGINT (what Ctrl-C and submitit's cancel
# send), SIGTERM, then SIGKILL, which nothing can ignore.
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


@dataclass(frozen=True)
class ProcessId:
    pid: int
    started: float  # seconds since the epoch (psutil's create_time)

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        """The process that has `pid` now, or None if there is none (or only a zombie)."""
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
            return cls(pid, process.create_time())
        except psutil.Error:
            return None

    def alive(self) -> bool:
        return ProcessId.of(self.pid) == self

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` if this very process still runs (never to a reused pid)."""
        try:
            process = psutil.Process(self.pid)
            if process.create_time() == self.started:
                process.send_signal(sig)
        except psutil.Error:
            pass


def pid_space() -> str | None:
    """Which pids this process can see: the running kernel's boot id and its pid namespace.
    Two processes with the same one can tell whether the other runs (SLURM nodes emulated on
    one machine share it; two hosts, or two containers with pid namespaces, do not)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def this_process() -> dict[str, Any]:
    """This process as another can look for it (`ended_here`)."""
    me = ProcessId.of(os.getpid())
    return {
        "pid_space": pid_space(),
        "pid": os.getpid(),
        "started": None if me is None else me.started,
    }


def ended_here(process: Mapping[str, Any]) -> bool:
    """Whether `process` (as `this_process` described it) ran where this process can see it,
    and has ended. False where that cannot be told (another machine, another pid namespace)."""
    space = process.get("pid_space")
    if space is None or space != pid_space() or process.get("started") is None:
        return False
    return not ProcessId(int(process["pid"]), float(process["started"])).alive()


def start_time(pid: int) -> float | None:
    """When the process `pid` started, or None if it is gone."""
    found = ProcessId.of(pid)
    return None if found is None else found.started


def descendants(pid: int) -> set[ProcessId]:
    """Every process below `pid` (children, theirs, ...)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return set()
    found = {ProcessId.of(child.pid) for child in children}
    return {process for process in found if process is not None}


def children_with_environment(pid: int, name: str, value: str) -> list[ProcessId]:
    """The children of `pid` whose environment sets `name` to `value`."""
    matching = []
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return []
    for child in children:
        try:
            if child.environ().get(name) == value:
                matching.append(ProcessId(child.pid, child.create_time()))
        except psutil.Error:
            continue
    return matching


def end_tree(
    root: int,
    *,
    step_s: float,
    reap: Callable[[], object] = lambda: None,
    signals: tuple[signal.Signals, ...] = ENDING_SIGNALS,
) -> None:
    """End `root` and every process below it, and return once all are gone: each of `signals`
    (ENDING_SIGNALS unless told) in turn, each followed by SIGCONT so that a stopped process
    acts on it, `step_s` apart, until none is left. The tree is collected as it is seen, so a
    process whose parent died (and which was reparented) is still ended. `reap` is called
    before each look: a caller that is `root`'s parent reaps it there (e.g. submitit's
    `job.done()`)."""
    tree: set[ProcessId] = set()

    def alive() -> set[ProcessId]:
        reap()
        top = ProcessId.of(root)
        if top is not None:
            tree.add(top)
            tree.update(descendants(root))
        return {process for process in tree if process.alive()}

    for sig in signals:
        running = alive()
        if not running:
            return
        for process in sorted(running, key=lambda p: p.pid == root):  # the root last
            process.signal(sig)
            process.signal(signal.SIGCONT)
        deadline = time.monotonic() + step_s
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
    left = alive()
    if left:  # only a process stuck in the kernel (state D) outlives SIGKILL for long
        log.warning("processes still exist after SIGKILL: %s", sorted(p.pid for p in left))


def ends_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess` that has the kernel send the child `signum` when this
    process ends (Linux's PR_SET_PDEATHSIG), for a helper child that must not outlive the
    command that started it: a command ended by SIGTERM or SIGKILL runs no code that could end
    it. Set between fork and exec, so no moment of the child's life escapes it. None (no
    preexec_fn) where the kernel has no such call."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the child
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_parent_death_signal() -> None:
        prctl(pr_set_pdeathsig, signum, 0, 0, 0)

    return set_parent_death_signal
