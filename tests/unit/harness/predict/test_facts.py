"""Predicting from kept facts (`harness.predict.facts`): with no measurements handed to the cache,
a cell's time and memory come from the facts file alone, no worker or other child process is
started and no trainer is imported; where the file lacks a fact, the cache falls back to what
needs no measuring (or names what to measure) instead of measuring it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from harness.commands.compose import compose_config
from harness.config.schema import DistbenchConfig, validate
from harness.predict.facts.cache import cache_for
from harness.predict.facts.gather import gather, recorded_step_time
from harness.predict.facts.store import FactsStore, MissingMeasurement, facts_path, runtime_key
from harness.profiles.network import LayerProfile, NetworkProfile
from harness.profiles.runtime import RuntimeShare
from tests.helpers import REPO_ROOT
from tests.meta.test_import_graph import trains_or_starts_workers

HARDWARE = "local_2cpu"
CELLS = {
    "sequential": ["distribution=sequential"],
    "gpipe": ["distribution=gpipe"],  # a pipeline: its plan comes from the kept layer profile
}
RUNTIME_MB = 321.0
KEPT_ON = "a machine measured earlier"

# Predicts each cell of argv[1] (lists of overrides) from the facts under argv[2], with every
# way of starting a process refused, and prints what it predicted, what it measured, which of
# harness' modules it imported and its child processes.
_PREDICT = r"""
import json, multiprocessing.process, os, subprocess, sys
from pathlib import Path

# torch's own import asks ldconfig where CUDA's libraries are (ctypes.util.find_library): a
# library loading itself, done first; what is refused below is a process the prediction starts.
import torch


def refuse(*args, **kwargs):
    raise AssertionError("a prediction from kept facts started a process")


subprocess.Popen.__init__ = refuse
multiprocessing.process.BaseProcess.start = refuse
for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
    if hasattr(os, name):
        setattr(os, name, refuse)

import psutil

from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.predict.cell import epoch_terms, memory_per_worker_mb
from harness.predict.facts.cache import cache_for
from harness.predict.facts.gather import gather
from harness.profiles.hardware import HardwareProfile

cells, root = json.loads(sys.argv[1]), Path(sys.argv[2])
cache = cache_for(5, facts_root=root)  # probe allowed, but no measurements given
rows = []
for overrides in cells:
    config = validate(compose_config(overrides))
    facts = gather(config, cache)
    terms = epoch_terms(config, facts, HardwareProfile.from_config(config.hardware))
    rows.append(
        {
            "step_seconds": facts.step_seconds,
            "epoch_seconds": terms.seconds(),
            "memory_mb": max(memory_per_worker_mb(config, facts)),
            "runtime_mb": facts.runtime_mb,
            "saved": all(layer.saved is not None for layer in facts.layers),
            "stages": None if facts.plan is None else len(facts.plan.stages),
        }
    )
print(
    json.dumps(
        {
            "rows": rows,
            "measured": cache.measured,
            "profile_sources": sorted(set(cache.profile_sources.values())),
            "modules": sorted(name for name in sys.modules if name.startswith("harness")),
            "children": [child.pid for child in psutil.Process().children(recursive=True)],
        }
    )
)
"""


def _config(root: Path, cell: str) -> DistbenchConfig:
    return validate(
        compose_config(
            [
                "dataset=mnist",
                "network=mobilenetv2",
                f"hardware={HARDWARE}",
                "distribution.batch_size=8",
                f"run.output_dir={root}",
                *CELLS[cell],
            ]
        )
    )


def _profile(static: dict, batch: int) -> NetworkProfile:
    """A layer profile of the network's layers at `batch`, as a probe on another machine kept."""
    return NetworkProfile(
        batch,
        "cpu",
        [
            LayerProfile(
                index=layer["index"],
                type=layer["type"],
                forward_ms=1.0 + layer["index"] % 3,
                backward_ms=2.0 + layer["index"] % 3,
                update_ms=0.1,
                activation_mb=layer["activation_mb"] * batch,
                parameter_mb=layer["parameters"] * 4 / 1e6,
            )
            for layer in static["layers"]
        ],
    )


def _keep_facts(root: Path) -> dict[str, float]:
    """A facts file holding all the cells need: a step time at each cell's step batch, a layer
    profile there, the saved activations (measured here, on the CPU) and a runtime share; the
    step seconds kept per cell."""
    from harness.measure.network_facts import describe
    from harness.measure.saved_activations import measure
    from harness.worker.measurements import TorchThreads

    store = FactsStore.load(facts_path(root, HARDWARE), HARDWARE)
    steps = {}
    for number, cell in enumerate(CELLS):
        config = _config(root, cell)
        batch = config.distribution.step_batch(config)
        steps[cell] = 0.05 * (number + 1)
        store.record_step(
            network="mobilenetv2",
            dataset="mnist",
            device="cpu",
            threads=config.hardware.cpu_threads,
            device_name=KEPT_ON,
            batch=batch,
            seconds=steps[cell],
            probe_batches=5,
            probe_asked=5,
        )
        store.record_profile(
            network="mobilenetv2",
            dataset="mnist",
            device="cpu",
            threads=config.hardware.cpu_threads,
            device_name=KEPT_ON,
            profile=_profile(describe(config.network.ref, config.dataset.spec), batch),
        )
        store.record_runtime(runtime_key(config), RuntimeShare(RUNTIME_MB), device_name=KEPT_ON)
    config = _config(root, "sequential")
    # Sizes, not times, on one thread: two on cores the suite keeps busy spin while they wait
    # for each other (1.7 against 0.3 CPU-s for the same sizes, with the cores oversubscribed).
    with TorchThreads(1):
        saved = measure(config.network.ref, config.dataset.spec)
    store.record_saved("mobilenetv2", "mnist", saved)
    store.save()
    return steps


def test_a_prediction_from_kept_facts_starts_no_process_and_imports_no_trainer(
    tmp_path: Path,
) -> None:
    steps = _keep_facts(tmp_path)
    cells = [_config(tmp_path, cell) for cell in CELLS]
    overrides = [
        ["dataset=mnist", "network=mobilenetv2", f"hardware={HARDWARE}"]
        + ["distribution.batch_size=8", f"run.output_dir={tmp_path}", *CELLS[cell]]
        for cell in CELLS
    ]
    done = subprocess.run(
        [sys.executable, "-c", _PREDICT, json.dumps(overrides), str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert [row["step_seconds"] for row in answer["rows"]] == list(steps.values())
    for row in answer["rows"]:
        assert math.isfinite(row["epoch_seconds"]) and row["epoch_seconds"] > 0
        assert row["memory_mb"] > RUNTIME_MB and row["runtime_mb"] == RUNTIME_MB
        assert row["saved"]  # the kept saved activations, not the layer outputs' fallback
    assert [row["stages"] for row in answer["rows"]] == [
        None,
        cells[1].world_size,  # a stage per worker, planned from the kept profile
    ]
    assert answer["measured"] == []
    assert answer["profile_sources"] == [f"facts file {facts_path(tmp_path, HARDWARE)}"]
    loaded = [name for name in answer["modules"] if trains_or_starts_workers(name)]
    assert loaded == [], f"a prediction from kept facts imported {loaded}"
    assert answer["children"] == []


def test_without_measurements_a_missing_fact_is_not_measured(tmp_path: Path) -> None:
    """An empty facts file and no measurements: the memory facts fall back to the layer outputs
    and no runtime share, a layer profile is estimated from the layers' parameters, and a step
    time is a MissingMeasurement that says what to run where."""
    cache = cache_for(5, facts_root=tmp_path)
    facts = gather(_config(tmp_path, "gpipe"), cache, timed=False)
    assert facts.runtime_mb == 0.0 and facts.context_mb == 0.0
    assert all(layer.saved is None for layer in facts.layers)
    assert facts.plan is not None
    (source,) = cache.profile_sources.values()
    assert source.startswith("estimated from each layer's parameters (nothing is measured here)")
    assert cache.measured == []
    with pytest.raises(MissingMeasurement, match="no sequential step time measured on cpu"):
        gather(_config(tmp_path, "sequential"), cache)


def test_a_missing_step_time_no_one_worker_can_measure_names_no_command_for_it(
    tmp_path: Path,
) -> None:
    """Where a sequential cell of the network would be refused on the hardware (its weights
    cannot fit one worker), the missing step time says so and where such a time can come
    from, instead of a `python -m harness` command that would be refused."""
    config = validate(
        compose_config(
            [
                "dataset=tokens",
                "network=gpt2_tiny",
                f"hardware={HARDWARE}",
                "distribution=fsdp",  # splits the weights: this cell itself may fit
                "distribution.batch_size=2",
                "hardware.device_memory_gb=0.001",
                f"run.output_dir={tmp_path}",
            ]
        ),
        weights_must_fit=False,
    )
    with pytest.raises(MissingMeasurement) as missing:
        recorded_step_time(config, 2, cache_for(5, facts_root=tmp_path))
    message = str(missing.value)
    assert "no sequential step time measured on cpu" in message
    assert (
        f"no sequential cell can measure it on hardware={HARDWARE}: its weights, gradients and "
        "optimizer state alone need"
    ) in message
    assert "more than hardware.device_memory_gb=0.001" in message
    assert "python -m harness " not in message
