"""Does a network run on a dataset's input? Checked on PyTorch's meta device, before any cell
starts: a wrong shape, a model that cannot take token ids, or logits of the wrong width fail
here in one line that names both shapes, instead of inside a started cell's workers.

The check also counts the network's parameters (`NetworkSize`), from which the config's
checks tell a network whose weights cannot fit a worker's memory before any cell starts
(`harness.config.weight_memory`). The network is built once for both, and for its layer count
(`workloads.networks.meta`), and what the libraries say while it is built is kept out of a
refusal's one line.

The answer is remembered (`workloads.networks.remembered`): a network that the same code
checked on the same dataset shape before is not built again, so that a command checking its
config (the planner, a sweep's launcher) loads no torch the second time. Only a network that
passed is remembered, with its size: a refusal is found again, with its message built where it
is raised.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from workloads.datasets.spec import DatasetSpec
from workloads.networks.ref import NetworkError, NetworkRef
from workloads.networks.remembered import entry_path, keep_entry, read_entry

if TYPE_CHECKING:
    import torch

_REMEMBERED = "network-checks"


@dataclass(frozen=True)
class NetworkSize:
    """A network's parameters as its check on the meta device counted them (a parameter that
    two modules share counted once): what a worker's weights, gradients and optimizer state
    are reckoned from before any cell starts, since checking the network built it anyway."""

    parameters: int
    trainable: int  # those that require a gradient: each has one, and optimizer state

    def entry(self) -> dict[str, int]:
        """How a remembered check keeps it."""
        return {"parameters": self.parameters, "trainable": self.trainable}

    @classmethod
    def from_entry(cls, fact: dict[str, Any] | None) -> NetworkSize | None:
        """The size a remembered check kept; None where the entry is not a passed check with
        both counts (an older or damaged entry: the network is checked again)."""
        if not fact or fact.get("takes_input") is not True:
            return None
        parameters, trainable = fact.get("parameters"), fact.get("trainable")
        if not (_is_count(parameters) and _is_count(trainable) and trainable <= parameters):
            return None
        return cls(parameters, trainable)


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_network_remembered(
    ref: NetworkRef, spec: DatasetSpec, cache_dir: str | Path, *, keep: bool
) -> NetworkSize:
    """`check_network(ref, spec)`, unless today's code passed the same check before (kept in
    `cache_dir`, with the network's size); a check that passes now is kept there if `keep` (a
    command that only checks its input keeps nothing)."""
    entry = entry_path(_REMEMBERED, ref, spec, cache_dir)
    size = NetworkSize.from_entry(read_entry(entry))
    if size is not None:
        return size
    size = check_network(ref, spec)
    if keep:
        keep_entry(
            entry,
            {"takes_input": True, **size.entry(), "network": ref.key, "dataset": spec.name},
        )
    return size


# A forward of two samples: BatchNorm in training mode needs more than one value per channel.
_CHECK_BATCH = 2


@functools.cache
def check_network(ref: NetworkRef, spec: DatasetSpec) -> NetworkSize:
    """Raise NetworkError unless `ref` builds for `spec` and maps a batch of its input to
    logits of the expected shape ((N, classes) for images, (N, T, vocab or more) for
    tokens); its size where it does. Built once (`meta_network`, which the layer count
    reuses), what the libraries say meanwhile kept aside."""
    import torch

    from workloads.networks.meta import library_chatter_kept_aside, meta_network

    inputs, _ = spec.example_batch(_CHECK_BATCH)
    expected = (_CHECK_BATCH, *spec.target_shape, spec.output_classes)
    model = meta_network(ref, spec)
    with torch.device("meta"), library_chatter_kept_aside():
        try:
            output = model(inputs.to("meta"))
        except Exception as err:  # noqa: BLE001 - the user's forward may raise anything
            raise NetworkError(
                f"network {ref.name}: its forward fails on dataset={spec.name}'s input of shape "
                f"{_shape(inputs.shape)} ({inputs.dtype}): {type(err).__name__}: "
                f"{_first_line(err)}"
            ) from None
    # A language model's vocabulary may be larger than the data's (a preset that fixes
    # Llama 3's 128,256 ids trains on bytes too); every target id needs a logit.
    fits = isinstance(output, torch.Tensor) and (
        tuple(output.shape) == expected
        if not spec.tokens
        else tuple(output.shape[:-1]) == expected[:-1] and output.shape[-1] >= expected[-1]
    )
    if not fits:
        got = _shape(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise NetworkError(
            f"network {ref.name} maps dataset={spec.name}'s input {_shape(inputs.shape)} to "
            f"{got}, expected logits of shape {_shape(expected)} (batch, "
            f"{'positions, vocabulary' if spec.tokens else 'classes'}); return one tensor of "
            f"logits" + ("" if spec.tokens else f" with {spec.output_classes} classes")
        )
    parameters = list(model.parameters())
    return NetworkSize(
        parameters=sum(parameter.numel() for parameter in parameters),
        trainable=sum(parameter.numel() for parameter in parameters if parameter.requires_grad),
    )


def _shape(shape: tuple[int, ...] | torch.Size) -> str:
    return "(" + ", ".join(str(size) for size in shape) + ")"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else "(no message)"
