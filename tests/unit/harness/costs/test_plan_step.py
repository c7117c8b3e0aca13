"""The plan costs against the closed forms they are built on: Korthikanti et al.'s activation
bytes, the schedules' bubbles, ring collectives, a decoder's parameters and FLOPs."""

from __future__ import annotations

import math

import pytest

from harness.costs.accelerator import Accelerator
from harness.costs.collectives import (
    LINK_EFFICIENCY,
    Link,
    all_gather_seconds,
    all_reduce_seconds,
)
from harness.costs.plan_step import (
    GIB,
    Cluster,
    PlanShape,
    axis_link,
    predict_memory,
    predict_step,
)
from harness.costs.schedules import bubble_seconds, in_flight, pipeline_seconds
from harness.costs.transformer import (
    Recompute,
    TransformerShape,
    block_activations,
    korthikanti_layer_bytes,
    saved_activation_bytes,
)

# GPT-3 175B as Korthikanti et al. counted it: unfused attention, dropout, MLP 4h.
GPT_175B = TransformerShape(
    layers=96,
    hidden=12288,
    heads=96,
    kv_heads=96,
    ffn=4 * 12288,
    vocab=51200,
    seq_len=2048,
    gated_mlp=False,
    tied_embeddings=True,
    dropout=True,
    flash_attention=False,
)
LLAMA3_8B = TransformerShape(
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    ffn=14336,
    vocab=128256,
    seq_len=8192,
    gated_mlp=True,
    tied_embeddings=False,
)
H100 = Accelerator("H100", 989e12, 67e12, 3350e9, 0.7, 0.35)


def _cluster(nodes: int = 1) -> Cluster:
    return Cluster(
        nodes=nodes,
        gpus_per_node=8,
        accelerator=H100,
        memory_bytes=79.1 * GIB,
        intra_node=Link(450e9, 3e-6),
        inter_node=Link(50e9, 5e-6) if nodes > 1 else None,
    )


@pytest.mark.parametrize(
    ("tp", "sequence_parallel"), [(1, False), (2, False), (8, False), (2, True), (8, True)]
)
def test_counted_activations_are_korthikantis_closed_form_on_the_shape_it_was_written_for(
    tp: int, sequence_parallel: bool
) -> None:
    """sbh(34 + 5as/h), sbh(10 + 24/t + 5as/(ht)), sbh/t (34 + 5as/h): counted tensor by
    tensor, the same bytes."""
    counted = saved_activation_bytes(GPT_175B, 1, tp, sequence_parallel)
    closed = korthikanti_layer_bytes(GPT_175B, 1, tp, sequence_parallel, Recompute.none)
    # a fused kernel's log-sum-exp is absent here (unfused attention): exact
    assert counted == pytest.approx(closed, rel=1e-12)


def test_selective_and_full_recomputation_keep_what_korthikanti_says() -> None:
    s, b, h, t = GPT_175B.seq_len, 1, GPT_175B.hidden, 8
    selective = block_activations(GPT_175B, b, t, True, Recompute.attention)
    assert selective.kept_bytes == pytest.approx(34 * s * b * h / t)
    assert korthikanti_layer_bytes(GPT_175B, b, t, True, Recompute.attention) == pytest.approx(
        34 * s * b * h / t
    )
    full = block_activations(GPT_175B, b, t, False, Recompute.full)
    assert full.kept_bytes == 2 * s * b * h and full.recompute_share == 1.0


def test_every_second_block_recomputed_keeps_half_of_each() -> None:
    none = block_activations(LLAMA3_8B, 1, 1, False, Recompute.none).kept_bytes
    full = block_activations(LLAMA3_8B, 1, 1, False, Recompute.full).kept_bytes
    half = block_activations(LLAMA3_8B, 1, 1, False, Recompute.layers, every=2)
    assert half.kept_bytes == pytest.approx((none + full) / 2)
    assert half.recompute_share == 0.5


def test_llama3_8b_has_its_published_parameters_and_flops() -> None:
    # 8.03 B parameters; model FLOPs per token 6N + 12 L h s (N without the embedding, as
    # the PaLM paper's appendix counts them)
    assert LLAMA3_8B.params == 8_030_261_248
    n = LLAMA3_8B.params - LLAMA3_8B.embedding_params
    expected = 6 * n + 12 * 32 * 4096 * 8192
    assert LLAMA3_8B.model_flops_per_token == pytest.approx(expected, rel=1e-3)


def test_schedules_bubbles_are_their_papers() -> None:
    f, b, p, m = 1.0, 2.0, 4, 8
    assert bubble_seconds("1f1b", p, 1, f, b) == (p - 1) * (f + b)
    assert bubble_seconds("gpipe", p, 1, f, b) == (p - 1) * (f + b)
    assert bubble_seconds("interleaved_1f1b", p, 2, f, b) == (p - 1) * (f + b) / 2
    assert bubble_seconds("zbv", p, 2, f, b) == (p - 1) * f / 2
    assert pipeline_seconds("1f1b", p, 1, m, f, b) == (m + p - 1) * (f + b)
    assert pipeline_seconds("1f1b", 1, 1, m, f, b) == m * (f + b)


def test_schedules_keep_their_papers_micro_batches_in_flight() -> None:
    assert in_flight("gpipe", 4, 1, 16) == 16
    assert in_flight("1f1b", 4, 1, 16) == 4
    assert in_flight("1f1b", 4, 1, 2) == 2
    # Megatron's interleaved warm-up on the first rank: 2(p-1) + (v-1)p + 1 chunks of 1/v
    assert in_flight("interleaved_1f1b", 4, 2, 16) == (2 * 3 + 4 + 1) / 2
    assert in_flight("1f1b", 1, 1, 16) == 1


def test_ring_collectives_move_their_share_of_the_buffer() -> None:
    link = Link(bandwidth=100e9, latency=0.0)
    size = 8e9
    assert all_gather_seconds(link, size, 8) == pytest.approx(
        7 / 8 * size / (100e9 * LINK_EFFICIENCY)
    )
    assert all_reduce_seconds(link, size, 8) == pytest.approx(2 * all_gather_seconds(link, size, 8))
    assert all_reduce_seconds(link, size, 1) == 0


def test_an_axis_across_nodes_leaves_through_one_adapter_per_rank_in_a_node() -> None:
    cluster = _cluster(nodes=4)
    assert axis_link(cluster, stride=1, size=8) is cluster.intra_node  # inside a node
    across = axis_link(cluster, stride=1, size=32)  # 8 ranks per node, 8 adapters
    assert across.bandwidth == min(450e9, 8 * 50e9)
    one_per_node = axis_link(cluster, stride=8, size=4)  # tensor parallel 8 inside
    assert one_per_node.bandwidth == 50e9


def test_memory_shards_and_splits_as_the_plan_says() -> None:
    base = PlanShape(dp_replicate=1, dp_shard=1, tp=1, pp=1, global_batch=1, micro_batch=1)
    fsdp = PlanShape(dp_replicate=1, dp_shard=8, tp=1, pp=1, global_batch=8, micro_batch=1)
    tp = PlanShape(dp_replicate=1, dp_shard=1, tp=8, pp=1, global_batch=1, micro_batch=1)
    one, sharded, split = (predict_memory(LLAMA3_8B, plan) for plan in (base, fsdp, tp))
    assert sharded.optimizer == pytest.approx(one.optimizer / 8)
    assert split.weights == pytest.approx(one.weights / 8)
    # bf16_mixed keeps float32 weights, gradients and both of Adam's moments: 16 bytes a weight
    assert one.weights + one.gradients + one.optimizer == pytest.approx(16 * LLAMA3_8B.params)


def test_a_step_adds_up_and_sharding_wider_trades_optimizer_time_for_traffic() -> None:
    plan = PlanShape(dp_replicate=1, dp_shard=8, tp=1, pp=1, global_batch=16, micro_batch=2)
    step = predict_step(LLAMA3_8B, plan, _cluster())
    parts = step.bubble + step.data_parallel + step.optimizer + step.compute
    assert step.seconds == pytest.approx(parts + step.tensor_parallel + step.pipeline_sends)
    assert step.bound == "compute"
    assert 0 < step.mfu < H100.matmul_efficiency
    wider = PlanShape(dp_replicate=1, dp_shard=32, tp=1, pp=1, global_batch=64, micro_batch=2)
    across = predict_step(LLAMA3_8B, wider, _cluster(4))
    assert across.compute == pytest.approx(step.compute)  # the same work per GPU
    assert across.optimizer == pytest.approx(step.optimizer / 4)  # a quarter of the shard
    assert across.data_parallel > step.data_parallel  # over the adapters, not NVLink


def test_a_pipeline_pays_its_bubble_and_tensor_parallelism_its_collectives() -> None:
    pipeline = PlanShape(
        dp_replicate=1, dp_shard=1, tp=1, pp=8, global_batch=8, micro_batch=1, schedule="1f1b"
    )
    step = predict_step(LLAMA3_8B, pipeline, _cluster())
    assert step.bubble > 0 and step.tensor_parallel == 0
    assert math.isclose(step.bubble / (step.seconds - step.optimizer), 7 / 15, rel_tol=0.05)
    tensor = PlanShape(dp_replicate=1, dp_shard=1, tp=8, pp=1, global_batch=1, micro_batch=1)
    assert predict_step(LLAMA3_8B, tensor, _cluster()).tensor_parallel > 0
