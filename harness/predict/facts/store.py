"""The facts file: what was measured for one hardware configuration, kept as JSON per hardware
in `<run.output_dir>/facts/<hardware>.json` (`facts_path`), its schema checked at load
(`FactsStore.load`: a damaged or hand-edited file is named in one line), read back by key and
written atomically (`FactsStore.save`, `keep`).

The keys a kept fact is found by live here too: the worker's threads (`worker_threads`), a
runtime share's (`runtime_key`) and a pipeline's stages timed in place (`in_place_key`).
Records only: nothing here measures, and nothing loads torch.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.config.accepts import finite_number
from harness.config.schema import ConfigError, DistbenchConfig
from harness.costs.activations import LayerSaved, SavedActivations, SavedGroup
from harness.costs.partition import StagePlan
from harness.profiles.network import LayerProfile, NetworkProfile
from harness.profiles.runtime import RuntimeShare
from harness.profiles.stages import InPlaceStages
from harness.profiles.steps import MeasuredStep


def worker_threads(config: DistbenchConfig) -> int | None:
    """torch's threads in a worker of `config`: `hardware.cpu_threads` on a CPU, None on CUDA
    (part of every key a measurement is kept under: a step on 1 thread is not one on 4)."""
    return config.hardware.cpu_threads if config.hardware.device.value == "cpu" else None


def runtime_key(config: DistbenchConfig) -> tuple[Any, ...]:
    """What the runtime share depends on: the data set (and how it is read), the device and
    the threads. Not the distribution model: a process group and Horovod's library add under
    5 MB (measured on the calibration machine: 954, 955 and 959 MB for a sequential, a
    distributed and a Horovod worker of MNIST), so one probe per data set serves them all."""
    dataset = config.dataset
    # A network from another source brings its library's imports (transformers, timm, the
    # user's package): its own share; the built-in networks share one.
    key = (
        dataset.key,
        dataset.source.value,
        dataset.num_samples,
        dataset.num_workers,
        config.hardware.device.value,
        config.hardware.cpu_threads,
    )
    return key if config.network.ref.is_builtin else (*key, config.network.key)


def in_place_key(config: DistbenchConfig, plan: StagePlan) -> tuple[Any, ...]:
    """What a pipeline's stages timed in place depend on: the workload, the device and its
    threads, the batch, the distribution's settings and the plan's layers per stage."""
    settings = {
        key: value
        for key, value in sorted(asdict(config.distribution).items())
        if key not in ("balance", "backend")
    }
    return (
        config.network.key,
        config.dataset.key,
        config.hardware.device.value,
        worker_threads(config),
        json.dumps(settings, sort_keys=True, default=str),
        ",".join(str(stage.layers) for stage in plan.stages),
    )


FACTS_DIR = "facts"
_FACTS_FORMAT = 2  # 1 had no spread (q1/q3), no runtime shares: still read


class MissingMeasurement(ConfigError):
    """No step time measured on the hardware's device for a workload (or a facts file that
    cannot be read), and no device here to measure it: bad input (exit status 2), with what to
    run where. No candidate of a recommendation can be predicted without it."""


# The lists of a facts file, in FactsStore's field order.
_FACTS_LISTS = ("step_times", "layer_profiles", "runtimes", "saved_activations", "stages_in_place")


def _entries(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The facts file's list `name` (absent: empty); TypeError naming it if it is not a list
    of objects (a hand-edited or foreign file), which would fail later, far from the file."""
    entries = data.get(name, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise TypeError(f"{name} is a JSON {type(entries).__name__}, not a list of objects")
    return entries


def _number(value: Any) -> bool:
    return finite_number(value) and value >= 0


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _text(value: object) -> bool:
    return isinstance(value, str)


def _positive(value: Any) -> bool:
    return _number(value) and value > 0


# What each kept entry's fields must be (required, then optional: null or absent allowed),
# as `FactsStore.record_*` write them. Checked at load, so that a hand-edited or damaged file
# is named in one line instead of a float() or a comparison failing far from it (found by
# fuzzing: tests/faults/test_damaged_state_files.py).
_Fields = tuple[dict[str, Callable[[Any], bool]], dict[str, Callable[[Any], bool]]]
_KEPT: dict[str, _Fields] = {
    "step_times": (
        {"batch": _positive_int, "seconds": _positive},
        {
            "q1_seconds": _number,
            "q3_seconds": _number,
            "reference_ms": _positive,
            "speed_change": finite_number,  # after over before, less 1: either sign
            "contradicts": _positive_int,  # a batch (harness.profiles.steps.contradict)
            "probe_batches": _positive_int,
            "probe_asked": _positive_int,
            "measured_at": _text,
            "device_name": _text,
        },
    ),
    "layer_profiles": (
        {"profile": lambda v: isinstance(v, dict)},
        {"measured_at": _text, "device_name": _text},
    ),
    "runtimes": (
        {"mb": _number},
        {"context_mb": _number, "measured_at": _text, "device_name": _text},
    ),
    "stages_in_place": (
        {"stages": lambda v: isinstance(v, list)},
        {"reference_ms": _positive, "measured_at": _text, "device_name": _text},
    ),
    "saved_activations": ({}, {"measured_at": _text}),
}
_PROFILE: _Fields = (
    {"batch_size": _positive_int, "device": _text, "layers": lambda v: isinstance(v, list)},
    {},
)
_LAYER: _Fields = (
    {
        "index": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "type": _text,
        **dict.fromkeys(
            ("forward_ms", "backward_ms", "update_ms", "activation_mb", "parameter_mb"), _number
        ),
    },
    {},
)
_STAGE: _Fields = (dict.fromkeys(("forward_s", "backward_s", "update_s"), _number), {})


def _when(entry: dict[str, Any]) -> str:
    """When a kept entry was measured, for "the newest": "" where not recorded (null)."""
    return str(entry.get("measured_at") or "")


def _check_fields(where: str, entry: object, fields: _Fields) -> None:
    """TypeError naming the first field of `entry` that is not what is kept there."""
    if not isinstance(entry, dict):
        raise TypeError(f"{where} is a JSON {type(entry).__name__}, not an object")
    required, optional = fields
    for name, sound in required.items():
        if not sound(entry.get(name)):
            raise TypeError(f"{where}.{name} is {json.dumps(entry.get(name))}")
    for name, sound in optional.items():
        if entry.get(name) is not None and not sound(entry[name]):
            raise TypeError(f"{where}.{name} is {json.dumps(entry[name])}")


def _check_kept(name: str, entries: list[dict[str, Any]]) -> None:
    """Every entry of the facts file's list `name`, and what it nests (a layer profile's
    layers, the stages timed in place), checked (`_KEPT`)."""
    for position, entry in enumerate(entries):
        where = f"{name}[{position}]"
        _check_fields(where, entry, _KEPT[name])
        if name == "layer_profiles":
            _check_fields(f"{where}.profile", entry["profile"], _PROFILE)
            for index, layer in enumerate(entry["profile"]["layers"]):
                _check_fields(f"{where}.profile.layers[{index}]", layer, _LAYER)
        if name == "stages_in_place":
            for index, stage in enumerate(entry["stages"]):
                _check_fields(f"{where}.stages[{index}]", stage, _STAGE)


def facts_path(output_root: Path | str, hardware: str) -> Path:
    """The facts measured for hardware configuration `hardware`:
    `<run.output_dir>/facts/<hardware>.json`."""
    return Path(output_root) / FACTS_DIR / f"{hardware}.json"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


_STEP_KEY = ("network", "dataset", "device", "device_name", "threads", "batch")
_PROFILE_KEY = ("network", "dataset", "device", "device_name", "threads")


def _profile_batch(entry: dict[str, Any]) -> int:
    """The batch a kept layer profile was taken at."""
    return int(entry.get("profile", {}).get("batch_size", 0))


@dataclass
class FactsStore:
    """The facts measured for one hardware configuration, kept as JSON at `facts_path`:

        {"format": 2, "hardware": NAME,
         "step_times": [{network, dataset, device, device_name, threads, batch, seconds,
                         q1_seconds, q3_seconds, std_seconds, batch_seconds, probe_batches,
                         probe_asked, reference_ms, speed_change, measured_at}, ...],
         "layer_profiles": [{network, dataset, device, device_name, threads, measured_at,
                             profile: NetworkProfile.to_dict()}, ...],
         "runtimes": [{key, device_name, mb, context_mb, measured_at}, ...],
         "saved_activations": [{network, dataset, measured_at,
                                saved: costs.activations.SavedActivations}, ...],
         "stages_in_place": [{key, device_name, stages, reference_ms, measured_at}, ...]}

    `seconds` is the median of one sequential training step (forward, backward, update) at
    `batch` on the device `device_name` of kind `device` (`threads`: torch's threads on a CPU,
    null on CUDA or for torch's default), over `probe_batches` timed steps (`batch_seconds`,
    their quartiles `q1_seconds` and `q3_seconds`) of a probe asked for at most `probe_asked`
    (fewer once steady: `harness.measure.timing_rule.ProbeLength`). A runtime share
    (`harness.profiles.runtime.RuntimeShare`) is kept per `runtime_key` (`key`), what autograd
    saves per layer (sizes, on a CPU) per network, a pipeline's stages timed in place
    (`harness.profiles.stages.InPlaceStages`) per `in_place_key`. A new measurement replaces an
    older one of the same key; `save` writes atomically
    (`harness.records.results.write_json_atomic`).
    """

    path: Path
    hardware: str
    step_times: list[dict[str, Any]] = field(default_factory=list)
    layer_profiles: list[dict[str, Any]] = field(default_factory=list)
    runtimes: list[dict[str, Any]] = field(default_factory=list)
    saved_activations: list[dict[str, Any]] = field(default_factory=list)
    stages_in_place: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path | str, hardware: str | None = None) -> FactsStore:
        """The store at `path`; empty if there is no file yet."""
        path = Path(path)
        if not path.exists():
            return cls(path, hardware or path.stem)
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise TypeError(f"a JSON {type(data).__name__}, not an object")
            lists = [_entries(data, name) for name in _FACTS_LISTS]
            for name, entries in zip(_FACTS_LISTS, lists):
                _check_kept(name, entries)
            return cls(path, str(data.get("hardware") or hardware or path.stem), *lists)
        except (OSError, ValueError, AttributeError, TypeError) as err:
            raise MissingMeasurement(
                f"{path}: not a readable distbench facts file ({err}); "
                f"move it away and measure again"
            ) from None

    def save(self) -> Path:
        from workloads.datasets.atomic import write_json_atomic

        write_json_atomic(
            self.path,
            {
                "format": _FACTS_FORMAT,
                "hardware": self.hardware,
                "step_times": self.step_times,
                "layer_profiles": self.layer_profiles,
                "runtimes": self.runtimes,
                "saved_activations": self.saved_activations,
                "stages_in_place": self.stages_in_place,
            },
        )
        return self.path

    def record_step(
        self,
        *,
        network: str,
        dataset: str,
        device: str,
        batch: int,
        seconds: float,
        threads: int | None = None,
        device_name: str | None = None,
        std_seconds: float = 0.0,
        probe_batches: int | None = None,
        probe_asked: int | None = None,
        q1_seconds: float | None = None,
        q3_seconds: float | None = None,
        batch_seconds: Sequence[float] = (),
        reference_ms: float | None = None,
        speed_change: float | None = None,
    ) -> None:
        """Keep one measured sequential step time (call `save` to write the file);
        `reference_ms`: the reference kernel's milliseconds around it (the machine's speed);
        `speed_change`: how much that speed changed around it, where it stayed unsteady however
        often it was timed again (`BatchTiming.unsteady_drift`; None: steady)."""
        if batch < 1 or not seconds > 0:
            raise ValueError(
                f"a step time needs batch >= 1 and seconds > 0, got {batch}, {seconds}"
            )
        entry = {
            "network": network,
            "dataset": dataset,
            "device": device,
            "device_name": device_name,
            "threads": threads,
            "batch": batch,
            "seconds": seconds,
            "q1_seconds": q1_seconds,
            "q3_seconds": q3_seconds,
            "std_seconds": std_seconds,
            "batch_seconds": list(batch_seconds),
            "probe_batches": probe_batches,
            "probe_asked": probe_asked,
            "reference_ms": reference_ms,
            "measured_at": _now(),
        }
        if speed_change is not None:
            entry["speed_change"] = speed_change
        self.step_times = [
            old for old in self.step_times if any(old.get(k) != entry[k] for k in _STEP_KEY)
        ] + [entry]

    def record_profile(
        self,
        *,
        network: str,
        dataset: str,
        device: str,
        profile: NetworkProfile,
        threads: int | None = None,
        device_name: str | None = None,
    ) -> None:
        """Keep a network's per-layer profile."""
        entry = {
            "network": network,
            "dataset": dataset,
            "device": device,
            "device_name": device_name,
            "threads": threads,
            "measured_at": _now(),
            "profile": profile.to_dict(),
        }
        self.layer_profiles = [
            old
            for old in self.layer_profiles
            if any(old.get(k) != entry[k] for k in _PROFILE_KEY)
            or _profile_batch(old) != profile.batch_size
        ] + [entry]

    def record_runtime(
        self, key: Sequence[Any], share: RuntimeShare, device_name: str | None = None
    ) -> None:
        """Keep a worker's measured runtime share for `runtime_key` `key`."""
        entry = {
            "key": list(key),
            "device_name": device_name,
            "mb": share.mb,
            "context_mb": share.context_mb,
            "measured_at": _now(),
        }
        self.runtimes = [
            old
            for old in self.runtimes
            if (old.get("key"), old.get("device_name")) != (entry["key"], device_name)
        ] + [entry]

    def runtime(self, key: Sequence[Any], device_name: str | None = None) -> RuntimeShare | None:
        """The newest runtime share kept for `key` (measured on `device_name` when given)."""
        found = [
            entry
            for entry in self.runtimes
            if entry.get("key") == list(key) and device_name in (None, entry.get("device_name"))
        ]
        if not found:
            return None
        newest = max(found, key=_when)
        try:
            return RuntimeShare(float(newest["mb"]), float(newest.get("context_mb", 0.0)))
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(
                f"{self.path}: the runtime share kept for {list(key)} is not in "
                f"today's format ({err}); measure it again"
            ) from None

    def record_in_place(
        self, key: Sequence[Any], timed: InPlaceStages, device_name: str | None = None
    ) -> None:
        """Keep a pipeline's stages timed in place for `in_place_key` `key`."""
        entry = {"key": list(key), "device_name": device_name, **timed.to_json()}
        self.stages_in_place = [
            old
            for old in self.stages_in_place
            if (old.get("key"), old.get("device_name")) != (entry["key"], device_name)
        ] + [entry]

    def in_place(self, key: Sequence[Any], device_name: str | None = None) -> InPlaceStages | None:
        """The newest stages timed in place for `key` (on `device_name` when given)."""
        found = [
            entry
            for entry in self.stages_in_place
            if entry.get("key") == list(key) and device_name in (None, entry.get("device_name"))
        ]
        if not found:
            return None
        return InPlaceStages.from_json(max(found, key=_when))

    def record_saved(self, network: str, dataset: str, saved: SavedActivations) -> None:
        """Keep what autograd saves per layer of a network (`harness.costs.activations`;
        sizes, measured on a CPU whatever the device)."""
        entry = {
            "network": network,
            "dataset": dataset,
            "measured_at": _now(),
            "saved": asdict(saved),
        }
        self.saved_activations = [
            old
            for old in self.saved_activations
            if (old.get("network"), old.get("dataset")) != (network, dataset)
        ]
        self.saved_activations.append(entry)

    def saved(self, network: str, dataset: str) -> SavedActivations | None:
        """The saved activations kept for a network, or None."""
        found = [
            entry["saved"]
            for entry in self.saved_activations
            if (entry.get("network"), entry.get("dataset")) == (network, dataset)
        ]
        if not found:
            return None
        data = found[-1]
        try:
            layers = tuple(
                LayerSaved(
                    tuple(SavedGroup(**group) for group in layer["groups"]),
                    *(
                        layer[name]
                        for name in ("output_mb_per_sample", "saves_input", "output_saver")
                    ),
                )
                for layer in data["layers"]
            )
            return SavedActivations(
                layers,
                float(data["input_mb_per_sample"]),
                tuple(data["batches"]),
                float(data["seconds"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(
                f"{self.path}: the saved activations of {network}/{dataset} are "
                f"not in today's format ({err}); measure them again"
            ) from None

    def steps(
        self,
        network: str,
        dataset: str,
        device: str,
        threads: int | None,
        device_name: str | None = None,
    ) -> list[MeasuredStep]:
        """The step times kept for the workload on the device (the one named `device_name`
        when given), the newest per batch."""
        newest: dict[int, dict[str, Any]] = {}
        for entry in self.step_times:
            if (
                entry.get("network"),
                entry.get("dataset"),
                entry.get("device"),
                entry.get("threads"),
            ) == (network, dataset, device, threads) and device_name in (
                None,
                entry.get("device_name"),
            ):
                batch = int(entry["batch"])
                if batch not in newest or _when(entry) >= _when(newest[batch]):
                    newest[batch] = entry
        return [self._measured_step(entry) for _, entry in sorted(newest.items())]

    def _measured_step(self, entry: dict[str, Any]) -> MeasuredStep:
        def optional(name: str) -> float | None:
            return None if entry.get(name) is None else float(entry[name])

        changed = optional("speed_change")
        unsteady = (
            ""
            if changed is None
            else f" (measured while the machine's speed changed by {changed:+.0%}: time it "
            f"again on a quiet machine, --remeasure)"
        )
        contradicts = entry.get("contradicts")
        return MeasuredStep(
            int(entry["batch"]),
            float(entry["seconds"]),
            f"facts file {self.path}{unsteady}",
            0,
            entry.get("device_name"),
            optional("q1_seconds"),
            optional("q3_seconds"),
            entry.get("probe_batches"),
            entry.get("measured_at"),
            optional("reference_ms"),
            probe_asked=entry.get("probe_asked"),
            contradicts=None if contradicts is None else int(contradicts),
        )

    def note_contradiction(
        self,
        *,
        network: str,
        dataset: str,
        device: str,
        threads: int | None,
        device_name: str | None,
        batch: int,
        other: int,
    ) -> bool:
        """Note beside the newest step time kept at `batch` for the workload that it contradicts
        the one at batch `other` though both were timed again (`harness.profiles.steps.
        contradict`): later runs say so, and time them again only when asked (--remeasure).
        Whether anything changed (call `save` then)."""
        wanted = dict(zip(_STEP_KEY, (network, dataset, device, device_name, threads, batch)))
        entries = [e for e in self.step_times if all(e.get(k) == v for k, v in wanted.items())]
        if not entries:
            return False
        newest = max(entries, key=_when)
        if newest.get("contradicts") == other:
            return False
        newest["contradicts"] = other
        return True

    def profile(
        self,
        network: str,
        dataset: str,
        device: str,
        threads: int | None,
        device_name: str | None = None,
        batch: int | None = None,
    ) -> NetworkProfile | None:
        """The newest layer profile kept for the workload on the device (the one named
        `device_name` when given), at `batch` where one was taken there, else at the nearest
        batch kept; or None."""
        found = [
            entry
            for entry in self.layer_profiles
            if (
                entry.get("network"),
                entry.get("dataset"),
                entry.get("device"),
                entry.get("threads"),
            )
            == (network, dataset, device, threads)
            and device_name in (None, entry.get("device_name"))
        ]
        if not found:
            return None
        # the batch's (else the nearest batch's), then the newest (the later kept on a tie)
        _, _, _, data = max(
            (
                -abs(_profile_batch(entry) - batch) if batch is not None else 0,
                _when(entry),
                position,
                entry["profile"],
            )
            for position, entry in enumerate(found)
        )
        try:
            return NetworkProfile(
                int(data["batch_size"]),
                str(data["device"]),
                [LayerProfile(**layer) for layer in data["layers"]],
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(
                f"{self.path}: the layer profile of {network}/{dataset} is not "
                f"in today's format ({err}); measure it again"
            ) from None


def keep(path: Path, hardware: str, update: Callable[[FactsStore], object]) -> Path | None:
    """Add a measurement to the facts file at `path` (re-read first, so that measurements
    another process kept meanwhile stay); the file's path, or None (with one line on stderr)
    when it cannot be written: the measurement itself is still used."""
    try:
        store = FactsStore.load(path, hardware)
        update(store)
        return store.save()
    except (OSError, ConfigError) as err:
        print(
            f"distbench: could not keep measured facts in {path}: {err}",
            file=sys.stderr,
            flush=True,
        )
        return None
