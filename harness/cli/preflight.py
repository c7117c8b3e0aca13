"""What a command needs of this machine before it starts anything.

`harness.config.schema.validate` checks a config on its own: it may describe hardware one is not on
(the recommender and the planner reason about a GPU cluster from a laptop). The checks here are
about where the command runs, now: the device a cell would run on, its data, a place to write
its records, and the launcher its cells would go to. Each raises ConfigError, which every
command turns into one line and exit status 2 (harness.cli), before anything is written.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness.config.accepts import Accepts, allowed, shown
from harness.config.schema import ConfigError, DataSource, Device, DistbenchConfig, require


def check_runs_here(config: DistbenchConfig) -> None:
    """What a cell needs of the machine it is about to run on, checked before it starts
    (`validate` checks only the config, which also describes hardware one is not on): its
    device, its data, and a place to write its records. Raise ConfigError otherwise."""
    check_device_here(config)
    check_data_here(config)
    check_writable_dir("run.output_dir", config.run.output_dir)


def check_device_here(config: DistbenchConfig) -> None:
    """hardware.device=cuda needs a CUDA device on this machine."""
    if config.hardware.device is Device.cuda:
        require(
            torch_sees_cuda(),
            "hardware.device",
            "cuda",
            f"torch sees no CUDA device on this machine (hardware={config.hardware.name}); "
            f"allowed here: cpu (a sweep, -m, with hydra/launcher=submitit_slurm runs "
            f"on a cluster's GPUs)",
        )


# What a GPU driver puts on a Linux machine: NVIDIA's (`/proc/driver/nvidia`), AMD's for ROCm
# (`/dev/kfd`), WSL's GPU paravirtualisation (`/dev/dxg`). torch sees no CUDA device without one.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")
# A sweep's passes (`hydra.launcher.passes`): each repeats the whole sweep; a hundred take days.
MAX_PASSES = 100


@functools.cache
def torch_sees_cuda() -> bool:
    """torch.cuda.is_available(), asked once per process, and without importing torch (3 s)
    on a Linux machine that has no GPU driver at all: a dry run of a GPU cluster's grid on a
    login node or a laptop."""
    if sys.platform == "linux" and not any(map(os.path.exists, GPU_DRIVER_PATHS)):
        return False
    import torch  # (only here: the config checks themselves need no torch)

    return torch.cuda.is_available()


def check_data_here(config: DistbenchConfig) -> None:
    """Real data must be where `dataset.root` says; synthetic data needs a writable cache."""
    dataset = config.dataset
    if dataset.source is DataSource.real:
        root = expand_user("dataset.root", str(dataset.root))
        require(
            root.is_dir(),
            "dataset.root",
            dataset.root,
            f"no such directory; source=real needs the directory that holds {dataset.name.value}",
        )
        if dataset.spec.tokens:  # text: .txt files holding enough bytes for seq_len
            from workloads.datasets.tokens import check_text_root

            try:
                check_text_root(dataset.spec, root)
            except ValueError as err:
                raise ConfigError(str(err)) from None
    else:
        check_writable_dir("dataset.cache_dir", dataset.cache_dir)


def expand_user(key: str, value: str) -> Path:
    """`value` as a path, a leading `~` or `~user` expanded; ConfigError where that user does
    not exist (pathlib raises RuntimeError, which would leave as an error of the command)."""
    try:
        return Path(value).expanduser()
    except RuntimeError:
        raise ConfigError(
            f"{key}={value!r} is invalid: {value.split('/')[0]!r} names no user "
            f"of this machine; allowed: ~/..., ~USER/... for an existing USER, or a "
            f"path without ~"
        ) from None


def check_writable_dir(key: str, value: str) -> None:
    """`value` is a directory this process can write in, or can be created (its nearest
    existing ancestor is a writable directory). Tried, not guessed from permission bits (root
    passes those on a read-only mount): an anonymous temporary file is created there and
    removed at once, so nothing is left behind."""
    path = expand_user(key, value)
    allowed = "allowed: a directory this user can write in (created if missing)"
    existing = path
    try:
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
    except OSError as err:  # a name longer than the file system holds: not even looked at
        raise ConfigError(f"{key}={value!r} is invalid: {err.strerror or err}; {allowed}") from None
    if not existing.is_dir():
        what = "is a file" if existing == path else f"is under the file {existing}"
        raise ConfigError(f"{key}={value!r} is invalid: it {what}; {allowed}")
    try:
        if not os.access(existing, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        with tempfile.TemporaryFile(dir=existing, prefix=".distbench-write-check-"):
            pass
    except OSError as err:
        where = "" if existing == path else f" (in {existing}, to create it)"
        raise ConfigError(
            f"{key}={value!r} is invalid: cannot write there{where}: "
            f"{err.strerror or err}; {allowed}"
        ) from None


def check_hydra_dir(hydra: DictConfig, *, sweep: bool) -> None:
    """The directory Hydra creates for a single run (`hydra.run.dir`) or a sweep
    (`hydra.sweep.dir`) is a path the file system can hold and this user can create: Hydra
    makes it before any of distbench's code runs, and a failure there is a traceback."""
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    value = str(OmegaConf.select(hydra, key.removeprefix("hydra.")))
    refused = allowed(Accepts("path", path="create"), value)
    if refused is not None:
        raise ConfigError(f"{key}={shown(value)} is invalid: {refused}")
    check_writable_dir(key, value)


def check_launcher(hydra: DictConfig, *, sweep: bool) -> None:
    """The launcher's own settings (`hydra.launcher.*`), and that SLURM is there to submit a
    sweep to; a single run (no -m) runs here whatever the launcher."""
    launcher = hydra.launcher
    if "timeout_min" in launcher:
        timeout = launcher.timeout_min
        require(
            isinstance(timeout, int) and timeout >= 1,
            "hydra.launcher.timeout_min",
            timeout,
            "minutes one cell may run; allowed: 1 or more",
        )
    if "grace_after_result_s" in launcher:
        grace = launcher.grace_after_result_s
        require(
            isinstance(grace, (int, float))
            and not isinstance(grace, bool)
            and math.isfinite(grace)
            and grace >= 0,
            "hydra.launcher.grace_after_result_s",
            grace,
            "seconds a cell's other workers may outlive its record; allowed: a number, 0 or more",
        )
    if "remeasure_sample" in launcher:  # its type (and remeasure_seed's) is the launcher's
        sample = launcher.remeasure_sample
        require(
            sample >= 0,
            "hydra.launcher.remeasure_sample",
            sample,
            "finished cells chosen at random to measure again; allowed: 0 (none) or more",
        )
    if "passes" in launcher:  # its type is the launcher's
        passes = launcher.passes
        require(
            1 <= passes <= MAX_PASSES,
            "hydra.launcher.passes",
            passes,
            f"runs of every cell, one pass over the sweep after another; allowed: 1 to "
            f"{MAX_PASSES}",
        )
    if sweep and is_slurm_launcher(hydra) and shutil.which("sbatch") is None:
        raise ConfigError(
            "hydra/launcher=submitit_slurm is invalid here: SLURM is not "
            "installed (no sbatch on PATH); allowed: serial_local (the default, "
            "or submitit_local) to run the cells on this machine"
        )


def is_slurm_launcher(hydra: DictConfig) -> bool:
    """True when the sweep's cells go to SLURM (`hydra/launcher=submitit_slurm`)."""
    return str(hydra.launcher.get("_target_", "")).endswith("SlurmCellsLauncher")
