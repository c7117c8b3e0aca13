"""A dry run's cells planned on every core (`launchers.cell_pool`): the same cells, in the same
order, with the same error, as one after another. The pool forks only from a process of one
thread, which a test runner's worker is not: each case runs in a fresh interpreter, as the
command line does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

_PLAN = """
import json, os, sys, time
from launchers.cell_pool import plan_cells

parent = os.getpid()
def plan_one(number, overrides):
    if os.getpid() != parent:
        time.sleep(STALL_IN_CHILD)
    if number in FAIL_IN_CHILD and os.getpid() != parent:
        raise ValueError(f"cell {number} refused in a child")
    return [number, overrides, os.getpid() == parent]

def plan_here(number, overrides):
    if number in FAIL_HERE:
        print(f"distbench: invalid config in sweep cell {number}", file=sys.stderr)
        raise SystemExit(2)
    return plan_one(number, overrides)

cells = [[f"run.epochs={n + 1}"] for n in range(50)]
print(json.dumps(plan_cells(cells, plan_one, plan_here, desc="composing cells",
                            workers=WORKERS)))
"""


def _plan_script(
    workers: int,
    fail_in_child: set[int] = frozenset(),
    fail_here: set[int] = frozenset(),
    stall_in_child_s: float = 0.0,
) -> list[str]:
    script = (
        f"FAIL_IN_CHILD = {set(fail_in_child)!r}\nFAIL_HERE = {set(fail_here)!r}\n"
        f"WORKERS = {workers}\nSTALL_IN_CHILD = {stall_in_child_s}\n" + textwrap.dedent(_PLAN)
    )
    return [sys.executable, "-c", script]


def _planned(
    workers: int, fail_in_child: set[int] = frozenset(), fail_here: set[int] = frozenset()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _plan_script(workers, fail_in_child, fail_here),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )


def test_the_cells_come_back_in_order_planned_in_children() -> None:
    done = _planned(workers=2)
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    assert [(number, overrides) for number, overrides, _ in planned] == [
        (n, [f"run.epochs={n + 1}"]) for n in range(50)
    ]
    assert not any(here for _, _, here in planned)  # every one in a child
    alone = json.loads(_planned(workers=1).stdout)
    assert [cell[:2] for cell in alone] == [cell[:2] for cell in planned]
    assert all(here for _, _, here in alone)


def test_a_cell_a_child_cannot_plan_is_planned_here_and_its_error_ends_the_run() -> None:
    # refused in the child and here: the error, as one after another would have raised it
    failed = _planned(workers=2, fail_in_child={37}, fail_here={37})
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines()[-1] == "distbench: invalid config in sweep cell 37"
    assert failed.stdout == ""
    # refused in the child only: planned here, with the rest of its chunk, and all in order
    done = _planned(workers=2, fail_in_child={20})
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    assert [number for number, _, _ in planned] == list(range(50))
    here = [number for number, _, planned_here in planned if planned_here]
    assert here[0] == 20 and here == list(range(20, here[-1] + 1))


def _dry_run_alone_and_on_every_core(
    args: list[str], tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], ...]:
    runs = []
    for cores in (None, {0}):  # every core, then one: the cells one after another
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        runs.append(
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "harness",
                    *args,
                    "--dry-run",
                    f"run.output_dir={tmp_path / 'outputs'}",
                ],
                capture_output=True,
                text=True,
                timeout=300,
                cwd=tmp_path,
                env=env,
                preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, {0}),
            )
        )
    return tuple(runs)


def test_a_dry_run_on_every_core_lists_what_one_core_lists(tmp_path: Path) -> None:
    epochs = ",".join(str(n) for n in range(1, 21))
    every_core, one_core = _dry_run_alone_and_on_every_core(
        ["-m", "network=resnet18,vgg11", f"run.epochs={epochs}"], tmp_path
    )
    assert every_core.returncode == one_core.returncode == 0, every_core.stderr[-2000:]
    assert every_core.stdout == one_core.stdout
    assert ": 40 cells," in every_core.stdout.splitlines()[0]
    # a cell refused in the second chunk (cell 20): the same line, the same status
    every_core, one_core = _dry_run_alone_and_on_every_core(
        ["-m", "network=resnet18,vgg11", f"run.epochs={epochs},-3"], tmp_path
    )
    assert every_core.returncode == one_core.returncode == 2
    assert every_core.stdout == one_core.stdout == ""
    assert (
        every_core.stderr.strip().splitlines()[-1]
        == one_core.stderr.strip().splitlines()[-1]
        == (
            f"distbench: invalid config in sweep cell network=resnet18 run.epochs=-3 "
            f"run.output_dir={tmp_path / 'outputs'}: run.epochs=-3 is invalid: must be 1 or "
            f"more"
        )
    )
    assert not (tmp_path / "outputs").exists()


def test_children_busy_with_cells_end_with_a_killed_parent() -> None:
    """SIGKILL runs no code of the command, and a child busy with its chunk would go on
    composing (a thesis grid's pipeline cell loads torch, seconds of CPU) before it found the
    pool gone: the kernel ends it with its parent."""
    import psutil

    command = subprocess.Popen(
        _plan_script(workers=2, stall_in_child_s=600),
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        parent = psutil.Process(command.pid)
        deadline = time.monotonic() + 60
        while len(parent.children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        children = parent.children()
        assert len(children) == 2, "the pool forked no two children"
        command.kill()
        assert command.wait(timeout=30) == -signal.SIGKILL
        _, alive = psutil.wait_procs(children, timeout=5)
        assert alive == []
    finally:
        command.kill()


def test_a_dry_run_ended_by_sigterm_as_it_forks_leaves_no_child(tmp_path: Path) -> None:
    """SIGTERM to the command (its handler raises SystemExit, which the pool's exit turns into
    SIGTERM to each child, whose own handler is the default) as soon as its first child
    exists, maybe while the pool is still forking the others: SystemExit inside
    `Pool.__init__` ends no child, the kernel does (PR_SET_PDEATHSIG)."""
    import psutil

    command = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "+sweep=thesis_grid",
            "--dry-run",
            f"run.output_dir={tmp_path / 'outputs'}",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        parent = psutil.Process(command.pid)
        deadline = time.monotonic() + 120
        while not parent.children() and time.monotonic() < deadline:
            assert command.poll() is None, "the dry run ended before it forked"
            time.sleep(0.002)
        children = {child.pid: child for child in parent.children()}
        assert children, "no child composing cells"
        command.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while command.poll() is None and time.monotonic() < deadline:  # every child forked
            with contextlib.suppress(psutil.NoSuchProcess):
                children.update((child.pid, child) for child in parent.children())
            time.sleep(0.002)
        assert command.wait(timeout=30) == 143
        _, alive = psutil.wait_procs(list(children.values()), timeout=10)
        assert alive == []
    finally:
        command.kill()


def test_cells_that_share_work_are_chunked_together_and_a_large_group_is_cut() -> None:
    from launchers.cell_pool import CHUNK_CELLS, _chunks

    # 3 groups of 24 (the thesis grid's shape): one chunk each, in the order they appear
    cells = [[f"a={number % 3}"] for number in range(72)]
    chunks = _chunks(cells, lambda overrides: overrides[0])
    assert [sorted({number % 3 for number in chunk}) for chunk in chunks] == [[0], [1], [2]]
    assert sorted(number for chunk in chunks for number in chunk) == list(range(72))
    # one group of every cell: cut, so that every core gets some
    chunks = _chunks([["same"]] * 100, lambda overrides: overrides[0])
    assert len(chunks) > 2 and max(map(len, chunks)) <= 2 * CHUNK_CELLS
    assert [number for chunk in chunks for number in chunk] == list(range(100))
    # nothing shared: in order, CHUNK_CELLS each
    count = 2 * CHUNK_CELLS + 8
    chunks = _chunks([[str(number)] for number in range(count)], None)
    assert chunks == [
        list(range(0, CHUNK_CELLS)),
        list(range(CHUNK_CELLS, 2 * CHUNK_CELLS)),
        list(range(2 * CHUNK_CELLS, count)),
    ]


# Where the command sends itself SIGTERM while the pool is built (the handler, which raises
# SystemExit, runs in the 0.2 s sleep that follows unless the signal is held).
_SIGTERM_WHILE_BUILDING = """
import os, signal, sys, time
import multiprocessing.pool as mpool
from harness.cli.signals import end_like_ctrl_c_on_sigterm
from launchers.cell_pool import plan_cells

def sigterm_here():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)

if AT == "after the first fork":
    make_process = mpool.Pool.Process
    def process(ctx, *args, **kwargs):
        child = make_process(ctx, *args, **kwargs)
        start = child.start
        def start_then_sigterm():
            start()
            sigterm_here()
        child.start = start_then_sigterm
        return child
    mpool.Pool.Process = staticmethod(process)
elif AT == "after the last fork":
    repopulate = mpool.Pool._repopulate_pool
    def repopulate_then_sigterm(self):
        repopulate(self)
        sigterm_here()
    mpool.Pool._repopulate_pool = repopulate_then_sigterm
else:  # as the pool's first thread starts
    handle_workers = mpool.Pool._handle_workers
    def sigterm_then_handle(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        handle_workers(*args)
    mpool.Pool._handle_workers = staticmethod(sigterm_then_handle)

end_like_ctrl_c_on_sigterm()
cells = [[f"run.epochs={n + 1}"] for n in range(50)]
plan_cells(cells, lambda number, _: number, lambda number, _: number, desc="composing",
           workers=2)
print("planned every cell", flush=True)
"""


@pytest.mark.parametrize(
    "moment", ["after the first fork", "after the last fork", "as the pool's first thread starts"]
)
def test_sigterm_while_the_pool_is_built_ends_the_command_and_its_children(
    moment: str, tmp_path: Path
) -> None:
    """Deterministic: `Pool.__init__` raising SystemExit after its last fork left a pool whose
    thread forked children again, and the command hung at exit joining them (before the
    signals were held while building it)."""
    marker = str(tmp_path / "marker")  # in the command line of the command and its children
    script = f"AT = {moment!r}\n" + textwrap.dedent(_SIGTERM_WHILE_BUILDING)
    ended = subprocess.run(
        [sys.executable, "-c", script, marker],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert ended.returncode == 143, ended.stderr[-2000:]
    assert "planned every cell" not in ended.stdout
    assert "Exception ignored" not in ended.stderr  # no handler ran where it is swallowed
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _processes_with(marker):
        time.sleep(0.1)
    assert _processes_with(marker) == []


def _processes_with(marker: str) -> list[int]:
    import psutil

    return [
        process.info["pid"]
        for process in psutil.process_iter(["pid", "cmdline"])
        if marker in (process.info["cmdline"] or [])
    ]
