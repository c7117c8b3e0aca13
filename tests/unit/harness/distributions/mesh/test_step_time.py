"""A plan's epoch on CPU workers, by cause: each term where the plan puts it (synthetic facts:
an embedding, four blocks and a head of equal compute; the links local_4cpu's config gives)."""

from __future__ import annotations

import pytest

from harness.config.schema import DistbenchConfig
from harness.costs.terms import CellFacts, LayerFacts, batches_per_epoch
from harness.distributions.mesh.step_time import epoch_terms
from harness.profiles.hardware import HardwareProfile
from tests.unit.harness.distributions.mesh.cells import plan_cell

STEP_S = 0.6  # the sequential step at the micro-batch: 0.1 s a layer


def _facts() -> CellFacts:
    layers = [
        LayerFacts(
            weights_mb=10.0,
            activation_mb_per_sample=1.0,
            compute_share=1 / 6,
            forward_share=1 / 18,
            backward_share=2 / 18,
        )
        for _ in range(6)
    ]
    return CellFacts(
        weights_mb=60.0,
        gradient_mb=60.0,
        input_mb_per_sample=0.01,
        layers=layers,
        step_seconds=STEP_S,
        step_batch=2,
    )


def _config(*overrides: str) -> DistbenchConfig:
    return plan_cell(
        "dataset.num_samples=64",
        "run.global_batch=16",
        "distribution.micro_batch_size=2",
        *overrides,
    )


def _terms(*overrides: str):  # type: ignore[no-untyped-def]
    config = _config(*overrides)
    return config, epoch_terms(config, _facts(), HardwareProfile.from_config(config.hardware))


def test_a_pipeline_pays_every_micro_batch_and_its_bubble() -> None:
    config, terms = _terms("distribution.pp=2", "distribution.schedule=1f1b")
    # dp2 x pp2: 4 micro-batches of 2 per step; each worker holds 3 layers: 0.3 s a micro-batch
    steps = batches_per_epoch(config)
    assert terms.compute_s == pytest.approx(steps * (4 + 2 - 1) * 0.3)
    assert terms.transfer_s > 0


def test_zero_bubble_leaves_only_the_forwards_share_of_the_bubble() -> None:
    _, one_f_one_b = _terms("distribution.pp=2", "distribution.schedule=1f1b")
    _, zero_bubble = _terms("distribution.pp=2", "distribution.schedule=zbv")
    assert zero_bubble.compute_s < one_f_one_b.compute_s


def test_tensor_parallelism_halves_the_blocks_and_adds_their_collectives() -> None:
    config, tensor = _terms("distribution.tp=2")
    steps = batches_per_epoch(config)
    # fsdp2 x tp2: 4 micro-batches a step; embedding and head whole, four blocks halved
    assert tensor.compute_s == pytest.approx(steps * 4 * (0.2 + 4 * 0.1 / 2))
    _, data = _terms("distribution.tp=1")
    assert tensor.allreduce_s > 0 and data.allreduce_s > 0


def test_checkpointing_runs_the_forward_again() -> None:
    _, plain = _terms()
    _, full = _terms("distribution.activation_checkpointing=full")
    assert full.compute_s == pytest.approx(plain.compute_s * 4 / 3)
