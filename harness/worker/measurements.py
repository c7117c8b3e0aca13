"""The measurements a prediction may need, taken on this machine: `WorkerMeasurements`, what the
commands that may measure (`harness.recommend`, `harness.analysis`, the GPU scripts) hand to
the facts cache (`harness.predict.facts.measurements.Measurements`, which it fits by shape:
prediction imports no worker).

Each one runs what trains: a sequential step on one worker (`harness.worker.step_time`), a
worker's start in a fresh process (`harness.worker.runtime_memory`), a forward of the network
(`harness.measure.saved_activations`), each layer profiled as a pipeline's stage profiles it
(`harness.distributions.pipeline.profile_network`), a pipeline's stages as worker processes
(`python -m harness.stage_timing`). torch and the trainers are imported inside the methods
that measure, never at import.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from harness.config.schema import DistbenchConfig
from harness.costs.activations import SavedActivations
from harness.costs.partition import StagePlan
from harness.distributions.registry import one_worker_cell
from harness.profiles.network import NetworkProfile
from harness.profiles.runtime import RuntimeShare
from harness.profiles.stages import InPlaceStages
from harness.profiles.steps import BatchTiming
from workloads.progress import say

if TYPE_CHECKING:
    from harness.worker.runtime_memory import RuntimeProbe

# Untimed steps at most: a fresh process runs its first steps slower (allocator, kernel caches);
# warming up ends earlier once it has taken a second (`harness.measure.timing_rule`).
PROBE_WARMUP = 4
# Probes of one step at most while the machine's speed changes around them (the reference
# kernel before and after differ by more than run.steadiness_threshold); then the steadiest is
# kept with how much the speed changed, which every later use of it says (the facts file's
# `speed_change`). Refusing it instead would refuse every answer on a machine shared with
# other work: the suite's own parallel tests moved the kernel by 23-231 % around probes on a
# 2-core VM.
PROBE_ATTEMPTS = 3


class WorkerMeasurements:
    """Every kind of measurement a prediction may need, taken here (module docstring)."""

    def step_time(
        self,
        config: DistbenchConfig,
        batch: int,
        *,
        threads: int | None,
        probe_batches: int,
        spread: float,
    ) -> BatchTiming:
        """A sequential step of `config`'s network at `batch`, timed on one worker of its
        device (`harness.worker.step_time`), with the reference kernel timed before and after
        it, as a cell times it around its epochs: the machine's speed around the probe."""
        from harness.measure.steadiness import reference_seconds
        from harness.worker.step_time import measure_batch_seconds

        probed = one_worker_cell(config, batch)
        device = config.hardware.device.value
        threshold = config.run.steadiness_threshold
        tries: list[BatchTiming] = []
        with TorchThreads(threads):
            for _ in range(PROBE_ATTEMPTS):
                before = reference_seconds(device)
                timing = measure_batch_seconds(
                    probed,
                    batch_size=batch,
                    probe_batches=probe_batches,
                    warmup_batches=PROBE_WARMUP,
                    steady_spread=spread,
                )
                after = reference_seconds(device)
                drift = after / before - 1
                timing = replace(timing, reference_ms=1e3 * (before + after) / 2)
                if abs(drift) <= threshold:
                    return timing
                tries.append(replace(timing, unsteady_drift=drift))
                if len(tries) < PROBE_ATTEMPTS:
                    say(
                        f"the machine's speed changed by {drift:+.0%} while the step at batch "
                        f"{batch} was timed (the reference kernel; run.steadiness_threshold "
                        f"{threshold:.0%}): timing it again"
                    )
        steadiest = min(tries, key=lambda one: abs(one.unsteady_drift or 0.0))
        changes = ", ".join(f"{one.unsteady_drift:+.0%}" for one in tries)
        say(
            f"the machine's speed changed each of the {PROBE_ATTEMPTS} times the step at batch "
            f"{batch} was timed ({changes}): the steadiest is kept, marked so; time it again "
            f"on a quiet machine (--remeasure)"
        )
        return steadiest

    def runtime_memory(self, config: DistbenchConfig) -> RuntimeMemoryReading:
        """A worker of `config`'s runtime memory, measured in a fresh process from now on."""
        from harness.worker.runtime_memory import RuntimeProbe

        return RuntimeMemoryReading(RuntimeProbe(config))

    def saved_activations(self, config: DistbenchConfig) -> SavedActivations:
        """What autograd saves per layer of `config`'s network, on this machine's CPU."""
        from harness.measure import saved_activations

        with TorchThreads(2):  # sizes, not times: the thread count only changes how long
            return saved_activations.measure(
                config.network.ref, config.dataset.spec, seed=config.run.seed
            )

    def layer_profile(
        self, config: DistbenchConfig, *, threads: int | None, spread: float
    ) -> NetworkProfile:
        """Each layer of `config`'s network profiled on this machine's CPU, built with the
        cell's seed, at the batch its workers step on (`profile_network`)."""
        import torch

        from harness.distributions.pipeline import profile_network
        from workloads.networks import build_network, to_layer_list

        torch.manual_seed(config.run.seed)
        network = build_network(config.network.ref, config.dataset.spec)
        layers = to_layer_list(config.network.ref, network)
        with TorchThreads(threads):
            return profile_network(config, layers, torch.device("cpu"), spread=spread)

    def stages_in_place(self, config: DistbenchConfig, plan: StagePlan) -> InPlaceStages:
        """`python -m harness.stage_timing` on the cell with `plan`'s balance, in a process of
        its own (it starts the stages' workers through the launchers); RuntimeError, with the
        run's last error line, where it fails."""
        with tempfile.TemporaryDirectory(prefix="distbench-stages-") as scratch:
            cell, out = Path(scratch) / "cell.yaml", Path(scratch) / "stages.json"
            _save_pinned(config, plan, cell)
            print(
                f"timing {config.network.key}'s {len(plan.stages)} {config.distribution.name} "
                f"stages in place (a short training run, each stage a process)...",
                file=sys.stderr,
                flush=True,
            )
            done = subprocess.run(
                [sys.executable, "-m", "harness.stage_timing", str(cell), str(out)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0 or not out.exists():
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(
                    f"timing the stages of {config.run_name} in place failed "
                    f"(exit {done.returncode}: {last})"
                )
            return InPlaceStages.from_json(json.loads(out.read_text()))


def _save_pinned(config: DistbenchConfig, plan: StagePlan, path: Path) -> None:
    """`config` with its pipeline's balance pinned to `plan`, saved as the resolved YAML that
    `python -m harness.stage_timing` reads."""
    from omegaconf import OmegaConf

    from harness.distributions.pipeline_config import PipelineConfig

    assert isinstance(config.distribution, PipelineConfig), config.distribution
    balance = [stage.layers for stage in plan.stages]
    pinned = replace(config, distribution=replace(config.distribution, balance=balance))
    OmegaConf.save(OmegaConf.structured(pinned), path)


class RuntimeMemoryReading:
    """A runtime memory probe started (`harness.worker.runtime_memory.RuntimeProbe`), read as
    the facts cache keeps it."""

    def __init__(self, probe: RuntimeProbe) -> None:
        self.probe = probe

    def read(self) -> RuntimeShare:
        """The probe's reading, once it ends: the runtime share and, on CUDA, its context."""
        reading = self.probe.reading()
        return RuntimeShare(reading["runtime_mb"], reading.get("context_mb", 0.0))

    def stop(self) -> None:
        """End the probe unread."""
        self.probe.stop()


class TorchThreads:
    """Run with torch limited to `threads` (the worker's; None: as it is), then restore the
    caller's."""

    def __init__(self, threads: int | None) -> None:
        import torch  # measuring: the commands' --help and bad input load no torch

        self.torch: Any = torch
        self.threads = threads
        self.before = torch.get_num_threads()

    def __enter__(self) -> None:
        if self.threads is not None:
            self.torch.set_num_threads(self.threads)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.torch.set_num_threads(self.before)
