"""What a run needs to be reproduced and compared: versions, devices, host, code revision, and
how busy and how clocked the machine was as the cell started (`start_conditions`)."""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

import torch

from harness.measure.allocator import host_allocator
from harness.runtime.seeding import determinism_facts

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # harness/runtime/environment.py
CPU_SYSFS = Path("/sys/devices/system/cpu")
UNAVAILABLE = "unavailable"


def capture_environment(device: torch.device) -> dict[str, str]:
    """Facts about software and hardware, as strings (they become MLflow tags); a library or
    device that is not there reads "none"."""
    commit, dirty = git_revision()
    facts = {
        "distbench_version": _version("distbench"),
        "git_commit": commit,
        "git_dirty": str(dirty).lower(),
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "torchvision_version": _version("torchvision"),
        "horovod_version": _version("horovod", missing="none"),
        "mlperf_logging_version": _version("mlperf-logging"),
        "mlflow_version": _version("mlflow"),
        "hydra_version": _version("hydra-core"),
        **accelerator_libraries(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_capability": cpu_capability(),
        "cpu_count": str(os.cpu_count()),
        "torch_threads": str(torch.get_num_threads()),
        "host_allocator": host_allocator(),
        "device_type": device.type,
        "device_name": device_name(device),
        "cuda_device_count": str(torch.cuda.device_count()),
        "cuda_device_names": cuda_device_names(),
        "gpu_driver_version": gpu_driver_version(),
        # Outside SLURM the cell's one node is this host.
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", "none"),
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST", socket.gethostname()),
    }
    return {**facts, **determinism_facts()}


def start_conditions() -> dict[str, str]:
    """The machine as a cell starts, as strings (MLflow tags): its load average over 1, 5 and
    15 minutes (other jobs slow a cell down), the CPU frequency governors in use (`powersave`
    clocks down), and its CPU count. Kept for telling a slow cell from a busy machine; the
    analysis does not use them yet."""
    one, five, fifteen = os.getloadavg()
    return {
        "load_average_1min": f"{one:.2f}",
        "load_average_5min": f"{five:.2f}",
        "load_average_15min": f"{fifteen:.2f}",
        "cpu_governor": cpu_governor(),
        "cpu_count": str(os.cpu_count()),
    }


def cpu_governor(sysfs: Path = CPU_SYSFS) -> str:
    """The cpufreq scaling governors of the CPUs, distinct ones comma-separated
    ("performance"), or "unavailable" where the kernel exposes none (a VM, a container)."""
    governors = set()
    for path in sysfs.glob("cpu[0-9]*/cpufreq/scaling_governor"):
        try:
            governors.add(path.read_text().strip())
        except OSError:
            continue
    return ",".join(sorted(governors - {""})) or UNAVAILABLE


def accelerator_libraries() -> dict[str, str]:
    """The CUDA, cuDNN and NCCL versions torch is built with and loads ("none" without)."""
    import torch.distributed as dist

    nccl = "none"
    if dist.is_available() and dist.is_nccl_available():
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "cuda_version": torch.version.cuda or "none",
        "cudnn_version": str(cudnn) if cudnn else "none",
        "nccl_version": nccl,
    }


def cuda_device_names() -> str:
    """The visible CUDA devices' names, comma-separated, or "none"."""
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return ", ".join(names) or "none"


@cache
def gpu_driver_version() -> str:
    """The NVIDIA kernel driver's version, or "none" where there is no NVIDIA driver."""
    try:  # the driver's own file: no process to start
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        match = re.search(r"Kernel Module\s+(\S+)", first)
        if match:
            return match.group(1)
    except (OSError, IndexError):
        pass
    try:
        query = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return query.stdout.splitlines()[0].strip() or "none"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "none"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def machine_label(tags: dict[str, str]) -> str:
    """The machine a cell ran on, from its recorded environment (`capture_environment`'s
    tags): the device's name and, on a CPU, the instruction set torch's kernels used ("AMD EPYC
    (AVX2)"); "" where either is not recorded. Times measured under two labels are not
    comparable: the CPU's name alone did not tell this VM's hosts apart (`cpu_capability`)."""
    name = tags.get("device_name", "")
    if tags.get("device_type") != "cpu":
        return name
    capability = tags.get("cpu_capability", "")
    return f"{name} ({capability})" if name and capability else ""


def machine_name(device_type: str) -> str:
    """This machine's `machine_label` for a device of kind `device_type` ("cpu", "cuda": the
    first GPU), under which measurements are kept (`harness.predict.facts`) so that a step
    time taken on another machine is never reused here as if it were this one's."""
    if device_type == "cuda":
        return torch.cuda.get_device_name(0)
    return machine_label(
        {"device_type": "cpu", "device_name": cpu_model(), "cpu_capability": cpu_capability()}
    )


@cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_capability() -> str:
    """The instruction set torch's CPU kernels dispatch to here (`AVX512`, `AVX2`, ...).

    Recorded because the model name does not tell hosts apart: this VM read "AMD EPYC" on every day,
    and on 2026-12-02 came up where torch chose AVX2 kernels, the reference kernel reading 93 ms
    against 17-30 ms on earlier days
    (docs/benchmarks/2026-12-02-probe-length-slow-and-noisy-hosts.md, "A slower host, and the
    machine a cell ran on recorded (2026-12-02)")."""
    return str(torch.backends.cpu.get_cpu_capability())


@cache
def git_revision() -> tuple[str, bool]:
    """(commit, dirty) of the distbench checkout, or ("unknown", False) outside git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()

    try:
        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


def _version(package: str, missing: str = "unknown") -> str:
    """An installed distribution's version (read from its metadata, without importing it)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return missing
