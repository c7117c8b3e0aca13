"""Tensor-parallel plans of the `transformers` language models (`network.source=hf`) and of a
user's module (`network.source=module`): what `torch.distributed.tensor.parallel.
parallelize_module` applies to a `TokenLM`'s blocks, Megatron-style.

In every block the attention's query, key and value projections are split by columns (each
worker computes its own heads) and its output projection by rows (the partial sums meet in an
allreduce); the MLP's first projections by columns, its last by rows: two allreduces a block in
the forward, two in the backward, and no communication inside the attention or the MLP. The
embedding and the head stay whole on every worker of the tensor-parallel group.

With sequence parallelism the norms and the residual stream between the blocks are split
along the sequence too (each worker keeps 1/degree of the tokens there): the attention's and
the MLP's inputs are all-gathered along the sequence, and their outputs reduce-scattered back
(`RowwiseParallel(output_layouts=Shard(1))`) instead of allreduced: the same bytes, less
activation memory. The embedding's output is cut along the sequence and the head's input
gathered again.

A plan may rewrite the network in place first, to a form that computes the same function and
that the parallel styles can split: GPT-2's `Conv1D` layers become `nn.Linear` (the transposed
weight), and its fused query-key-value projection three of them (`FusedQKV`), so that each
worker's columns hold its own heads of each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

from workloads.datasets.spec import DatasetSpec
from workloads.networks.ref import NetworkError, NetworkRef

Plan = dict[str, ParallelStyle]
# The architectures whose blocks take sequence parallelism: pre-norm blocks whose residual
# stream runs outside the norms (BERT's post-norm blocks add the residual inside theirs).
SEQUENCE_PARALLEL_ARCHS = ("gpt2", "llama", "mistral", "qwen2")


class FusedQKV(nn.Module):
    """GPT-2's `c_attn` (one projection to query, key and value side by side) as three linear
    layers whose outputs are concatenated: the same function, but splittable by columns so
    that every worker holds the same heads of each."""

    def __init__(self, conv1d: Any, width: int) -> None:
        super().__init__()
        weight, bias = conv1d.weight.detach(), conv1d.bias.detach()  # (in, 3 x width), (3 x width)
        self.q, self.k, self.v = (
            _linear(weight[:, i * width : (i + 1) * width], bias[i * width : (i + 1) * width])
            for i in range(3)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q(hidden), self.k(hidden), self.v(hidden)], dim=-1)

    def local_width(self) -> int:
        """Columns of each of query, key and value on this worker (all of them unsplit)."""
        weight = self.q.weight
        local = weight.to_local() if hasattr(weight, "to_local") else weight
        return int(local.shape[0])


def _linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    """The `nn.Linear` that computes `x @ weight + bias` (a `Conv1D`'s function)."""
    inputs, outputs = weight.shape
    layer = nn.Linear(inputs, outputs, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight.t())
        layer.bias.copy_(bias)
    return layer


def _gpt2_as_linear(block: Any) -> None:
    """GPT-2's block with `nn.Linear` layers in place of its `Conv1D`s (idempotent). The
    attention splits its fused projection at `split_size`: set before every forward from the
    query's columns on this worker."""
    attn, mlp = block.attn, block.mlp
    if isinstance(attn.c_attn, FusedQKV):
        return
    attn.c_attn = FusedQKV(attn.c_attn, attn.split_size)
    attn.c_proj = _linear(attn.c_proj.weight.detach(), attn.c_proj.bias.detach())
    mlp.c_fc = _linear(mlp.c_fc.weight.detach(), mlp.c_fc.bias.detach())
    mlp.c_proj = _linear(mlp.c_proj.weight.detach(), mlp.c_proj.bias.detach())

    def local_split(module: Any, args: Any) -> None:
        module.split_size = module.c_attn.local_width()

    attn.register_forward_pre_hook(local_split)


# -- the plans --------------------------------------------------------------------------------
def _divides(ref: NetworkRef, degree: int, sizes: Mapping[str, int]) -> None:
    for key, size in sizes.items():
        if size % degree:
            raise NetworkError(
                f"network {ref.name}'s {key}={size} does not divide among {degree} "
                f"tensor-parallel workers; allowed: a degree that divides every one of "
                f"{', '.join(f'{k}={v}' for k, v in sizes.items())}"
            )


def _block_styles(arch: str, sequence_parallel: bool) -> Plan:
    """One block's plan, by the submodules' names inside the Hugging Face block."""
    out = Shard(1) if sequence_parallel else Replicate()
    if arch == "gpt2":
        plan: Plan = {
            "attn.c_attn.q": ColwiseParallel(),
            "attn.c_attn.k": ColwiseParallel(),
            "attn.c_attn.v": ColwiseParallel(),
            "attn.c_proj": RowwiseParallel(output_layouts=out),
            "mlp.c_fc": ColwiseParallel(),
            "mlp.c_proj": RowwiseParallel(output_layouts=out),
        }
        norms, attention, mlp = ("ln_1", "ln_2"), "attn", "mlp"
    elif arch == "bert":
        plan = {
            "attention.self.query": ColwiseParallel(),
            "attention.self.key": ColwiseParallel(),
            "attention.self.value": ColwiseParallel(),
            "attention.output.dense": RowwiseParallel(),
            "intermediate.dense": ColwiseParallel(),
            "output.dense": RowwiseParallel(),
        }
        return plan
    else:  # the Llama layout
        plan = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=out),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=out),
        }
        norms, attention, mlp = ("input_layernorm", "post_attention_layernorm"), "self_attn", "mlp"
    if sequence_parallel:
        for norm in norms:
            plan[norm] = SequenceParallel()
        # GPT-2's block passes the attention its input by position, Llama's by keyword
        plan[attention] = (
            PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            if arch == "gpt2"
            else PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            )
        )
        plan[mlp] = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        )
    return plan


def _sizes(arch: str, config: Any) -> dict[str, int]:
    """The sizes a degree must divide: heads (and key-value heads), the MLP's width."""
    if arch == "gpt2":
        return {"n_head": config.n_head, "n_inner": config.n_inner or 4 * config.n_embd}
    if arch == "bert":
        return {
            "num_attention_heads": config.num_attention_heads,
            "intermediate_size": config.intermediate_size,
        }
    return {
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads or config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
    }


def hf_plan(ref: NetworkRef, network: nn.Module, degree: int, sequence_parallel: bool) -> Plan:
    """The plan of a `TokenLM` (`workloads.networks.lm`): every block's, prefixed by its
    index in the layer list, and with sequence parallelism the embedding's output cut and the
    head's input gathered along the sequence. Rewrites GPT-2's blocks first (module
    docstring). NetworkError where the degree does not divide the heads or the MLP, or where
    the architecture takes no sequence parallelism."""
    from workloads.networks.lm import Block

    arch = ref.arch or ""
    config = network.hf_model.config  # type: ignore[union-attr]
    _divides(ref, degree, _sizes(arch, config))
    if sequence_parallel and arch not in SEQUENCE_PARALLEL_ARCHS:
        raise NetworkError(
            f"network {ref.name} (network.arch={arch}) takes no sequence parallelism (its "
            f"blocks add the residual inside their norms); allowed: sequence_parallel=false, "
            f"or network.arch one of {', '.join(SEQUENCE_PARALLEL_ARCHS)}"
        )
    plan: Plan = {}
    layers = list(network.children())
    for index, layer in enumerate(layers):
        if not isinstance(layer, Block):
            continue
        if arch == "gpt2":
            _gpt2_as_linear(layer.block)
        layer.sequence_shards = degree if sequence_parallel else 1
        for name, style in _block_styles(arch, sequence_parallel).items():
            plan[f"{index}.block.{name}"] = style
    if sequence_parallel:
        plan["0"] = PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=True
        )
        plan[str(len(layers) - 1)] = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        )
    return plan


def module_plan(ref: NetworkRef, network: nn.Module, degree: int, sequence_parallel: bool) -> Plan:
    """A user's module's own plan: its `tensor_parallel_plan(degree, sequence_parallel)`
    method, returning {submodule name: ParallelStyle} (and raising ValueError for a degree it
    cannot split by)."""
    method = getattr(network, "tensor_parallel_plan", None)
    if method is None:
        raise NetworkError(
            f"network.target={ref.target} has no tensor_parallel_plan(degree, "
            f"sequence_parallel) method; allowed: tp=1, or a module with one that returns "
            f"{{submodule name: ColwiseParallel() | RowwiseParallel() | ...}}"
        )
    try:
        plan = method(degree, sequence_parallel)
    except ValueError as err:
        raise NetworkError(f"network.target={ref.target}: {' '.join(str(err).split())}") from None
    names = dict(network.named_modules())
    missing = [name for name in plan if name not in names]
    if missing:
        raise NetworkError(
            f"network.target={ref.target}'s tensor_parallel_plan names no submodule "
            f"{missing[0]!r}; allowed: names of its named_modules()"
        )
    return dict(plan)


def checked_plan(ref: NetworkRef, spec: DatasetSpec, degree: int, sequence_parallel: bool) -> None:
    """The network built on the meta device (nothing allocated) and its source asked for its
    plan: NetworkError, one line, if it cannot be split this way."""
    from workloads.networks.layers import build_network
    from workloads.networks.registry import source_of

    source = source_of(ref)
    if source.tensor_parallel_plan is None:
        raise NetworkError(
            f"network {ref.name} (network.source={source.name}) gives no tensor-parallel plan"
        )
    if sequence_parallel and spec.tokens and spec.seq_len % degree:
        raise NetworkError(
            f"dataset.seq_len={spec.seq_len} does not divide among {degree} sequence-parallel "
            f"workers; allowed: a multiple of {degree}"
        )
    with torch.device("meta"):
        network = build_network(ref, spec)
    source.tensor_parallel_plan(ref, network, degree, sequence_parallel)
