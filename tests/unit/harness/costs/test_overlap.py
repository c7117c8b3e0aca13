"""Overlap bounded by the compute each collective can hide behind: the timeline of
`harness.costs.overlap`, against values computed by hand, and what it changes for DDP and FSDP where
collectives can run beside the compute (GPUs, nodes joined by a network)."""

from __future__ import annotations

import pytest

from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.costs import overlap
from harness.costs.terms import (
    CellFacts,
    LayerFacts,
    allreduces_overlap_backward,
    communication_overlaps,
)
from harness.distributions.fsdp import step_communication_seconds
from harness.distributions.horovod import fused_mb_per_allreduce
from harness.predict.cell import epoch_terms
from harness.predict.facts.gather import needs_layer_profile
from harness.profiles.hardware import (
    COMPUTE_LOST_FACT,
    AllreduceCost,
    Cost,
    HardwareProfile,
    Link,
)


def test_a_bucket_hides_only_behind_the_backward_still_to_run() -> None:
    # Three backward chunks of 1 s; allreduces of 0.5 s each: the first two hide behind the
    # chunks after them, the last is exposed: 0.5 s.
    assert overlap.after_each_chunk([1, 1, 1], [0.5, 0.5, 0.5], overlaps=True) == pytest.approx(0.5)
    # Allreduces of 2 s: they queue on the link. Ready at 1, 2, 3; the link runs 1-3, 3-5,
    # 5-7; the compute ends at 3: 4 s exposed, not the thesis' "only the last" (2 s).
    assert overlap.after_each_chunk([1, 1, 1], [2, 2, 2], overlaps=True) == pytest.approx(4.0)
    # Where nothing can overlap (CPU workers of one machine) everything takes its turn.
    assert overlap.after_each_chunk([1, 1, 1], [0.5, 0.5, 0.5], overlaps=False) == pytest.approx(
        1.5
    )


def test_a_collective_that_takes_the_cores_lengthens_the_compute_beside_it() -> None:
    # Chunks of 1 s; allreduces of 0.5 s, each taking 0.2 s of the cores while it runs. The
    # first runs 1-1.5 beside chunk 2 (1-2.2, stretched by its 0.2 s); the second 2.2-2.7
    # beside chunk 3 (2.2-3.4); the third 3.4-3.9, after the compute: its cores' share costs
    # nothing more. Exposed: 3.9 - 3 s of compute = 0.9 s, of which 0.4 s the cores lost.
    assert overlap.after_each_chunk(
        [1, 1, 1], [0.5, 0.5, 0.5], overlaps=True, cores_s=[0.2, 0.2, 0.2]
    ) == pytest.approx(0.9)
    # An allreduce that outlasts the compute beside it takes only its share of that compute:
    # 2 s on the link, 0.4 s of the cores over them (0.2 s a second), 1 s of compute beside it.
    assert overlap.after_each_chunk(
        [1, 1], [2, 0], overlaps=True, cores_s=[0.4, 0]
    ) == pytest.approx(overlap.after_each_chunk([1, 1], [2, 0], overlaps=True))
    timeline = overlap.Timeline()
    timeline.run(overlap.LINK, 2.0, cores_s=0.4)
    assert timeline.run(overlap.COMPUTE, 1.0) == pytest.approx((0.0, 1.2))
    # Where nothing overlaps (one machine), a collective's own time holds its copies already.
    assert overlap.after_each_chunk(
        [1, 1, 1], [0.5, 0.5, 0.5], overlaps=False, cores_s=[0.2, 0.2, 0.2]
    ) == pytest.approx(1.5)


def test_a_prefetch_hides_only_behind_the_chunk_it_is_issued_under() -> None:
    # Fetch 0 (1 s) cannot hide; fetch 1 (3 s) is issued as chunk 0 (1 s) starts and ends at
    # 4, so chunk 1 starts at 4 instead of 2: 1 + 2 s waited. Chunk 1 (1 s) ends at 5.
    timeline, ends = overlap.prefetched([1, 1], [1, 3], overlaps=True)
    assert ends == pytest.approx([2, 5])
    assert timeline.exposed_s == pytest.approx(3.0)


def _profile() -> HardwareProfile:
    link = Link(0, 1, False, Cost(50e-6, 1000e6))  # 1 GB/s between two GPUs of two nodes
    return HardwareProfile("pair", "probe", 2, 2, [link], [AllreduceCost(2, Cost(50e-6, 1e9))])


def _vgg_like(step_seconds: float = 0.1) -> CellFacts:
    """Two small convolutional units that carry the compute, then one 400 MB classifier unit
    that computes almost nothing (VGG's first classifier layer, on a GPU)."""
    conv = LayerFacts(
        weights_mb=5.0,
        activation_mb_per_sample=0.1,
        compute_share=0.49,
        forward_share=0.16,
        backward_share=0.33,
    )
    classifier = LayerFacts(
        weights_mb=400.0,
        activation_mb_per_sample=0.01,
        compute_share=0.02,
        forward_share=0.005,
        backward_share=0.01,
    )
    return CellFacts(
        weights_mb=410.0,
        gradient_mb=410.0,
        input_mb_per_sample=0.01,
        layers=[conv, conv, classifier],
        step_seconds=step_seconds,
        step_batch=32,
        gradient_tensors=6,
    )


def _config(model: str) -> object:
    return validate(
        compose_config(
            [
                f"distribution={model}",
                "hardware=titanrtx_cluster",
                "hardware.nodes=2",
                "hardware.workers_per_node=1",
                "distribution.batch_size=32",
                "dataset.num_samples=640",
            ]
        )
    )


def test_fsdp_cannot_hide_a_large_unit_behind_a_tiny_forward() -> None:
    """The classifier's gather (ring of 400 MB bf16 = 200 MB over 2 GPUs at 1 GB/s: ~0.2 s)
    cannot hide behind the 16 ms conv forward it is prefetched under; the old model exposed
    only the first unit's gather and the last reduce-scatter (milliseconds)."""
    config = _config("fsdp")
    assert communication_overlaps(config)  # type: ignore[arg-type]
    exposed = step_communication_seconds(config, _vgg_like(), _profile())  # type: ignore[arg-type]
    # At least the classifier's two gathers and its reduce-scatter less the compute around
    # them (0.1 s in all): they are far longer than what they could hide behind.
    assert exposed > 0.2


def test_ddp_exposes_more_than_its_last_bucket_when_the_allreduces_outlast_the_backward() -> None:
    """410 MB of gradients over 1 GB/s take 0.41 s per step; the backward they could hide
    behind lasts 67 ms: most of it is exposed, not only the last 25 MB bucket."""
    config = _config("ddp")
    terms = epoch_terms(config, _vgg_like(), _profile())  # type: ignore[arg-type]
    per_step = terms.allreduce_s / terms.steps
    assert per_step > 0.3
    # A step whose backward is long enough hides all but the last bucket.
    slow = epoch_terms(config, _vgg_like(step_seconds=100.0), _profile())  # type: ignore[arg-type]
    assert slow.allreduce_s / slow.steps < 0.05


def test_cpu_workers_take_turns_on_one_machine_and_overlap_their_allreduces_across_nodes() -> None:
    """A gloo collective among the workers of one machine is copies on the cores that compute: it
    takes its turn. Across nodes an allreduce's bytes wait on the link while the cores go on with
    the backward: measured on emulated nodes, five networks held out, DDP's error fell from 8.2 to
    5.7 % with it (docs/benchmarks/2026-11-29-emulated-overlap-bucket-profiles.md, "DDP and Horovod
    across nodes on the overlap timeline (shipped) (2026-11-29)"). FSDP's collectives there still
    take their turn (their copies are on the cores). GPUs overlap everything."""
    one_machine = validate(compose_config(["distribution=ddp", "hardware=local_2cpu"]))
    nodes = validate(compose_config(["distribution=ddp", "hardware=emulated_2nodes_1gbit"]))
    assert not allreduces_overlap_backward(one_machine)
    assert allreduces_overlap_backward(nodes)
    assert not communication_overlaps(nodes)
    assert allreduces_overlap_backward(_config("ddp"))  # type: ignore[arg-type]
    assert communication_overlaps(_config("ddp"))  # type: ignore[arg-type]
    # How far an allreduce hides depends on which layers compute while it moves.
    assert needs_layer_profile(nodes) and not needs_layer_profile(one_machine)


def test_a_node_is_crossed_only_by_a_group_larger_than_a_node() -> None:
    two_nodes = validate(compose_config(["hardware=emulated_2nodes_1gbit"])).hardware
    assert two_nodes.group_spans_nodes(2) and not two_nodes.group_spans_nodes(1)
    wide = validate(compose_config(["hardware=local_2cpu"])).hardware
    assert not wide.group_spans_nodes(wide.world_size)
    fat = validate(
        compose_config(
            ["hardware=titanrtx_cluster", "hardware.nodes=2", "hardware.workers_per_node=2"]
        )
    ).hardware
    assert not fat.group_spans_nodes(2) and fat.group_spans_nodes(3)
    assert two_nodes.group_crosses_links(2) and fat.group_crosses_links(3)


def test_nodes_on_one_host_share_its_cores_and_their_allreduces_take_their_turn() -> None:
    """The local SLURM cluster's two nodes are processes of this machine talking over its
    loopback: their gloo allreduces copy and reduce on the cores the backward needs, as on one
    node, so DDP is priced without the overlap timeline and FSDP's collectives with one
    machine's shares (an emulated node has cores and a link of its own)."""
    from harness.distributions.fsdp import GLOO_ACROSS_NODES_SHARE, GLOO_SHARE, _share

    local = validate(compose_config(["hardware=slurm_local_2nodes", "distribution=ddp"]))
    emulated = validate(compose_config(["hardware=emulated_2nodes_1gbit", "distribution=ddp"]))
    assert local.hardware.one_host and local.hardware.group_spans_nodes(2)
    assert not local.hardware.group_crosses_links(2)
    assert not allreduces_overlap_backward(local) and allreduces_overlap_backward(emulated)
    fsdp = [
        validate(compose_config([f"hardware={name}", "distribution=fsdp"]))
        for name in ("slurm_local_2nodes", "emulated_2nodes_1gbit")
    ]
    assert [_share(config, "all_gather") for config in fsdp] == [
        GLOO_SHARE["all_gather"],
        GLOO_ACROSS_NODES_SHARE["all_gather"],
    ]


def _four_layers(step_seconds: float = 1.0) -> CellFacts:
    """Four layers of 30 MB, each 15 % of a step's backward."""
    layer = LayerFacts(
        weights_mb=30.0,
        activation_mb_per_sample=0.1,
        compute_share=0.25,
        forward_share=0.1,
        backward_share=0.15,
    )
    return CellFacts(
        weights_mb=120.0,
        gradient_mb=120.0,
        input_mb_per_sample=0.01,
        layers=[layer] * 4,
        step_seconds=step_seconds,
        step_batch=32,
        gradient_tensors=8,
    )


def _cpu_cell(model: str, hardware: str) -> object:
    return validate(
        compose_config(
            [
                f"distribution={model}",
                f"hardware={hardware}",
                "distribution.batch_size=32",
                "dataset.num_samples=640",
            ]
        )
    )


def test_ddp_across_cpu_nodes_exposes_only_what_the_backward_after_a_bucket_cannot_hide() -> None:
    # Each 30 MB layer fills a bucket (cap 25 MB) after 0.15 s of backward; its allreduce
    # (50 us + 30 MB at 1000 MB/s = 30.05 ms) runs beside the next layer's backward: only the
    # last one is exposed. 640 images, 2 workers x 32: 10 steps.
    nodes = epoch_terms(
        _cpu_cell("ddp", "emulated_2nodes_1gbit"),  # type: ignore[arg-type]
        _four_layers(),
        _profile(),
    )
    assert nodes.steps == 10
    assert nodes.allreduce_s == pytest.approx(10 * (50e-6 + 0.030))
    # On one machine every one of DDP's 1 + ceil(119 / 25) = 6 buckets takes its turn.
    one = epoch_terms(
        _cpu_cell("ddp", "local_2cpu"),  # type: ignore[arg-type]
        _four_layers(),
        _profile(),
    )
    assert one.allreduce_s == pytest.approx(10 * (6 * 50e-6 + 0.120))


def test_horovod_across_cpu_nodes_allreduces_a_layer_per_cycle_beside_the_backward() -> None:
    # Its 1 ms cycle fuses what became ready since the last one, a layer's gradients on a CPU
    # worker, not a 64 MB buffer (which would wait for two layers and expose 60 MB).
    config = _cpu_cell("horovod", "emulated_2nodes_1gbit")
    assert fused_mb_per_allreduce(config) == 0.0  # type: ignore[arg-type]
    terms = epoch_terms(config, _four_layers(), _profile())  # type: ignore[arg-type]
    assert terms.allreduce_s == pytest.approx(10 * (50e-6 + 0.030))
    assert [parameter.name for parameter, _ in terms.model_terms] == ["horovod_background"]
    # On GPUs the thesis' Tensor Fusion buffer.
    assert fused_mb_per_allreduce(_config("horovod")) == 64.0  # type: ignore[arg-type]


def test_an_allreduce_between_cpu_nodes_takes_the_probed_share_of_the_backward_beside_it() -> None:
    """The probe measures what an allreduce between nodes takes from a CPU worker's compute per MB
    (on the emulated 1 Gbit/s link 2.4 ms: BENCHMARKS.md, "The links, as the probe sees them"); the
    backward it runs beside lasts that much longer. Each 30 MB layer's allreduce (30.05 ms on the
    link) takes 0.5 ms/MB x 30 MB = 15 ms of the cores, all beside the next layer's backward
    (0.15 s): three of them stretch the backward by 45 ms, the last runs after it."""
    config = _cpu_cell("ddp", "emulated_2nodes_1gbit")
    probed = _profile()
    probed.facts[COMPUTE_LOST_FACT] = 0.5
    assert probed.compute_lost_s_per_mb() == pytest.approx(5e-4)
    terms = epoch_terms(config, _four_layers(), probed)  # type: ignore[arg-type]
    assert terms.allreduce_s == pytest.approx(10 * (3 * 0.015 + 50e-6 + 0.030))
    # The same profile on GPUs: their collectives do not compute on the CPU's cores.
    gpu = epoch_terms(_config("ddp"), _four_layers(), probed)  # type: ignore[arg-type]
    assert gpu.allreduce_s == pytest.approx(
        epoch_terms(_config("ddp"), _four_layers(), _profile()).allreduce_s
    )  # type: ignore[arg-type]
