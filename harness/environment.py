"""What a run needs to be reproduced and compared: versions, devices, host, code revision."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

import torch

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def capture_environment(device: torch.device) -> dict[str, str]:
    """Facts about software and hardware, as strings (they become MLflow tags)."""
    commit, dirty = git_revision()
    facts = {
        "distbench_version": _version("distbench"),
        "git_commit": commit,
        "git_dirty": str(dirty).lower(),
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "torchvision_version": _version("torchvision"),
        "mlflow_version": _version("mlflow"),
        "hydra_version": _version("hydra-core"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "torch_threads": str(torch.get_num_threads()),
        "device_type": device.type,
        "device_name": device_name(device),
        "cuda_version": str(torch.version.cuda),
        "cudnn_version": str(torch.backends.cudnn.version()) if device.type == "cuda" else "none",
        "cuda_device_count": str(torch.cuda.device_count()) if device.type == "cuda" else "0",
    }
    if "SLURM_JOB_ID" in os.environ:
        facts["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
        facts["slurm_nodelist"] = os.environ.get("SLURM_JOB_NODELIST", "")
    return facts


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


@cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@cache
def git_revision() -> tuple[str, bool]:
    """(commit, dirty) of the distbench checkout, or ("unknown", False) outside git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(PROJECT_ROOT), *args], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
    try:
        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"
