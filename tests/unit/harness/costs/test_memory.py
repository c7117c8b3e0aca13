"""The memory model's terms against values computed by hand, and the measured saved
activations against what the layers must save."""

from __future__ import annotations

import pytest

from harness.costs import memory
from harness.costs.activations import LayerSaved, SavedGroup, stage_boundary_mb, stage_saved_mb
from harness.distributions.ddp import ddp_buffer_mb
from harness.distributions.gpipe import equations as gpipe
from harness.distributions.horovod import horovod_buffer_mb
from harness.distributions.pipedream import equations as pipedream

# A stage: 10 MB of weights; 2 MB saved per sample and 0.5 MB whatever the batch (BatchNorm's
# statistics); 0.2 MB enters and 0.1 MB leaves per sample, 0.1 MB of which autograd did not save;
# its largest layer-list entry saves 0.5 MB per sample and 0.25 MB.
STAGE = memory.StageFacts(
    weights_mb=10,
    saved_mb_per_sample=2.0,
    saved_mb_constant=0.5,
    input_mb_per_sample=0.2,
    output_mb_per_sample=0.1,
    held_mb_per_sample=0.1,
    largest_entry_mb_per_sample=0.5,
    largest_entry_mb_constant=0.25,
)


def test_model_state_and_communication_buffers() -> None:
    assert memory.gradients_mb(100) == 100
    assert memory.optimizer_state_mb(100, 1) == 100  # one momentum buffer
    assert memory.optimizer_state_mb(100, 2) == 200  # AdamW's two moments
    assert memory.optimizer_state_mb(100, 0) == 0
    assert ddp_buffer_mb(44.7) == 44.7  # the buckets: a copy of the gradients
    assert horovod_buffer_mb(44.7, 64) == 44.7  # a fusion touches at most G
    assert horovod_buffer_mb(100, 64) == 64
    assert horovod_buffer_mb(100, 0) == 0  # fusion off
    assert pipedream.replica_allreduce_buffer_mb(10, replicas=2) == 10
    assert pipedream.replica_allreduce_buffer_mb(10, replicas=1) == 0


def test_activations_are_affine_in_the_batch_plus_the_boundaries_kept() -> None:
    assert STAGE.saved_mb(32) == pytest.approx(64.5)
    assert memory.activations_mb(STAGE, 32) == pytest.approx(64.5 + 3.2)
    # the backward of the largest entry: gradients for what it saved, while that is held
    assert memory.backward_temporaries_mb(STAGE, 32) == pytest.approx(16.25)


def test_pipedream_sends_held_until_the_epoch_ends() -> None:
    # 16 minibatches of 32: the first stage sent its output (0.1 MB per sample), the last
    # its input's gradient (0.2), a middle stage both
    assert pipedream.held_sends_mb(STAGE, 32, 16, first=True, last=False) == pytest.approx(51.2)
    assert pipedream.held_sends_mb(STAGE, 32, 16, first=False, last=True) == pytest.approx(102.4)
    assert pipedream.held_sends_mb(STAGE, 32, 16, first=False, last=False) == pytest.approx(153.6)
    assert pipedream.held_sends_mb(STAGE, 32, 16, first=True, last=True) == 0
    worker = pipedream.pipedream_stage_memory(STAGE, 32, [1, 1], 1, held_sends=16)
    assert worker.buffers == pytest.approx(102.4)


def test_gpipe_micro_batches_per_recompute_mode() -> None:
    # 8 micro-batches of 4: each keeps its input and output (4 x 0.3 = 1.2 MB)
    assert gpipe.gpipe_activations_mb(STAGE, 4, 8, "always") == pytest.approx(8 * 1.2 + 8.5)
    # the last one not recomputed: its saved activations and held boundaries (8.5 + 0.4)
    assert gpipe.gpipe_activations_mb(STAGE, 4, 8, "except_last") == pytest.approx(7 * 1.2 + 8.9)
    assert gpipe.gpipe_activations_mb(STAGE, 4, 8, "never") == pytest.approx(8 * 8.9)
    with pytest.raises(ValueError, match="allowed"):
        gpipe.gpipe_activations_mb(STAGE, 4, 8, "sometimes")
    worker = gpipe.gpipe_stage_memory(STAGE, 4, 8, "always", runtime_mb=1000)
    assert worker.backward == pytest.approx(4 * 0.5 + 0.25)  # at the micro-batch
    assert worker.total == pytest.approx(1000 + 30 + 8 * 1.2 + 8.5 + 2.25)


def test_pipedream_in_flight_minibatches_and_stashed_versions() -> None:
    assert [pipedream.in_flight_minibatches([1, 1], s) for s in (0, 1)] == [2, 1]
    assert [pipedream.in_flight_minibatches([1, 1, 1], s) for s in (0, 1, 2)] == [3, 2, 1]
    assert pipedream.in_flight_minibatches([2, 1], 0) == 2  # ceil(3 workers / 2 replicas)
    assert pipedream.in_flight_minibatches([2], 0) == 1
    # Stage 0 of 1-1 runs F0 F1 B0 F2 B1 F3 ...: F1 (version 0) and F2 (version 1) both wait
    # across an update, so two copies are alive at F2 (the trainer recorded 2 in the
    # calibration sweep); the last stage and an unpipelined replicated stage stash nothing.
    assert pipedream.stashed_versions([1, 1], 0) == 2
    assert pipedream.stashed_versions([1, 1], 1) == 0
    assert pipedream.stashed_versions([2], 0) == 0
    # Stage 0 of three: F1, F2 share version 0; F3 version 1; F4 version 2 -> three copies.
    assert pipedream.stashed_versions([1, 1, 1], 0) == 3
    first = pipedream.pipedream_stage_memory(STAGE, 32, [1, 1], 0)
    assert first.activations == pytest.approx(2 * (64.5 + 3.2))
    assert first.stashed == 20 and first.buffers == 0
    assert first.total == pytest.approx(30 + 2 * 67.7 + 16.25 + 20)
    replicated = pipedream.pipedream_stage_memory(STAGE, 32, [2], 0)
    assert replicated.buffers == 10 and replicated.stashed == 0
    assert replicated.total == pytest.approx(40 + 67.7 + 16.25)


def test_a_data_parallel_worker() -> None:
    worker = memory.data_parallel_memory(100, 100, STAGE, 32, buffer_mb=64, runtime_mb=900)
    assert (worker.weights, worker.gradients, worker.optimizer, worker.buffers) == (
        100,
        100,
        100,
        64,
    )
    assert worker.total == pytest.approx(900 + 364 + 67.7 + 16.25)
    assert memory.fits([428, 300], 0.5) and not memory.fits([428, 600], 0.5)
    assert memory.fits([10**9], None)


def _layers() -> list[LayerSaved]:
    """conv (saves the image, 1 MB), in-place ReLU (saves the conv's output, 2 MB, which is
    also its own output), conv (saves that same storage again), linear (saves its input)."""
    return [
        LayerSaved((SavedGroup(-1, 1.0),), 2.0, saves_input=True, output_saver=-1),
        LayerSaved((SavedGroup(-1, 2.0, 0.25),), 2.0, saves_input=True, output_saver=1),
        LayerSaved((SavedGroup(1, 2.0),), 0.5, saves_input=True, output_saver=-1),
        LayerSaved((SavedGroup(-1, 0.5),), 0.01, saves_input=True, output_saver=-1),
    ]


def test_a_stage_counts_each_saved_storage_once() -> None:
    layers = _layers()
    # whole network: 1 + 2 + (the ReLU's storage again: not counted) + 0.5 per sample
    assert stage_saved_mb(layers, 0, 4, 10) == pytest.approx(35 + 0.25)
    # a stage starting at the second conv received that storage: it counts it
    assert stage_saved_mb(layers, 2, 4, 10) == pytest.approx(25)
    assert stage_saved_mb(layers, 1, 3, 10) == pytest.approx(20.25)
    # boundaries: the input is saved by the first layer, the logits by nobody
    assert stage_boundary_mb(layers, 0, 4, 1.0) == (0.0, 0.01)
    # the ReLU saved its own output, so a stage ending there keeps nothing more
    assert stage_boundary_mb(layers, 1, 2, 1.0) == (0.0, 0.0)


def test_a_cells_workers_from_its_facts() -> None:
    """PipeDream 1-1 over gloo on the four layers above, two each, 16 minibatches of 32."""
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.costs.partition import StagePlan
    from harness.costs.terms import CellFacts, LayerFacts
    from harness.predict.cell import memory_per_worker_mb, memory_terms_per_worker

    config = validate(
        compose_config(
            [
                "dataset=mnist",
                "distribution=pipedream",
                "distribution.stages=1-1",
                "hardware=local_2cpu",
                "distribution.batch_size=32",
                "dataset.num_samples=512",
            ]
        )
    )
    layers = [LayerFacts(1.0, saved.output_mb_per_sample, 0.25, saved=saved) for saved in _layers()]
    facts = CellFacts(
        4.0, 4.0, 1.0, layers, 0.0, 32, plan=StagePlan.of([2, 2], [1, 1]), runtime_mb=900
    )
    first, second = memory_terms_per_worker(config, facts)
    # stage 0: 3 MB saved per sample (+0.25), 2 minibatches in flight, its largest entry the
    # ReLU (2 MB per sample), two stashed copies of its 2 MB, 16 x 32 x 2 MB of outputs sent
    assert first.activations == pytest.approx(2 * (32 * 3 + 0.25))
    assert first.backward == pytest.approx(64.25)
    assert (first.stashed, first.buffers) == pytest.approx((4, 1024))
    assert first.total == pytest.approx(900 + 6 + 192.5 + 64.25 + 4 + 1024)
    # stage 1: the received input (2 MB per sample) and the linear's (0.5); the logits held
    assert second.activations == pytest.approx(32 * (2.5 + 0.01))
    assert (second.backward, second.stashed, second.buffers) == pytest.approx((64, 0, 1024))
    assert memory_per_worker_mb(config, facts, runtime_mb=50) == pytest.approx(
        [first.total + 50, second.total + 50]
    )


def test_on_cuda_no_backward_temporaries_and_a_copy_of_the_starting_weights() -> None:
    """The same facts on a CPU and on CUDA: the backward's temporaries only on the CPU (the CUDA
    allocator reuses the blocks of the saved tensors each backward frees), the copy of the starting
    weights only on CUDA (on a CPU it stays in the fitted remainder:
    docs/benchmarks/2026-12-01-cuda-allocator-history.md, "The memory model against the CUDA
    allocator's history (one H200, 2026-12-01)")."""
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.costs.terms import CellFacts, LayerFacts
    from harness.predict.cell import memory_terms_per_worker

    layers = [LayerFacts(1.0, saved.output_mb_per_sample, 0.25, saved=saved) for saved in _layers()]
    facts = CellFacts(4.0, 4.0, 1.0, layers, 0.0, 32, runtime_mb=900)
    on = {
        hardware: memory_terms_per_worker(
            validate(
                compose_config(
                    ["dataset=mnist", f"hardware={hardware}", "distribution.batch_size=32"]
                )
            ),
            facts,
        )[0]
        for hardware in ("local_cpu", "h100_1gpu")
    }
    cpu, cuda = on["local_cpu"], on["h100_1gpu"]
    assert cpu.backward == pytest.approx(64.25) and cuda.backward == 0
    assert (cpu.initial, cuda.initial) == (0, cuda.weights) == (0, 4)
    assert cpu.total - cuda.total == pytest.approx(64.25 - 4)


def test_a_cuda_cells_recorded_peak_is_predicted_without_the_context() -> None:
    """A CUDA cell records the allocator's peak, which leaves the CUDA context out; compared
    with it, the prediction leaves the context out too, while what is to fit the device
    counts it. (Made-up facts: no GPU here; tests/integration/test_cuda.py measures the context on
    one.)"""
    from harness.analysis.fit import runtime_mb
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.costs.terms import CellFacts, LayerFacts
    from harness.predict.cell import memory_per_worker_mb, recorded_peak_mb

    layers = [LayerFacts(1.0, saved.output_mb_per_sample, 0.25, saved=saved) for saved in _layers()]
    on_cuda = CellFacts(4.0, 4.0, 1.0, layers, 0.0, 32, runtime_mb=900, context_mb=836)
    config = validate(
        compose_config(["dataset=mnist", "hardware=h100_1gpu", "distribution.batch_size=32"])
    )
    fills = max(memory_per_worker_mb(config, on_cuda))
    assert recorded_peak_mb(config, on_cuda) == pytest.approx(fills - 836)
    # A CPU's recorded peak is the process's: all of it counts.
    on_cpu = CellFacts(4.0, 4.0, 1.0, layers, 0.0, 32, runtime_mb=900)
    cpu = validate(
        compose_config(["dataset=mnist", "hardware=local_cpu", "distribution.batch_size=32"])
    )
    assert recorded_peak_mb(cpu, on_cpu) == max(memory_per_worker_mb(cpu, on_cpu))
    # A cell that measured what the model says: the remainder the analysis learns is 0, not
    # minus the context (which the recommender would then take off every CUDA prediction).
    from harness.analysis.fit import CellPrediction
    from harness.analysis.grid import MeasuredCell
    from harness.costs.terms import EpochTerms

    cell = MeasuredCell("run", "cell", config, 1.0, peak_memory_mb=fills - 836)
    predicted = CellPrediction(cell, EpochTerms(1.0), recorded_peak_mb(config, on_cuda))
    assert runtime_mb([predicted]) == pytest.approx(0)


def test_a_runtime_share_keeps_its_context_apart_in_the_facts_file(tmp_path) -> None:
    """The facts file keeps the CUDA context beside the runtime share; a share kept before
    it was (no `context_mb`) reads as none of it left out."""
    from harness.config.schema import ConfigError
    from harness.predict.facts.store import FactsStore
    from harness.profiles.runtime import RuntimeShare

    path = tmp_path / "h100_1gpu.json"
    store = FactsStore.load(path, "h100_1gpu")
    store.record_runtime(("mnist", "synthetic"), RuntimeShare(900.0, 836.0), device_name="H100")
    store.runtimes.append(
        {
            "key": ["cifar10"],
            "device_name": "H100",
            "mb": 700.0,
            "measured_at": "2026-11-01T00:00:00+00:00",
        }
    )
    store.save()
    kept = FactsStore.load(path, "h100_1gpu")
    assert kept.runtime(("mnist", "synthetic"), "H100") == RuntimeShare(900.0, 836.0)
    assert kept.runtime(("cifar10",), "H100") == RuntimeShare(700.0, 0.0)
    assert kept.runtime(("cifar10",), "A100") is None
    # a damaged entry names the file (a hand-edited one), not a ValueError's traceback
    kept.runtimes.append({"key": ["imagenet"], "mb": 700.0, "context_mb": "a lot"})
    with pytest.raises(ConfigError) as damaged:
        kept.runtime(("imagenet",))
    assert str(damaged.value).startswith(f"{path}: the runtime share kept for ['imagenet']")


def test_saved_activations_are_measured_per_layer_and_affine_in_the_batch() -> None:
    from harness.measure import saved_activations
    from workloads.datasets import dataset_spec

    spec = dataset_spec("mnist")
    saved = saved_activations.measure("vgg11", spec)
    assert saved.batches == (1, 2)
    first_conv, bn, relu, pool = saved.layers[:4]
    image, conv_out = 1 * 28 * 28 * 4 / 1e6, 64 * 28 * 28 * 4 / 1e6
    # the first convolution saves the image (its weight is a parameter, not counted)
    assert first_conv.mb_per_sample() == pytest.approx(image)
    # BatchNorm saves its input per sample, and its mean and inverse deviation per channel
    assert bn.mb_per_sample() == pytest.approx(conv_out)
    assert bn.mb_constant() == pytest.approx(2 * 64 * 4 / 1e6)
    # the in-place ReLU saves its result: its input's storage, which it outputs
    assert relu.mb_per_sample() == pytest.approx(conv_out) and relu.output_saver == 2
    # max-pool saves its input (the ReLU's, so it names the ReLU) and int64 indices
    indices = 64 * 14 * 14 * 8 / 1e6
    assert {g.previous_saver: g.mb_per_sample for g in pool.groups} == pytest.approx(
        {2: conv_out, -1: indices}
    )
    whole = stage_saved_mb(saved.layers, 0, len(saved.layers), 1)
    assert whole == pytest.approx(
        sum(layer.mb_per_sample() + layer.mb_constant() for layer in saved.layers)
        - sum(g.mb(1) for layer in saved.layers for g in layer.groups if g.previous_saver >= 0)
    )


@pytest.mark.parametrize("network", ["resnet18", "mobilenetv2"])
def test_the_affine_form_predicts_a_third_batch(network: str) -> None:
    import torch

    from harness.measure import saved_activations
    from workloads.datasets import dataset_spec
    from workloads.networks import build_network, to_layer_list

    spec = dataset_spec("cifar10")
    saved = saved_activations.measure(network, spec)
    torch.manual_seed(0)
    model = build_network(network, spec).train()
    traced = saved_activations._trace(model, to_layer_list(network, model), spec, 5)
    for layer, trace in zip(saved.layers, traced):
        predicted = {g.previous_saver: g.mb(5) * 1e6 for g in layer.groups}
        assert predicted == pytest.approx({k: float(v) for k, v in trace.groups.items()}, abs=1.0)
    if network == "resnet18":
        # A residual block saves five tensors of its output's size, not one (the layer
        # list's view): its input (conv1's), bn1's input, the ReLU's result (conv2's input),
        # bn2's input and the last ReLU's result; and per channel 2 BatchNorms' mean and
        # inverse deviation (2 x 2 x 64 float32).
        block = saved.layers[4]
        assert block.mb_per_sample() == pytest.approx(5 * block.output_mb_per_sample)
        assert block.mb_constant() == pytest.approx(2 * 2 * 64 * 4 / 1e6)


def test_the_runtime_share_is_a_fresh_worker_process() -> None:
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.worker.runtime_memory import measure_runtime_mb

    config = validate(
        compose_config(["dataset=mnist", "dataset.num_samples=64", "distribution.batch_size=8"])
    )
    runtime = measure_runtime_mb(config)
    assert 200 < runtime < 4000  # an interpreter that imported torch, and less than a model
