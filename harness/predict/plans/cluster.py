"""A hardware config as the plan costs see it: GPUs per node, one GPU's data sheet, its memory
as torch can use it, and the links inside and between nodes."""

from __future__ import annotations

from harness.config.schema import ConfigError, HardwareConfig
from harness.costs.accelerator import Accelerator
from harness.costs.collectives import Link
from harness.costs.plan_step import GIB, Cluster

# A data sheet's "80 GB" of HBM are 80 GiB; CUDA keeps some for itself (an 80 GB H100 shows torch
# 79.1 GiB: scripts/gpu_check.sh's run, docs/benchmarks/2026-11-25-cuda-h100-h200.md).
USABLE_SHARE = 79.1 / 80


def cluster_of(hardware: HardwareConfig) -> Cluster:
    """The cluster `hardware` describes; refused in one line without the data sheet, memory
    or links the plan costs need."""
    sheet = hardware.accelerator
    missing = [
        name
        for name, value in (
            ("hardware.accelerator", sheet),
            ("hardware.device_memory_gb", hardware.device_memory_gb),
            ("hardware.intra_node_bandwidth_mbps", hardware.intra_node_bandwidth_mbps),
        )
        if value is None
    ]
    if hardware.nodes > 1 and hardware.inter_node_bandwidth_mbps is None:
        missing.append("hardware.inter_node_bandwidth_mbps")
    if missing or sheet is None:
        raise ConfigError(
            f"hardware={hardware.name} is invalid for planning: it lacks {', '.join(missing)}; "
            f"allowed: a GPU config with a data sheet (conf/hardware/: a100_40gb_node, "
            f"a100_80gb_node, a100_80gb_cluster, h100_node, h100_cluster, h100_hbm2e_cluster, "
            f"h200_node, b200_node)"
        )
    accelerator = Accelerator(
        name=sheet.name or hardware.name,
        bf16_flops=sheet.bf16_tflops * 1e12,
        fp32_flops=sheet.fp32_tflops * 1e12,
        memory_bandwidth=sheet.memory_bandwidth_gbs * 1e9,
        matmul_efficiency=sheet.matmul_efficiency,
        attention_efficiency=sheet.attention_efficiency,
    )
    intra = Link(
        bandwidth=float(hardware.intra_node_bandwidth_mbps or 0) * 1e6,
        latency=(hardware.intra_node_latency_us or 0.0) * 1e-6,
    )
    inter = None
    if hardware.inter_node_bandwidth_mbps is not None:
        inter = Link(
            bandwidth=hardware.inter_node_bandwidth_mbps * 1e6,
            latency=(hardware.inter_node_latency_us or 0.0) * 1e-6,
        )
    return Cluster(
        nodes=hardware.nodes,
        gpus_per_node=hardware.workers_per_node,
        accelerator=accelerator,
        memory_bytes=float(hardware.device_memory_gb or 0) * GIB * USABLE_SHARE,
        intra_node=intra,
        inter_node=inter if hardware.nodes > 1 else None,
    )
