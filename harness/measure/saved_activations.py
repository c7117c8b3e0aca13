"""What autograd saves per entry of a network's layer list, measured: one forward pass of a
small real batch on the CPU, in train mode, under `torch.autograd.graph.saved_tensors_hooks`,
at two batch sizes. The records it returns and the counting rules are `harness.costs.activations`'.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from harness.config.units import BYTES_PER_MB
from harness.costs.activations import (
    NO_SAVER,
    LayerSaved,
    SavedActivations,
    SavedGroup,
)

# Weights above this many bytes: measure on the meta device (`measure`).
META_ABOVE_BYTES = 4 * 1024**3


def measure(
    network,  # noqa: ANN001
    spec,  # noqa: ANN001
    *,
    batches: tuple[int, int] = (1, 2),
    seed: int = 0,
    device: str = "cpu",
) -> SavedActivations:
    """Saved bytes per layer of `network` (a name or a NetworkRef) for dataset `spec` (a
    DatasetSpec), from forwards at two batch sizes (module docstring). Costs two forward
    passes on the CPU; a network whose weights alone would take more than
    `META_ABOVE_BYTES` (Llama 3 8B's 32 GB) runs them on the meta device instead, which
    saves the same tensors without computing or holding any. `device` runs them elsewhere
    (a GPU, to compare what its kernels save: scripts/gpu_memory_timeline.py)."""
    import torch

    from workloads.networks import build_network, to_layer_list

    started = time.perf_counter()
    torch.manual_seed(seed)
    with torch.device("meta"):
        weights = sum(
            p.numel() * p.element_size() for p in build_network(network, spec).parameters()
        )
    target = torch.device("meta" if weights > META_ABOVE_BYTES else device)
    with target:
        model = build_network(network, spec)
    layers = to_layer_list(network, model)
    model.train()
    try:
        traces = [_trace(model, layers, spec, batch) for batch in batches]
    except ValueError:  # BatchNorm cannot train on one value per channel: start at 2
        batches = (2 * batches[0], 2 * batches[1])
        traces = [_trace(model, layers, spec, batch) for batch in batches]
    (small, low), (large, high) = zip(batches, traces)
    result = []
    for a, b in zip(low, high):
        keys = sorted(set(a.groups) | set(b.groups))
        groups = []
        for key in keys:
            slope = (b.groups.get(key, 0) - a.groups.get(key, 0)) / (large - small)
            constant = a.groups.get(key, 0) - small * slope
            groups.append(SavedGroup(key, slope / BYTES_PER_MB, constant / BYTES_PER_MB))
        result.append(
            LayerSaved(
                tuple(groups), b.output_bytes / large / BYTES_PER_MB, b.saves_input, b.output_saver
            )
        )
    input_mb = torch.Size(spec.input_shape).numel() * spec.input_dtype.itemsize / BYTES_PER_MB
    return SavedActivations(tuple(result), input_mb, batches, time.perf_counter() - started)


@dataclass
class _LayerTrace:
    groups: dict[int, int]  # previous saver -> bytes
    output_bytes: int
    saves_input: bool
    output_saver: int


def _trace(model, layers, spec, batch: int) -> list[_LayerTrace]:  # noqa: ANN001
    """One forward at `batch` with every saved tensor recorded, per layer."""
    import torch

    excluded = {_storage_key(t)[0] for t in [*model.parameters(), *model.buffers()]}
    saved_by: dict[int, list[tuple[int, int]]] = {}  # layer -> [(storage key, bytes)]
    current = [0]
    kept: list[object] = []  # keep saved tensors alive: storage keys stay unique

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key, size = _storage_key(tensor)
        if key not in excluded and size > 0:
            saved_by.setdefault(current[0], []).append((key, size))
        kept.append(tensor)
        return tensor

    from workloads.task import task_loss

    device = next(iter(model.parameters())).device
    generator = torch.Generator().manual_seed(batch)
    images, labels = (tensor.to(device) for tensor in spec.example_batch(batch, generator))
    inputs, outputs = [], []
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        _fused_attention_on_meta(device),
    ):
        x = images
        for index, layer in enumerate(layers):
            current[0] = index
            inputs.append(_storage_key(x)[0])
            x = layer(x)
            outputs.append((_storage_key(x), x))
        loss = task_loss(x, labels)  # charged to the last layer
    last_saver: dict[int, int] = {}
    traces = []
    for index in range(len(layers)):
        groups: dict[int, int] = {}
        mine = dict(saved_by.get(index, []))  # one entry per storage
        for key, size in mine.items():
            previous = last_saver.get(key, NO_SAVER)
            groups[previous] = groups.get(previous, 0) + size
        for key in mine:
            last_saver[key] = index
        (out_key, _), out = outputs[index]
        traces.append(
            _LayerTrace(
                groups,
                out.numel() * out.element_size(),
                inputs[index] in mine,
                last_saver.get(out_key, NO_SAVER),
            )
        )
    kept.clear()
    del loss
    return traces


@contextlib.contextmanager
def _fused_attention_on_meta(device) -> Iterator[None]:  # noqa: ANN001
    """On the meta device, attention saves what a fused kernel saves.

    PyTorch's scaled_dot_product_attention on the CPU (and flash attention on a GPU) saves the
    query, key, value, output and the per-row log-sum-exp; on the meta device it falls back to
    the unfused math, which also saves the (sequence x sequence) attention weights: at 8,192
    tokens, 8.6 GB per layer of Llama 3 8B that no real run keeps. So the meta trace runs a
    stand-in with the fused kernel's outputs and saved tensors (tests check it against the
    CPU's measurement)."""
    import torch

    if device.type != "meta":
        yield
        return
    original = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = _fused_attention_class().apply_sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def _fused_attention_class() -> Any:
    import torch

    class FusedAttention(torch.autograd.Function):
        """Shapes and saved tensors of a fused attention kernel (no computation: meta)."""

        @staticmethod
        def forward(ctx, query, key, value):  # noqa: ANN001, ANN205
            # (batch, sequence, heads, dim) in memory, seen as (batch, heads, sequence, dim):
            # the fused kernels' layout, so the usual transpose back is a view, not a copy.
            batch, heads, length = query.shape[:-1]
            out = query.new_empty((batch, length, heads, value.shape[-1])).transpose(1, 2)
            logsumexp = query.new_empty(query.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(query, key, value, out, logsumexp)
            return out

        @staticmethod
        def backward(ctx, grad):  # noqa: ANN001, ANN205
            query, key, value, _, _ = ctx.saved_tensors
            return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)

        @staticmethod
        def apply_sdpa(query, key, value, *_: Any, **__: Any):  # noqa: ANN001, ANN205
            # Grouped-query attention (enable_gqa) saves the key and value as given, fewer
            # heads than the query, as the fused kernel does.
            return FusedAttention.apply(query, key, value)

    return FusedAttention


def _storage_key(tensor) -> tuple[int, int]:  # noqa: ANN001
    """(identity, bytes) of the memory `tensor` keeps alive: its storage, shared by views."""
    try:
        storage = tensor.untyped_storage()
        # On the meta device every storage's data_ptr is 0: the storage object's own address
        # (stable while the traced tensors are kept alive) tells them apart.
        identity = storage._cdata if tensor.device.type == "meta" else storage.data_ptr()
        return identity, storage.nbytes()
    except (RuntimeError, NotImplementedError):  # no plain storage (opaque tensors)
        return id(tensor), tensor.numel() * tensor.element_size()
