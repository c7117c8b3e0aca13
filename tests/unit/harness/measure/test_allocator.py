"""Freed host memory kept in a timing process (`harness.measure.allocator`): measured in page faults
(the kernel's own count), in fresh processes."""

from __future__ import annotations

import json
import subprocess
import sys

# Ten 8 MB blocks taken, written and given back, five times over, through the C library's own
# malloc (torch's CPU tensors take theirs from it too; from Python objects, small blocks between
# the large ones would make the heap's shape, and the default's faults, vary from run to run).
# glibc's default maps the first round's blocks, then raises its thresholds to their size and
# serves them from the heap, whose free top it hands back to the kernel each round: each round
# faults every page in again.
_ROUNDS = """
import ctypes, json, resource, sys
from harness.measure.allocator import host_allocator, keep_freed_memory
if sys.argv[1] == "kept":
    keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
size = 8 * 1024**2
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(size) for _ in range(10)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in reversed(blocks):
        libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"faults": faults, "allocator": host_allocator()}))
"""


def _rounds(setting: str) -> tuple[list[int], str]:
    """Each round's page faults, and how the process said it allocates."""
    done = subprocess.run(
        [sys.executable, "-c", _ROUNDS, setting],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    answer = json.loads(done.stdout)
    return answer["faults"], answer["allocator"]


def test_kept_memory_is_not_faulted_in_again() -> None:
    (default, default_allocator), (kept, kept_allocator) = _rounds("default"), _rounds("kept")
    pages = 10 * 8 * 1024**2 // 4096
    # The first round faults the memory in either way; the later ones only by default.
    assert all(faults > pages // 2 for faults in default[1:]), default
    assert all(faults < pages // 20 for faults in kept[1:]), kept
    assert default_allocator == "system allocator unchanged"
    assert kept_allocator.startswith("glibc malloc: freed memory kept (mmap_threshold 32 MiB")
