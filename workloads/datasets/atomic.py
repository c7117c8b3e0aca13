"""Crash-safe file writing for the synthetic cache.

A generation that is killed half-way (OOM, SLURM time limit, Ctrl-C) must never leave a file that
a later run trusts. Every file is therefore written under a unique temporary name in its final
directory, flushed and fsync'ed, and only then renamed into place with `os.replace`, which is
atomic on POSIX file systems: readers see either no file or the complete file. Two processes
writing the same file concurrently each use their own temporary file, so the loser of the race
simply replaces the winner's file with identical content.

This is the project's one atomic writer (the lowest layer: the harness's results, indexes and
profiles use it too).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# Temporary files start with this prefix so that they are recognisable as debris after a crash.
TEMP_PREFIX = ".tmp-"
_HASH_BLOCK = 16 * 1024 * 1024


def npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The `.npy` header that `np.save` would write for a C-ordered array of `shape` and `dtype`.

    Writing the header ourselves lets a large array be streamed to disk chunk by chunk, and lets
    the expected file size be computed without reading the file.
    """
    import numpy as np  # the .npy writers only: the JSON and text writers load no numpy

    buffer = io.BytesIO()
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
        "fortran_order": False,
        "shape": tuple(shape),
    }
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue()


def npy_file_size(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Size in bytes of the `.npy` file holding a C-ordered array of `shape` and `dtype`."""
    import numpy as np  # the .npy writers only: the JSON and text writers load no numpy

    data_bytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return len(npy_header(shape, dtype)) + data_bytes


@contextlib.contextmanager
def _atomic_binary_file(path: Path) -> Iterator[io.BufferedWriter]:
    """Yield a temporary file next to `path`; on success fsync it and rename it to `path`.

    On any exception (a full or read-only disk raises OSError) the temporary file is removed and
    `path` is left untouched: never an empty or partial file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Persist a rename: without this a power loss could undo it although the data is on disk."""
    with contextlib.suppress(OSError):  # not supported by every file system; best effort
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_npy_chunks(
    path: Path, shape: tuple[int, ...], dtype: np.dtype, chunks: Iterable[np.ndarray]
) -> str:
    """Atomically write a `.npy` file whose rows arrive in `chunks`; return its sha256 (hex).

    The checksum is computed from the bytes as they are written, so the (possibly 1.5 GB) file is
    never read back.
    """
    import numpy as np  # the .npy writers only: the JSON and text writers load no numpy

    digest = hashlib.sha256()
    expected_bytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    written = 0
    with _atomic_binary_file(path) as handle:
        header = npy_header(shape, dtype)
        handle.write(header)
        digest.update(header)
        for chunk in chunks:
            data = np.ascontiguousarray(chunk, dtype=dtype).data
            handle.write(data)
            digest.update(data)
            written += data.nbytes
        if written != expected_bytes:
            raise ValueError(
                f"{path.name}: chunks hold {written} bytes, shape {shape} needs {expected_bytes}"
            )
    return digest.hexdigest()


def write_json_atomic(path: Path, data: Any) -> None:
    """Atomically write `data` as JSON (sorted keys; what JSON cannot hold as its str())."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Atomically write `text` to `path`: readers see the old file or the whole new one."""
    with _atomic_binary_file(path) as handle:
        handle.write(text.encode())


def sha256_file(path: Path) -> str:
    """sha256 (hex) of a file, read in blocks so that big files do not need to fit in memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()
