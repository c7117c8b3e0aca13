"""One grid cell, end to end: validate, build, warm up, time the epochs, record.

`run_cell` is a plain function of a composed config, so tests and launchers call it the same
way `python -m harness` does. Whatever happens inside the measurement (an out-of-memory error,
a crash), the cell ends with a result.json and an MLflow run that say so.
"""

from __future__ import annotations

import datetime as dt
import logging
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from harness.config import DistbenchConfig, resolved_container, validate
from harness.distributions import EpochMeasurement, trainer_factory
from harness.environment import capture_environment
from harness.metrics import PeakMemory, PhaseClock, Summary
from harness.results import CellResult, RunStatus, write_result
from harness.tracking import record_cell, tracking_uri
from harness.workload import build_workload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Measurement:
    epochs: list[EpochMeasurement]
    peak_memory_mb: float
    memory_kind: str

    def metrics(self) -> dict[str, float]:
        seconds = Summary.of([epoch.seconds for epoch in self.epochs])
        samples = sum(epoch.samples for epoch in self.epochs)
        metrics = {
            "seconds_per_epoch": seconds.mean,
            "seconds_per_epoch_median": seconds.median,
            "seconds_per_epoch_std": seconds.std,
            "seconds_per_epoch_min": seconds.min,
            "seconds_per_epoch_max": seconds.max,
            "images_per_second": samples / sum(epoch.seconds for epoch in self.epochs),
            "samples_per_epoch": float(self.epochs[0].samples),
            "batches_per_epoch": float(self.epochs[0].batches),
            "peak_memory_mb": self.peak_memory_mb,
        }
        for phase in self.epochs[0].phase_seconds:
            metrics[f"{phase}_seconds_per_epoch"] = Summary.of(
                [epoch.phase_seconds[phase] for epoch in self.epochs]).mean
        return metrics

    def phase_seconds(self) -> dict[str, list[float]]:
        return {phase: [epoch.phase_seconds[phase] for epoch in self.epochs]
                for phase in self.epochs[0].phase_seconds}


def select_device(config: DistbenchConfig) -> torch.device:
    """The configured device; a missing CUDA device is a configuration error, not a fallback."""
    if config.hardware.device.value == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("hardware.device='cuda' but torch sees no CUDA device here; "
                               "allowed on this machine: cpu")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def measure(config: DistbenchConfig, device: torch.device) -> Measurement:
    """Build the workload, warm up, then train and time `run.epochs` epochs."""
    if config.hardware.cpu_threads is not None:
        torch.set_num_threads(config.hardware.cpu_threads)
    workload = build_workload(config)
    clock = PhaseClock(device, enabled=config.run.phase_timing)
    trainer = trainer_factory(config.distribution.name.value)(
        workload, device, clock, config.run.progress)
    memory = PeakMemory(device)
    memory.reset()
    trainer.warm_up(config.run.warmup_batches)
    epochs = []
    for epoch in range(config.run.epochs):
        epochs.append(trainer.train_epoch(epoch))
        log.info("epoch %d/%d: %.3f s (%d images)", epoch + 1, config.run.epochs,
                 epochs[-1].seconds, epochs[-1].samples)
    return Measurement(epochs=epochs, peak_memory_mb=memory.peak_mb(), memory_kind=memory.kind)


def classify_failure(error: BaseException) -> RunStatus:
    """Out-of-memory errors (CUDA's, the CPU allocator's, Python's) are `oom`; others `failed`."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return RunStatus.oom
    text = str(error).lower()
    if "out of memory" in text or "can't allocate memory" in text:
        return RunStatus.oom
    return RunStatus.failed


def run_cell(cfg: DictConfig, output_dir: Path | None = None) -> dict[str, Any]:
    """Measure one grid cell and record it; return the result as a dict.

    Raises ConfigError (before anything is built) if the config is invalid. Errors during the
    measurement do not raise: they end up in the result with status `oom` or `failed`.
    """
    config = validate(cfg)
    output_dir = Path(output_dir or _hydra_output_dir() or _fresh_run_dir(config))
    started = now()
    device = torch.device("cpu")
    status, error, measurement = RunStatus.ok, None, None
    try:
        device = select_device(config)
        measurement = measure(config, device)
    except Exception as err:  # noqa: BLE001 - a failing cell is a result, not a crash
        status, error = classify_failure(err), traceback.format_exc()
        log.error("cell %s ended with status %s: %s", config.run_name, status.value, err)

    result = _new_result(cfg, config, output_dir, started, device, status, error)
    if measurement is not None:
        result.metrics = measurement.metrics()
        result.epoch_seconds = [epoch.seconds for epoch in measurement.epochs]
        result.phase_seconds = measurement.phase_seconds()
        result.environment["memory_kind"] = measurement.memory_kind
    finish_cell(result, config)
    return result.to_dict()


def record_failure(cfg: DictConfig, output_dir: Path, status: RunStatus, error: str,
                   started: str | None = None) -> dict[str, Any]:
    """Record a cell whose process could not record itself (killed, timed out, crashed hard)."""
    config = validate(cfg)
    result = _new_result(cfg, config, output_dir, started or now(), torch.device("cpu"),
                         status, error)
    finish_cell(result, config)
    return result.to_dict()


def _new_result(cfg: DictConfig, config: DistbenchConfig, output_dir: Path, started: str,
                device: torch.device, status: RunStatus, error: str | None) -> CellResult:
    resolved = resolved_container(cfg)
    resolved["distribution"]["batch_size"] = config.batch_size  # what Table 3.3 resolved to
    return CellResult(
        status=status, run_name=config.run_name, output_dir=str(output_dir.resolve()),
        started_at=started, finished_at=now(), config=resolved,
        environment=capture_environment(device), error=error,
    )


def finish_cell(result: CellResult, config: DistbenchConfig) -> None:
    """Write result.json first (the source of truth), then copy it into MLflow."""
    output_dir = Path(result.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config_path = output_dir / "config.yaml"
    OmegaConf.save(OmegaConf.create(result.config), config_path)
    result_path = write_result(result)
    if not config.tracking.enabled:
        return
    uri = tracking_uri(config.tracking.uri, config.run.output_dir)
    try:
        result.mlflow_run_id = record_cell(result, uri=uri, experiment=config.tracking.experiment,
                                           artifacts=[config_path, result_path])
    except Exception as err:  # noqa: BLE001 - result.json already holds the result
        result.tracking_error = f"{type(err).__name__}: {err}"
        log.warning("MLflow could not record %s (%s); result kept in %s", result.run_name,
                    result.tracking_error, result_path)
    write_result(result)
    _log_summary(result, uri)


def _log_summary(result: CellResult, uri: str) -> None:
    if result.status is RunStatus.ok:
        log.info("%s: %.3f s/epoch (median %.3f, std %.3f), %.1f images/s, peak memory %.0f MB",
                 result.run_name, result.metrics["seconds_per_epoch"],
                 result.metrics["seconds_per_epoch_median"],
                 result.metrics["seconds_per_epoch_std"], result.metrics["images_per_second"],
                 result.metrics["peak_memory_mb"])
    log.info("result: %s/result.json; MLflow run %s at %s", result.output_dir,
             result.mlflow_run_id, uri)


def _hydra_output_dir() -> str | None:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None


def _fresh_run_dir(config: DistbenchConfig) -> Path:
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")
    return Path(config.run.output_dir) / "runs" / stamp


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
