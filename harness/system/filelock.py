"""Advisory file locks (`fcntl.flock`) between distbench's processes on one machine: held by a
live process only (the kernel drops a lock when its holder ends, however it ends), so a
crashed holder never leaves a stale lock behind.

Used where two processes must not do the same thing at once: creating and migrating a new
MLflow SQLite store (`harness.records.tracking`), and sweeping into one directory (`launchers`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path


def try_lock(path: Path) -> int | None:
    """The open descriptor of `path`, now locked exclusively by this process, or None when
    another process holds it. The caller closes the descriptor to release it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def held(path: Path, *, wait_s: float, poll_s: float = 0.05) -> Iterator[bool]:
    """Hold the lock on `path` for the block, waiting up to `wait_s` for another holder;
    yields whether it is held (False after the wait: the caller goes on without it, so a hung
    holder cannot stop it forever; also when `path` cannot be created, e.g. a read-only
    directory, where the caller's own work fails in its own words)."""
    deadline = time.monotonic() + wait_s
    try:
        fd = try_lock(path)
        while fd is None and time.monotonic() < deadline:
            time.sleep(poll_s)
            fd = try_lock(path)
    except OSError:
        fd = None
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)
