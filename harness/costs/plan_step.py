"""One training step of a plan (data x tensor x pipeline parallel, a schedule, recomputation,
precision) on a GPU cluster from its data sheets: seconds, by cause, and bytes per rank.

The mesh is `pp x dp_replicate x dp_shard x tp`, outermost first (torchtitan's order and
`distribution=mesh`'s): tensor parallelism on neighbouring ranks, inside a node while it fits
there; an axis whose ranks span more than one node talks over the inter-node link, at each
GPU's own adapter's rate.

A step, on the slowest rank:

- compute: each block's matrix multiplies, attention and element-wise work, forward and
  backward (twice the forward's multiplies, 2.5 x its attention), plus what recomputation
  reruns; the first rank's embedding and the last rank's output head and loss;
- tensor parallelism: per block and micro-batch, two all-reduces of the block's
  `tokens x h` activations forward and two backward (with sequence parallelism, an all-gather
  and a reduce-scatter in place of each: the same bytes), again for what is recomputed; not
  overlapped (no asynchronous TP);
- the pipeline: every micro-batch's work plus the schedule's bubble (`harness.costs.schedules`);
  each chunk sends its activations forward and their gradients back, on the critical path;
- data parallelism: FSDP2 all-gathers each block's weights before its forward and again
  before its backward (once per step with a pipeline, which keeps them gathered), and
  reduce-scatters the gradients once per step; HSDP then all-reduces each shard over the
  replicas; plain replication all-reduces the gradients. These overlap the compute they run
  beside: only what exceeds it, and the first gather and last reduction, are exposed;
- the optimizer: Adam's update reads and writes every local weight, gradient and state at
  memory bandwidth.

Memory per rank: weights, gradients and optimizer state (sharded over `dp_shard`, split over
`tp` and the stages), FSDP's gathered blocks, the activations the schedule keeps in flight
(`harness.costs.transformer.block_activations`), one block's recomputed activations, the
last rank's logits, and the CUDA context and communicators' buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.costs.accelerator import (
    ATTENTION_BACKWARD_FACTOR,
    CAUSAL_SHARE,
    Accelerator,
    attention_seconds,
    matmul_seconds,
    memory_bound_seconds,
)
from harness.costs.collectives import (
    Link,
    all_gather_seconds,
    all_reduce_seconds,
    reduce_scatter_seconds,
    send_seconds,
)
from harness.costs.schedules import in_flight, pipeline_seconds
from harness.costs.transformer import (
    Activations,
    Recompute,
    TransformerShape,
    block_activations,
    korthikanti_layer_bytes,
    saved_activation_bytes,
)

GIB = 2**30
# The CUDA context, cuBLAS workspaces and NCCL's communicator buffers on every rank, outside
# the caching allocator's peak (about 0.5 GiB of context on an H100, NCCL a few hundred MB per
# communicator).
RUNTIME_RESERVED_BYTES = 1.0 * GIB
# Bytes per element of what a precision keeps: weights, gradients, each optimizer moment; and
# what it gathers (FSDP's param_dtype) and reduces (reduce_dtype) in.
PRECISION_BYTES = {
    "fp32": {"weight": 4, "gradient": 4, "state": 4, "gather": 4, "reduce": 4, "compute": 4},
    "bf16_mixed": {"weight": 4, "gradient": 4, "state": 4, "gather": 2, "reduce": 4, "compute": 2},
    "bf16": {"weight": 2, "gradient": 2, "state": 2, "gather": 2, "reduce": 2, "compute": 2},
}
# The output head's logits per token and vocabulary entry at the loss's peak: 16-bit logits, the
# float32 log-probabilities cross-entropy keeps, their float32 gradient.
LOGIT_BYTES = {2: 2 + 4 + 4, 4: 4 + 4 + 4}
# Bytes per attention score an unfused softmax moves forward: the scaled, masked scores read
# and the probabilities written (2 + 2), dropout's read, write and mask (2 + 2 + 1).
SCORE_BYTES = 9
# Eager PyTorch's element-wise work against fused kernels', counted kernel by kernel on
# torchtitan's Llama block: RMSNorm upcast to float32 in seven kernels, rotary embedding as
# float32 complex products, SiLU and the gate's product apart: 590 against 188 bytes per token
# and hidden unit forward (Megatron-LM fuses them: `PlanShape.fused_elementwise`).
EAGER_ELEMENTWISE_FACTOR = 3.0
# The share of the GPU's streaming multiprocessors NCCL's kernels occupy while a collective
# overlaps compute (16 channels, one block each, of an A100's 108 or an H100's 132): compute
# beside a collective runs that much slower.
COLLECTIVE_SM_SHARE = 0.15
# Passes over the logits: the loss's forward (cast, log-softmax, gather) and backward.
LOGIT_PASSES = 9


@dataclass(frozen=True)
class Cluster:
    """Nodes of identical GPUs: what the plan's collectives and memory run on."""

    nodes: int
    gpus_per_node: int
    accelerator: Accelerator
    memory_bytes: float  # one GPU's HBM as torch can use it
    intra_node: Link
    inter_node: Link | None  # None on one node

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class PlanShape:
    """A plan's degrees and choices, as `distribution=mesh` takes them."""

    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    global_batch: int  # sequences per optimizer step, over every data-parallel position
    micro_batch: int  # sequences per micro-batch
    schedule: str = "1f1b"
    virtual: int = 1  # stages per pipeline rank
    sequence_parallel: bool = False
    recompute: Recompute = Recompute.none
    recompute_every: int = 1  # for Recompute.layers
    precision: str = "bf16_mixed"
    optimizer_states: int = 2  # Adam's two moments
    # Element-wise work in fused kernels (Megatron-LM); False: eager PyTorch's kernels, as
    # distbench and torchtitan train without torch.compile.
    fused_elementwise: bool = False

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp

    @property
    def data_parallel(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step on each data-parallel position."""
        return self.global_batch // (self.data_parallel * self.micro_batch)


@dataclass(frozen=True)
class StepPrediction:
    """A step's seconds by cause, and what bounds it."""

    seconds: float
    compute: float  # forward and backward, every micro-batch, on the slowest rank
    recompute: float  # recomputation's share of `compute`
    bubble: float
    tensor_parallel: float
    pipeline_sends: float
    data_parallel: float  # exposed
    optimizer: float
    tokens_per_s_per_gpu: float
    mfu: float  # model FLOPs (no recomputation) over the data sheet's peak

    @property
    def bound(self) -> str:
        """What takes the most of the step: compute, bubble, tensor-parallel traffic,
        data-parallel traffic, pipeline sends, or the optimizer."""
        causes = {
            "compute": self.compute,
            "bubble": self.bubble,
            "tensor-parallel traffic": self.tensor_parallel,
            "data-parallel traffic": self.data_parallel,
            "pipeline sends": self.pipeline_sends,
            "optimizer": self.optimizer,
        }
        return max(causes, key=lambda cause: causes[cause])


@dataclass(frozen=True)
class MemoryPrediction:
    """Bytes on the rank that needs the most."""

    weights: float
    gradients: float
    optimizer: float
    gathered: float  # FSDP's unsharded blocks (or autocast's 16-bit weight copies)
    activations: float
    logits: float
    runtime: float
    # Korthikanti et al.'s closed form for one block, beside the counted one (cross-check).
    block_activations: float = 0.0
    korthikanti_block: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.gathered
            + self.activations
            + self.logits
            + self.runtime
        )


def axis_link(cluster: Cluster, stride: int, size: int) -> Link:
    """The link an axis of `size` ranks, `stride` apart, talks over. Inside a node: NVLink.
    Across nodes, NCCL runs one ring per rail: each of the axis's `k` ranks in a node sends its
    share of the node's traffic through its own adapter, so the node's traffic leaves at `k`
    adapters' rate (at most NVLink's); an axis with one rank per node gets one adapter."""
    if size <= 1 or cluster.inter_node is None or stride * size <= cluster.gpus_per_node:
        return cluster.intra_node
    per_node = max(1, min(size, cluster.gpus_per_node // stride))
    bandwidth = min(cluster.intra_node.bandwidth, cluster.inter_node.bandwidth * per_node)
    return Link(bandwidth=bandwidth, latency=cluster.inter_node.latency)


def _blocks_per_rank(shape: TransformerShape, plan: PlanShape) -> int:
    return math.ceil(shape.layers / plan.pp)


def _stage_params(shape: TransformerShape, plan: PlanShape) -> float:
    """Parameters of the rank holding the most: its blocks and, first or last, the embedding
    or the output head (both on one rank without a pipeline)."""
    blocks = _blocks_per_rank(shape, plan) * shape.layer_params
    if plan.pp == 1:
        return blocks + shape.embedding_params + shape.head_params + shape.hidden
    return blocks + max(shape.embedding_params, shape.head_params or shape.embedding_params)


@dataclass(frozen=True)
class _MicroBatch:
    forward: float
    backward: float
    recompute: float
    tensor_parallel: float
    sends: float


def _activations(shape: TransformerShape, plan: PlanShape) -> Activations:
    """What one block keeps and reruns under the plan, in its compute precision."""
    return block_activations(
        shape,
        plan.micro_batch,
        plan.tp,
        plan.sequence_parallel,
        plan.recompute,
        plan.recompute_every,
        PRECISION_BYTES[plan.precision]["compute"],
    )


def _recompute_share(shape: TransformerShape, plan: PlanShape) -> float:
    return _activations(shape, plan).recompute_share


def _block_forward(
    shape: TransformerShape, plan: PlanShape, accelerator: Accelerator, tokens: int
) -> tuple[float, float, float]:
    """One block's (forward, backward) of matrix multiplies and attention, and its forward's
    element-wise work, for one micro-batch of `tokens` on one tensor-parallel rank."""
    sixteen = PRECISION_BYTES[plan.precision]["compute"] == 2
    smallest = min(tokens, shape.hidden / plan.tp, shape.kv_width / plan.tp or 1)
    matmuls = matmul_seconds(
        accelerator, shape.layer_matmul_flops_per_token * tokens / plan.tp, smallest, sixteen
    )
    elements = shape.layer_elementwise_elements_per_token() * tokens / plan.tp
    passes = 1.0 if plan.fused_elementwise else EAGER_ELEMENTWISE_FACTOR
    elementwise = memory_bound_seconds(
        accelerator, elements * PRECISION_BYTES[plan.precision]["compute"] * passes
    )
    attention_flops = shape.attention_flops_per_token * tokens / plan.tp
    if shape.flash_attention:
        attention = attention_seconds(accelerator, attention_flops * CAUSAL_SHARE, sixteen)
        return matmuls + attention, matmuls * 2 + attention * ATTENTION_BACKWARD_FACTOR, elementwise
    # Unfused: the score and weighted-sum batched GEMMs over the whole square (their smallest
    # dimension the head's width), and the scores' softmax, mask and dropout streamed through
    # HBM (`SCORE_BYTES` per score forward, twice that backward).
    products = matmul_seconds(accelerator, attention_flops, shape.head_dim, sixteen)
    scores = shape.heads / plan.tp * shape.seq_len * tokens
    softmax = memory_bound_seconds(accelerator, scores * SCORE_BYTES)
    return matmuls + products, 2 * (matmuls + products), elementwise + softmax


def _micro_batch(shape: TransformerShape, plan: PlanShape, cluster: Cluster) -> _MicroBatch:
    """One micro-batch through the slowest pipeline rank's layers."""
    accelerator = cluster.accelerator
    tokens = plan.micro_batch * shape.seq_len
    compute_bytes = PRECISION_BYTES[plan.precision]["compute"]
    sixteen = compute_bytes == 2
    block_fwd_core, block_bwd_core, elementwise = _block_forward(shape, plan, accelerator, tokens)
    block_fwd = block_fwd_core + elementwise
    block_bwd = block_bwd_core + 2 * elementwise
    blocks = _blocks_per_rank(shape, plan)
    kept = _activations(shape, plan)
    # The output head (vocabulary-parallel over tp) and the loss, on the last rank.
    head_fwd = matmul_seconds(
        accelerator,
        shape.head_flops_per_token * tokens / plan.tp,
        min(tokens, shape.hidden),
        sixteen,
    )
    loss = memory_bound_seconds(accelerator, tokens * shape.vocab / plan.tp * 4 * LOGIT_PASSES)
    forward = blocks * block_fwd + head_fwd + loss / 3
    backward = blocks * block_bwd + 2 * head_fwd + 2 * loss / 3
    recompute = blocks * kept.recompute_share * block_fwd
    tp_link = axis_link(cluster, 1, plan.tp)
    message = tokens * shape.hidden * compute_bytes
    per_block = all_reduce_seconds(tp_link, message, plan.tp)
    tensor_parallel = blocks * per_block * (4 + 2 * kept.recompute_share)
    sends = 0.0
    if plan.pp > 1:
        pp_stride = plan.tp * plan.dp_shard * plan.dp_replicate
        pp_link = axis_link(cluster, pp_stride, plan.pp)
        send = send_seconds(pp_link, message / (plan.tp if plan.sequence_parallel else 1))
        sends = 2 * plan.virtual * send
    return _MicroBatch(forward, backward, recompute, tensor_parallel, sends)


def _data_parallel_exposed(
    shape: TransformerShape, plan: PlanShape, cluster: Cluster, compute: float, last_backward: float
) -> float:
    """Seconds of gradient synchronisation and weight gathering that compute does not hide."""
    if plan.data_parallel == 1:
        return 0.0
    sizes = PRECISION_BYTES[plan.precision]
    local = _stage_params(shape, plan) / plan.tp  # unsharded, on this tensor-parallel rank
    blocks = _blocks_per_rank(shape, plan)
    shard_link = axis_link(cluster, plan.tp, plan.dp_shard)
    replicate_link = axis_link(cluster, plan.tp * plan.dp_shard, plan.dp_replicate)
    if plan.dp_shard > 1:
        gathers = 2 * (plan.micro_batches if plan.pp == 1 else 1)
        gather = all_gather_seconds(shard_link, local * sizes["gather"], plan.dp_shard)
        reduce = reduce_scatter_seconds(shard_link, local * sizes["reduce"], plan.dp_shard)
        replicas = all_reduce_seconds(
            replicate_link, local / plan.dp_shard * sizes["reduce"], plan.dp_replicate
        )
        total = gathers * gather + reduce + replicas
        # The first block's gather and the last block's reduction have nothing to hide behind;
        # what is hidden slows the compute beside it.
        hidden = min(total, compute)
        edges = (gather + reduce) / blocks + replicas / blocks
        return max(0.0, total - compute) + edges + COLLECTIVE_SM_SHARE * hidden
    reduce = all_reduce_seconds(replicate_link, local * sizes["reduce"], plan.dp_replicate)
    # DDP's buckets reduce during the last micro-batch's backward.
    hidden = min(reduce, last_backward)
    return max(0.0, reduce - last_backward) + reduce / blocks + COLLECTIVE_SM_SHARE * hidden


def predict_step(shape: TransformerShape, plan: PlanShape, cluster: Cluster) -> StepPrediction:
    """Seconds of one optimizer step of `plan`, by cause (the module's docstring)."""
    micro = _micro_batch(shape, plan, cluster)
    # A third of tensor parallelism's collectives (two of six) run forward when nothing is
    # recomputed; the recomputed ones run in the backward.
    tp_forward = micro.tensor_parallel * 2 / (4 + 2 * _recompute_share(shape, plan))
    forward = micro.forward + tp_forward + micro.sends / 2
    backward = (
        micro.backward + micro.recompute + (micro.tensor_parallel - tp_forward) + micro.sends / 2
    )
    pipeline = pipeline_seconds(
        plan.schedule, plan.pp, plan.virtual, plan.micro_batches, forward, backward
    )
    m = plan.micro_batches
    compute = m * (micro.forward + micro.backward + micro.recompute)
    exposed_dp = _data_parallel_exposed(shape, plan, cluster, compute, micro.backward)
    sizes = PRECISION_BYTES[plan.precision]
    local = _stage_params(shape, plan) / plan.tp / plan.dp_shard
    update_bytes = local * (
        2 * sizes["weight"] + sizes["gradient"] + 2 * plan.optimizer_states * sizes["state"]
    )
    optimizer = memory_bound_seconds(cluster.accelerator, update_bytes)
    seconds = pipeline + exposed_dp + optimizer
    bubble = pipeline - m * (forward + backward)
    tokens = plan.global_batch * shape.seq_len
    per_gpu = tokens / seconds / plan.world
    peak = cluster.accelerator.peak(sizes["compute"] == 2)
    return StepPrediction(
        seconds=seconds,
        compute=compute,
        recompute=m * micro.recompute,
        bubble=bubble,
        tensor_parallel=m * micro.tensor_parallel,
        pipeline_sends=m * micro.sends,
        data_parallel=exposed_dp,
        optimizer=optimizer,
        tokens_per_s_per_gpu=per_gpu,
        mfu=per_gpu * shape.model_flops_per_token / peak,
    )


def predict_memory(shape: TransformerShape, plan: PlanShape) -> MemoryPrediction:
    """Bytes on the rank that needs the most (the first pipeline rank keeps the most
    activations, the last the logits: both are counted on one rank, an upper bound where
    they differ)."""
    sizes = PRECISION_BYTES[plan.precision]
    compute_bytes = sizes["compute"]
    params = _stage_params(shape, plan) / plan.tp
    local = params / plan.dp_shard
    blocks = _blocks_per_rank(shape, plan)
    block_params = shape.layer_params / plan.tp
    gathered = 0.0
    if plan.dp_shard > 1:
        # A pipeline keeps its stage gathered across micro-batches; otherwise the block being
        # computed and the one prefetched, and one block's unsharded gradients before their
        # reduce-scatter.
        kept_blocks = blocks if plan.pp > 1 else 2
        gathered = kept_blocks * block_params * sizes["gather"] + block_params * sizes["reduce"]
    elif sizes["gather"] < sizes["weight"]:
        gathered = params * sizes["gather"]  # autocast's 16-bit copies of the weights it used
    activations_of = _activations(shape, plan)
    full_block = saved_activation_bytes(
        shape, plan.micro_batch, plan.tp, plan.sequence_parallel, compute_bytes
    )
    flight = in_flight(plan.schedule, plan.pp, plan.virtual, plan.micro_batches)
    activations = flight * blocks * activations_of.kept_bytes
    if activations_of.recompute_share > 0:
        activations += full_block  # one block's activations while it is recomputed
    tokens = plan.micro_batch * shape.seq_len
    logits = tokens * shape.vocab / plan.tp * LOGIT_BYTES[compute_bytes]
    return MemoryPrediction(
        weights=local * sizes["weight"],
        gradients=local * sizes["gradient"],
        optimizer=local * sizes["state"] * plan.optimizer_states,
        gathered=gathered,
        activations=activations,
        logits=logits,
        runtime=RUNTIME_RESERVED_BYTES,
        block_activations=activations_of.kept_bytes,
        korthikanti_block=korthikanti_layer_bytes(
            shape, plan.micro_batch, plan.tp, plan.sequence_parallel, plan.recompute
        ),
    )
