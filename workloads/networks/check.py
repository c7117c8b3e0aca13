"""Does a network run on a dataset's input? Checked on PyTorch's meta device, before any cell
starts: a wrong shape, a model that cannot take token ids, or logits of the wrong width fail
here in one line that names both shapes, instead of inside a started cell's workers.

The answer is remembered (`workloads.networks.remembered`): a network that the same code
checked on the same dataset shape before is not built again, so that a command checking its
config (the planner, a sweep's launcher) loads no torch the second time. Only a network that
passed is remembered: a refusal is found again, with its message built where it is raised.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from workloads.datasets.spec import DatasetSpec
from workloads.networks.ref import NetworkError, NetworkRef
from workloads.networks.remembered import entry_path, keep_entry, read_entry

if TYPE_CHECKING:
    import torch

_REMEMBERED = "network-checks"


def check_network_remembered(
    ref: NetworkRef, spec: DatasetSpec, cache_dir: str | Path, *, keep: bool
) -> None:
    """`check_network(ref, spec)`, unless today's code passed the same check before (kept in
    `cache_dir`); a check that passes now is kept there if `keep` (a command that only checks
    its input keeps nothing)."""
    entry = entry_path(_REMEMBERED, ref, spec, cache_dir)
    if (read_entry(entry) or {}).get("takes_input") is True:
        return
    check_network(ref, spec)
    if keep:
        keep_entry(entry, {"takes_input": True, "network": ref.key, "dataset": spec.name})


# A forward of two samples: BatchNorm in training mode needs more than one value per channel.
_CHECK_BATCH = 2


@functools.cache
def check_network(ref: NetworkRef, spec: DatasetSpec) -> None:
    """Raise NetworkError unless `ref` builds for `spec` and maps a batch of its input to
    logits of the expected shape ((N, classes) for images, (N, T, vocab or more) for
    tokens)."""
    import torch

    from workloads.networks import build_network
    from workloads.networks.split import FAKE_TENSOR_LOG, quiet_logger

    inputs, _ = spec.example_batch(_CHECK_BATCH)
    expected = (_CHECK_BATCH, *spec.target_shape, spec.output_classes)
    with torch.device("meta"), quiet_logger(FAKE_TENSOR_LOG):
        model = build_network(ref, spec)
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


def _shape(shape: tuple[int, ...] | torch.Size) -> str:
    return "(" + ", ".join(str(size) for size in shape) + ")"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else "(no message)"
