"""A GPU priced from its data sheet: matrix multiplies at a share of peak that depends on their
shape, fused attention at its kernel's share, element-wise work at memory bandwidth.

Where no step was timed on the device (`harness.profiles.steps`), this is what a plan's compute
costs: a roofline, no profiling. Its two efficiencies are published kernel measurements, not
fitted to the tables it is checked against (`docs/planner.md` names their sources).
"""

from __future__ import annotations

from dataclasses import dataclass

# The size of a GEMM's smallest dimension at which it reaches half of its largest GEMMs'
# efficiency: tensor-core tiles are 64-256 wide, so a 128-wide dimension wastes about half a
# wave. Smaller shapes (a tensor-parallel degree of 8 on a 4096-wide model, a micro-batch of
# one short sequence) lose efficiency by `d / (d + GEMM_HALF_DIMENSION)`.
GEMM_HALF_DIMENSION = 128
# A causal attention kernel skips the masked half of the score matrix.
CAUSAL_SHARE = 0.5
# A fused attention backward does 2.5 x its forward's FLOPs (FlashAttention-2, Dao 2023: five
# matrix multiplies against two).
ATTENTION_BACKWARD_FACTOR = 2.5
# Share of the data sheet's memory bandwidth a streaming element-wise kernel reaches (STREAM-
# like copies reach 80-90 % of HBM peak).
BANDWIDTH_EFFICIENCY = 0.8


@dataclass(frozen=True)
class Accelerator:
    """A GPU's data-sheet figures, per device, dense (no sparsity)."""

    name: str
    bf16_flops: float  # FLOP/s, 16-bit tensor cores
    fp32_flops: float  # FLOP/s, float32 (what `precision=fp32` computes in)
    memory_bandwidth: float  # bytes/s of HBM
    # The largest bf16 GEMMs' share of `bf16_flops` as the vendor's cuBLAS measurements show.
    matmul_efficiency: float
    # A fused attention kernel's share of `bf16_flops`, forward and backward.
    attention_efficiency: float

    def peak(self, sixteen_bit: bool) -> float:
        return self.bf16_flops if sixteen_bit else self.fp32_flops


def gemm_efficiency(accelerator: Accelerator, smallest_dimension: float) -> float:
    """A GEMM's share of peak: its largest shapes' share, less the tiles a small dimension
    leaves idle."""
    d = max(smallest_dimension, 1.0)
    return accelerator.matmul_efficiency * d / (d + GEMM_HALF_DIMENSION)


def matmul_seconds(
    accelerator: Accelerator, flops: float, smallest_dimension: float, sixteen_bit: bool
) -> float:
    """Seconds of matrix multiplies of `flops` whose smallest dimension is as given."""
    rate = accelerator.peak(sixteen_bit) * gemm_efficiency(accelerator, smallest_dimension)
    return flops / rate


def attention_seconds(accelerator: Accelerator, flops: float, sixteen_bit: bool) -> float:
    """Seconds of a fused attention kernel's `flops` (causal skipping already counted by the
    caller); float32 attention runs unfused at the float32 matmul rate."""
    if not sixteen_bit:
        return flops / (accelerator.fp32_flops * accelerator.matmul_efficiency)
    return flops / (accelerator.bf16_flops * accelerator.attention_efficiency)


def memory_bound_seconds(accelerator: Accelerator, bytes_moved: float) -> float:
    """Seconds of element-wise work that moves `bytes_moved` through HBM."""
    return bytes_moved / (accelerator.memory_bandwidth * BANDWIDTH_EFFICIENCY)
