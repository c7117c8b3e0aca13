"""What the trainers share for `Trainer.reset`, `Trainer.evaluation_model` and
`EpochMeasurement.batch_losses`: a snapshot of the initial training state, the whole network
assembled from a pipeline's stages, and the epoch's losses read once at its end."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from harness.runtime.distributed import Peers


@dataclass(frozen=True)
class InitialState:
    """A module's parameters and buffers and its optimizer's state, as they were when captured.

    Memory: one more copy of the module's parameters and buffers (and of any optimizer state
    that exists at capture: SGD's momentum buffers exist only after the first step, unless
    Horovod's broadcast_optimizer_state created them), on the module's device.
    """

    module_state: dict[str, torch.Tensor]
    optimizer_state: dict

    @classmethod
    def capture(cls, module: nn.Module, optimizer: torch.optim.Optimizer) -> InitialState:
        return cls(
            {name: tensor.detach().clone() for name, tensor in module.state_dict().items()},
            copy.deepcopy(optimizer.state_dict()),
        )

    def restore(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Copy the captured values into the module's own tensors (in place: the optimizer, DDP
        and a pipeline's stages keep referring to the same tensors), replace the optimizer's
        state (momentum) and drop every accumulated gradient."""
        with torch.no_grad():
            module.load_state_dict(self.module_state)
        # load_state_dict replaces the optimizer's whole state, so momentum a later step built
        # is dropped; the copy keeps this snapshot reusable for the next repeat.
        optimizer.load_state_dict(copy.deepcopy(self.optimizer_state))
        optimizer.zero_grad()  # (Horovod's takes no set_to_none; torch 2 frees the gradients)
        module.zero_grad(set_to_none=True)


def epoch_losses(losses: dict[int, torch.Tensor]) -> dict[int, float]:
    """Batch index -> loss as floats, in one device-to-host copy: called after the epoch's last
    synchronise, so the timed loop never waits for a loss value (`.item()` per batch would
    synchronise a CUDA device every batch). In float64, Python's float: exact for every dtype's
    loss (a float64 run's losses keep their digits)."""
    if not losses:
        return {}
    values = torch.stack([loss.reshape(()) for loss in losses.values()]).double().cpu().tolist()
    return dict(zip(losses, values))


def assemble_network(
    network: nn.Module,
    stage: nn.Module,
    contributes: bool,
    peers: Peers,
    device: torch.device,
) -> nn.Module:
    """The whole `network` on `device` with every stage's current weights: a collective that
    every worker of the pipeline calls.

    A pipeline worker's stage shares its modules with `network` (pipeline.stage_module), so
    this worker's layers already hold its trained weights; the other layers still hold their
    initial ones. Each worker whose `contributes` is true (one replica per stage: replicas are
    equal) sends the state of its stage (parameters and buffers, e.g. BatchNorm's running
    statistics) under the names `network` gives them, through `peers.all_gather`, and every
    worker copies the others' into its own `network`.

    Memory: every worker holds the whole network on its device (the layers of the other
    stages, otherwise unused there), and for the gather a CPU copy of all stages' states (one
    network's worth of parameters and buffers) in pickled and unpickled form.
    """
    names = {id(tensor): name for name, tensor in network.state_dict(keep_vars=True).items()}
    mine = (
        {
            names[id(tensor)]: tensor.detach().cpu()
            for tensor in stage.state_dict(keep_vars=True).values()
        }
        if contributes
        else {}
    )
    target = network.to(device).state_dict(keep_vars=True)
    with torch.no_grad():
        for state in peers.all_gather(mine):  # this worker's own among them: a no-op copy
            for name, tensor in state.items():
                target[name].copy_(tensor)
    return network
