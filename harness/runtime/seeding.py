"""Seeds for every random number generator a cell uses, and the optional deterministic mode.

Every worker of a cell seeds alike: the replicas must start from the same parameters (the
pipelines build each stage from a network seeded alike on every worker) and every rank must
compute the same data-order permutation to take its shard of it.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

# cuBLAS is only deterministic with a fixed workspace (CUDA >= 10.2); ":4096:8" is the setting
# NVIDIA and torch document, at the cost of a little more device memory.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def repeat_seed(base_seed: int, repeat: int) -> int:
    """The seed of repeat `repeat` (from 0) of a cell: `run.seed + repeat`.

    Repeat 0 keeps `run.seed`, so a cell without repeats is seeded as before; repeat k of a
    cell can be rerun alone with `run.seed=<its seed>`.
    """
    return base_seed + repeat


def seed_everything(seed: int) -> None:
    """Seed Python's `random`, NumPy's global generator and torch (CPU and every CUDA device).

    The data order does not depend on these: the loader derives it from its own seed
    (`EpochLoader.reseed`), so that it is the same however much randomness the network drew.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)  # NumPy's legacy seed is 32 bits
    torch.manual_seed(seed)  # seeds the CUDA generators too
    torch.cuda.manual_seed_all(seed)  # (explicit: a no-op without CUDA)


def set_deterministic(enabled: bool) -> None:
    """Ask torch for deterministic kernels (or leave its defaults when `enabled` is false).

    Must run before the first cuBLAS call: cuBLAS reads CUBLAS_WORKSPACE_CONFIG when it
    creates its handle. Deterministic kernels may be slower, and an operation without one
    raises, so the mode is off unless asked for, and recorded either way.
    """
    if not enabled:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False  # autotuning may pick different kernels per run


def determinism_facts() -> dict[str, str]:
    """What the process's determinism settings are, as strings (they become MLflow tags)."""
    return {
        "deterministic_algorithms": str(torch.are_deterministic_algorithms_enabled()).lower(),
        "cudnn_deterministic": str(torch.backends.cudnn.deterministic).lower(),
        "cudnn_benchmark": str(torch.backends.cudnn.benchmark).lower(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG", "none"),
    }
