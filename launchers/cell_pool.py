"""A dry run's cells composed and checked on every core this process may use (`plan_cells`).

A cell of the thesis grid is composed and checked in about 8 ms of one core
(`launchers.swapped_groups`; docs/benchmarks/2026-11-29-dry-run.md, "The thesis grid's dry run in
4 s, and the suite (2026-11-29)"), and no cell's composition or check depends on another's. So the
cells are cut into chunks, and each chunk is planned in a child forked from this process, which
holds everything composing needs (Hydra's config loader, the files read once, the sweep's master
config); the planned cells come back in order. Cells that share work (composed from the same Hydra
composition, which a child makes once) go to the same chunk. A child composes exactly as this
process would: the same code on a copy of the same state. A chunk that meets a cell that cannot be
planned (an invalid config) returns the cells planned before it; the children end, and every cell
not planned yet is planned here, in order, where the first invalid one ends the dry run exactly as
without the children (one line, exit status 2).

A child is forked only from a process of one thread (the command line's dry run: no MLflow
client, no progress bar yet, CUDA untouched), so that no lock another thread held can be
copied locked into it; in a process with threads (a test runner's), on one core, or for a few
cells, the cells are planned here, one after another.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.pool
import os
import signal
import sys
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, TypeVar

from harness.system.processes import ends_with_parent
from workloads.progress import steps

Planned = TypeVar("Planned")
# Cells per chunk: small enough to share the work out evenly and show progress, large enough
# that a chunk's round trip (pickling its planned cells back) is a small part of it.
CHUNK_CELLS = 16
# What the forked children plan: (plan_one, every cell's overrides), set while `plan_cells` runs.
_work: list[Any] = []
# The signals whose handlers in a command raise (KeyboardInterrupt; SystemExit:
# `harness.cli.signals.end_like_ctrl_c_on_sigterm`), held while the pool is built.
_RAISING_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a SLURM allocation, taskset)."""
    return len(os.sched_getaffinity(0))


def plan_cells(
    cells: Sequence[list[str]],
    plan_one: Callable[[int, list[str]], Planned],
    plan_here: Callable[[int, list[str]], Planned],
    *,
    desc: str,
    workers: int | None = None,
    shares: Callable[[list[str]], Hashable] | None = None,
) -> list[Planned]:
    """`plan_one(number, overrides)` of every cell, in order, on `workers` cores (all usable by
    default). `plan_here` plans a cell in this process: every cell on one core, and from the
    first cell a child could not plan on, every cell not planned yet, in order (the first
    invalid one raises as it would have one after another). Cells of the same `shares(overrides)`
    share work a child does once (`launchers.swapped_groups`: what they are composed from), so
    they are planned in the same child."""
    workers = usable_cores() if workers is None else workers
    chunks = _chunks(cells, shares)
    if workers < 2 or len(chunks) < 2 or threading.active_count() > 1:
        with steps(len(cells), desc, "cell(s)", enabled=len(cells) > 1) as shown:
            planned = []
            for number, overrides in enumerate(cells):
                planned.append(plan_here(number, overrides))
                shown.update()
        return planned
    _work[:] = [plan_one, cells]
    sys.stdout.flush()  # else a child could write this process' buffered output once more
    sys.stderr.flush()
    found: dict[int, Planned] = {}
    try:
        # forked before the progress bar starts its thread
        with (
            _children(min(workers, len(chunks))) as pool,
            steps(len(cells), desc, "cell(s)") as shown,
        ):
            for chunk, (done, stopped_at) in zip(chunks, pool.imap(_plan_chunk, chunks)):
                found.update(zip(chunk, done))
                shown.update(len(done))
                if stopped_at is not None:
                    break
            pool.terminate()  # the children end before any cell is planned here
            for number, overrides in enumerate(cells):
                if number not in found:
                    found[number] = plan_here(number, overrides)
                    shown.update()
    finally:
        _work.clear()
    return [found[number] for number in range(len(cells))]


def _chunks(
    cells: Sequence[list[str]], shares: Callable[[list[str]], Hashable] | None
) -> list[list[int]]:
    """The cells' numbers cut into chunks of CHUNK_CELLS to twice that (the last may hold
    fewer), a group of cells that share work kept in one chunk where it fits in twice
    CHUNK_CELLS (groups in the order they first appear), so that one child does the group's
    shared work; a larger group is cut (each child then does its work once: cheap against
    the cores a single child would leave idle). In order where nothing is shared."""
    groups: dict[Hashable, list[int]] = {}
    for number, overrides in enumerate(cells):
        groups.setdefault(number if shares is None else shares(overrides), []).append(number)
    chunks: list[list[int]] = [[]]
    for members in groups.values():
        while members:
            if len(chunks[-1]) >= CHUNK_CELLS:
                chunks.append([])
            room = 2 * CHUNK_CELLS - len(chunks[-1])
            chunks[-1] += members[:room]
            members = members[room:]
    return [chunk for chunk in chunks if chunk]


@contextlib.contextmanager
def _children(count: int) -> Iterator[multiprocessing.pool.Pool]:
    """A pool of `count` forked children, ended (terminated) on leaving. SIGINT and SIGTERM
    are held (blocked) while it is built: their handlers raise, and `Pool.__init__` is not
    safe against an exception raised in the middle of it (a SIGTERM just after its last fork
    left a pool whose thread kept forking children and a command that hung at exit, joining
    them: 1 dry run in 14 ended as it forked). A signal held meanwhile arrives once the pool
    is built, where leaving ends the children."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _RAISING_SIGNALS)
    try:
        pool = multiprocessing.get_context("fork").Pool(
            count, initializer=_as_a_child, initargs=(os.getpid(), ends_with_parent())
        )
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise
    with pool:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        yield pool


def _as_a_child(parent: int, end_with_parent: Callable[[], None] | None) -> None:
    """A child ends when the pool ends it (SIGTERM: not this process' handler, which would
    raise SystemExit inside the pool's machinery, and hang it), and leaves Ctrl-C (SIGINT, sent
    to the whole process group) to this process, which ends the pool. It also ends with this
    process: a SIGTERM that arrives while the pool is still forking its children raises
    SystemExit inside `Pool.__init__`, which ends its children only after an Exception, so
    the kernel ends them (PR_SET_PDEATHSIG; measured: 2 of 15 dry runs ended within 3 ms of
    their first fork left a child behind without it)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _RAISING_SIGNALS)  # held while forking
    if end_with_parent is not None:
        end_with_parent()
    if os.getppid() != parent:  # the parent ended before the kernel was told to end this
        os._exit(0)


def _plan_chunk(chunk: list[int]) -> tuple[list[Any], int | None]:
    """In a child: the chunk's planned cells, up to the first that could not be planned (and
    its number; None when all were)."""
    plan_one, cells = _work
    done = []
    for number in chunk:
        try:
            done.append(plan_one(number, cells[number]))
        except BaseException:  # noqa: BLE001 - the parent plans it again and reports it
            return done, number
    return done, None
