"""A plan's memory per worker: each term where the plan puts it (synthetic facts: a network of
an embedding, four blocks and a head, each saving its output only)."""

from __future__ import annotations

import pytest

from harness.config.schema import DistbenchConfig
from harness.costs.terms import CellFacts, LayerFacts
from harness.distributions.mesh.rank_memory import memory_per_worker
from tests.unit.harness.distributions.mesh.cells import plan_cell

WEIGHTS = (40.0, 10.0, 10.0, 10.0, 10.0, 40.0)  # embedding, four blocks, head


def _facts() -> CellFacts:
    layers = [
        LayerFacts(weights_mb=mb, activation_mb_per_sample=2.0, compute_share=1 / 6)
        for mb in WEIGHTS
    ]
    return CellFacts(
        weights_mb=sum(WEIGHTS),
        gradient_mb=sum(WEIGHTS),
        input_mb_per_sample=0.01,
        layers=layers,
        step_seconds=1.0,
        step_batch=2,
        runtime_mb=100.0,
    )


def _config(*overrides: str) -> DistbenchConfig:
    return plan_cell("run.global_batch=8", *overrides)


def test_fsdp_shards_every_weight_over_the_workers() -> None:
    (one, *_) = memory_per_worker(_config(), _facts())  # fsdp4
    assert one.weights == pytest.approx(sum(WEIGHTS) / 4)
    assert one.optimizer == pytest.approx(one.weights)  # SGD's momentum: one buffer a weight
    assert one.buffers > 0  # the gathered units
    assert one.runtime == 100.0


def test_tensor_parallelism_splits_the_blocks_not_the_embedding_or_head() -> None:
    workers = memory_per_worker(_config("distribution.tp=2"), _facts())  # fsdp2 x tp2
    assert workers[0].weights == pytest.approx((40 + 40 + 4 * 10 / 2) / 2)


def test_a_pipeline_worker_holds_its_stage_and_its_micro_batches_in_flight() -> None:
    config = _config("distribution.pp=2", "distribution.dp_shard=1", "distribution.dp_replicate=2")
    first, *_, last = memory_per_worker(config, _facts())
    # stages [embedding, 2 blocks] and [2 blocks, head]
    assert first.weights == pytest.approx(60.0) and last.weights == pytest.approx(60.0)
    # 1F1B over 2 stages keeps 2 micro-batches (of 2 sequences) of its 3 layers' outputs
    assert first.activations == pytest.approx(2 * 2 * 3 * 2.0, rel=0.05)


def test_checkpointing_keeps_inputs_and_bf16_halves() -> None:
    plain = memory_per_worker(_config(), _facts())[0]
    checkpointed = memory_per_worker(
        _config("distribution.activation_checkpointing=full"), _facts()
    )[0]
    assert checkpointed.activations < plain.activations
    halved = memory_per_worker(_config("distribution.precision=bf16"), _facts())[0]
    assert halved.weights == pytest.approx(plain.weights / 2)
    assert halved.activations == pytest.approx(plain.activations / 2)
