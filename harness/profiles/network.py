"""A network's per-layer profile as a record (`harness.measure.profiler` measures it): what the
partitioners balance and the performance model reads. Reading one loads no torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LayerProfile:
    index: int
    type: str
    forward_ms: float  # median over the repeats, for the profiled batch
    backward_ms: float
    update_ms: float  # one optimizer step on the layer's weights (SGD with momentum)
    activation_mb: float  # the layer's output for the profiled batch
    parameter_mb: float

    def compute_ms(self, updates_per_pass: float = 0.0) -> float:
        """Forward + backward, plus `updates_per_pass` optimizer steps (PipeDream updates
        after every minibatch: 1; GPipe once per batch of #mb micro-batches: 1 / #mb)."""
        return self.forward_ms + self.backward_ms + updates_per_pass * self.update_ms


@dataclass(frozen=True)
class NetworkProfile:
    batch_size: int
    device: str
    layers: list[LayerProfile]

    def compute_ms(self, updates_per_pass: float = 0.0) -> list[float]:
        return [layer.compute_ms(updates_per_pass) for layer in self.layers]

    def to_dict(self) -> dict[str, object]:
        return {
            "batch_size": self.batch_size,
            "device": self.device,
            "layers": [asdict(layer) for layer in self.layers],
        }
