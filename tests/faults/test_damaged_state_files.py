"""State files that the commands read, damaged: a facts file, a fit.json, a cell's index entry,
a result.json, a measured hardware profile, and a runtime-memory probe that fails. Each is named
in ONE line with how to recover (harness.cli: exit 2 for a file the user named, 3 for one found
under run.output_dir), not a TypeError/KeyError traceback, and nothing is probed first. Real
files, the commands' real entry points, in this process."""

from __future__ import annotations

import json
import math
import stat
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness.cli.errors import ENVIRONMENT_EXIT_CODE

RECOMMEND = ["dataset=mnist", "network=mobilenetv2", "hardware=local_2cpu", "--no-probe"]


def _recommend(root: Path, *extra: str) -> None:
    from harness.recommend import main

    main([*RECOMMEND, f"run.output_dir={root}", *extra])


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("distbench: "), err
    assert "Traceback" not in err, err
    return err


def test_a_facts_file_of_the_wrong_shape_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`{"step_times": 5}` ended in a TypeError traceback."""
    facts = tmp_path / "facts" / "local_2cpu.json"
    facts.parent.mkdir()
    facts.write_text('{"step_times": 5}')
    with pytest.raises(SystemExit) as stopped:
        _recommend(tmp_path)
    err = _one_line(capsys)
    assert stopped.value.code == 2 and str(facts) in err and "step_times" in err, err
    assert "move it away" in err


def test_a_fit_of_the_wrong_shape_is_named_or_passed_over_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A per-hardware entry that is a list ended in an AttributeError traceback, for --fit
    and for `--dry-run`, which finds the fit itself."""
    fit = tmp_path / "analysis" / "a" / "fit.json"
    fit.parent.mkdir(parents=True)
    fit.write_text('{"hardware": {"local_2cpu": []}}')
    with pytest.raises(SystemExit) as stopped:
        _recommend(tmp_path, f"--fit={fit}")
    err = _one_line(capsys)
    assert stopped.value.code == 2 and f"--fit={fit} is invalid" in err, err
    assert "hardware.local_2cpu is a JSON list" in err

    from harness.analysis.calibration import choose_fit

    assert choose_fit(tmp_path, "local_2cpu", ["ddp"]) is None
    err = _one_line(capsys)
    assert f"passing over {fit}" in err and "run the analysis again" in err, err


def test_a_truncated_hardware_profile_is_named_before_anything_is_probed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It probed for 163 s, then skipped every option with a JSON error naming no file, and
    exited 0."""
    from harness.profiles.hardware import Cost, HardwareProfile, Link, profile_path

    path = profile_path(tmp_path, "local_2cpu")
    path.parent.mkdir()
    text = json.dumps(
        HardwareProfile("local_2cpu", "probe", 2, 1, [Link(0, 1, True, Cost(1e-5, 1e9))]).to_json()
    )
    path.write_text(text[: len(text) // 2])
    with pytest.raises(SystemExit) as stopped:
        _recommend(tmp_path)
    err = _one_line(capsys)
    assert stopped.value.code == ENVIRONMENT_EXIT_CODE, err
    assert f"{path}: not a hardware profile" in err and "move it aside" in err, err
    assert not (tmp_path / "facts").exists()  # nothing probed, nothing kept


@pytest.mark.parametrize("damage", ["index-is-a-list", "result-without-status"])
def test_a_damaged_index_entry_or_result_runs_the_cell_again_saying_so(
    damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cells/<key>.json holding [] (TypeError) or a result.json without status (KeyError)
    stopped a resumed sweep with a traceback."""
    from harness.records.resume import finished_result, index_path

    key = "0123abcd"
    entry, result = index_path(tmp_path, key), tmp_path / "runs" / "x" / "result.json"
    entry.parent.mkdir()
    result.parent.mkdir(parents=True)
    if damage == "index-is-a-list":
        entry.write_text("[]")
        named = entry
    else:
        result.write_text(json.dumps({"cell_key": key, "run_name": "x"}))
        entry.write_text(json.dumps({"cell_key": key, "result": str(result)}))
        named = result
    assert finished_result(tmp_path, key) is None  # unfinished: the cell runs again
    err = _one_line(capsys)
    assert f"distbench: {named}: " in err and "the cell runs again" in err, err


@pytest.mark.parametrize("ending", ["traceback", "killed"])
def test_a_failing_runtime_memory_probe_is_one_line_with_its_error(
    ending: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's process (a real one, standing in for the interpreter) fails: the error
    names its exit and its last line; an empty message was all a killed probe left."""
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.worker.runtime_memory import ProbeFailed, measure_runtime_mb

    script = tmp_path / "python"
    body = {
        "traceback": "echo 'Traceback (most recent call last):' >&2\n"
        "echo 'MemoryError: cannot allocate 64 MB' >&2\nexit 1",
        "killed": "kill -9 $$",
    }[ending]
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(script))
    config = validate(
        compose_config(["dataset=mnist", "network=mobilenetv2", f"run.output_dir={tmp_path}"])
    )
    with pytest.raises(ProbeFailed) as failed:
        measure_runtime_mb(config, timeout_s=30)
    message = str(failed.value)
    assert "\n" not in message
    assert message.endswith(
        {
            "traceback": "(exit status 1): MemoryError: cannot allocate 64 MB",
            "killed": "(killed by SIGKILL): no error recorded",
        }[ending]
    ), message


# Any JSON value, for fuzzing what a damaged or hand-edited fit.json holds where a field is.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_FIT_FIELDS = ("cells", "runtime_mb", "networks", "models", "links", "machines")


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    entry=st.fixed_dictionaries(
        {
            "params": st.just({"contention": 1.0})
            | st.dictionaries(st.text(max_size=8), st.floats() | st.integers(), max_size=3)
            | _JSON
        },
        optional={key: _JSON for key in _FIT_FIELDS},
    ),
    accuracy=_JSON,
    residuals=_JSON,
    noise=_JSON,
)
def test_any_fit_entry_is_read_or_named_in_one_line(
    tmp_path: Path, entry: dict[str, object], accuracy: object, residuals: object, noise: object
) -> None:
    """A fit.json whose fields hold any JSON value (a table of bad inputs holds only what
    someone thought of): it is refused as a ConfigError naming the file, or everything the
    commands print of it (its description, the models' calibration, `--json`'s summary, the
    machine and links lines) is made without an exception."""
    from harness.analysis.calibration import Fitted, machine_since_fit
    from harness.commands.compose import compose_config
    from harness.config.schema import ConfigError, validate
    from harness.profiles.hardware import HardwareProfile
    from harness.profiles.steps import StepTime
    from harness.recommend import links_since_fit

    fit = tmp_path / "fit.json"
    fit.write_text(
        json.dumps(
            {
                "hardware": {"local_2cpu": entry},
                "accuracy": accuracy,
                "residuals": residuals,
                "noise_floor_percent": noise,
            }
        )
    )
    try:
        fitted = Fitted.load(fit, "local_2cpu")
    except ConfigError as err:
        assert f"--fit={fit} is invalid" in str(err)
        return
    # what a prediction multiplies by: finite, a parameter never negative (fitted so)
    assert all(math.isfinite(value) and value >= 0 for value in fitted.params.values())
    assert math.isfinite(fitted.runtime_mb)
    hardware = validate(compose_config(["hardware=local_2cpu"])).hardware
    step = StepTime(32, 0.1, "facts file f.json", 32, "some other machine")
    assert isinstance(fitted.source, str) and isinstance(fitted.noise_text, str)
    for model in ("ddp", "gpipe"):
        assert isinstance(fitted.calibration(model).why, str)
    json.dumps(fitted.summary())
    line = machine_since_fit(fitted, [("batch 32", step)], hardware)
    assert line is None or line.startswith("machine changed since the fit")
    links_since_fit(fitted, HardwareProfile.from_config(hardware))


_STEP_FIELDS = (
    "batch",
    "seconds",
    "q1_seconds",
    "q3_seconds",
    "probe_batches",
    "probe_asked",
    "reference_ms",
    "measured_at",
    "device_name",
)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    fields=st.fixed_dictionaries({}, optional={key: _JSON for key in _STEP_FIELDS}),
    second=st.booleans(),
)
def test_any_kept_step_time_is_read_or_named_in_one_line(
    tmp_path: Path, fields: dict[str, object], second: bool
) -> None:
    """A facts file's step time whose fields hold any JSON value (beside a sound one of
    another batch, or alone): the file is refused naming it and how to recover, or the step
    times it gives are numbers a prediction can use."""
    from harness.predict.facts.store import FactsStore, MissingMeasurement
    from harness.profiles.steps import choose_step_time

    workload = {"network": "resnet18", "dataset": "mnist", "device": "cpu", "threads": 1}
    sound = {**workload, "batch": 64, "seconds": 0.5, "measured_at": "2026-12-02T10:00:00"}
    path = tmp_path / "local_2cpu.json"
    path.write_text(
        json.dumps({"step_times": [{**workload, **fields}, *([sound] if second else [])]})
    )
    try:
        steps = FactsStore.load(path, "local_2cpu").steps("resnet18", "mnist", "cpu", 1)
    except MissingMeasurement as err:
        assert str(path) in str(err) and "move it away" in str(err)
        return
    for step in steps:
        assert step.batch > 0 and math.isfinite(step.seconds) and step.seconds > 0
        chosen = choose_step_time(steps, 32)
        assert chosen is not None and chosen.seconds > 0
        assert isinstance(chosen.describe(), str)


_LINK_FIELDS = ("src", "dst", "same_node", "latency_us", "bandwidth_mbps")


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    link=st.fixed_dictionaries({}, optional={key: _JSON for key in _LINK_FIELDS}),
    workers=_JSON,
    facts=_JSON
    | st.fixed_dictionaries(
        {},
        optional={
            "compute_lost_ms_per_mb": _JSON,
            "probe_rounds": _JSON,
            "probe_rounds_spread": _JSON,
            "collectives_after_compute": _JSON
            | st.fixed_dictionaries(
                {},
                optional={
                    key: _JSON
                    for key in (
                        "workers",
                        "bytes",
                        "all_gather",
                        "reduce_scatter",
                        "compute_before_ms",
                    )
                },
            ),
        },
    ),
)
def test_any_probed_link_is_read_or_named_in_one_line(
    tmp_path: Path, link: dict[str, object], workers: object, facts: object
) -> None:
    """A hardware profile whose link or allreduce entry holds any JSON value where a number
    is: it is refused naming the file and how to recover (StateError), or what the predictions
    ask of it is a time of a transfer, never a ZeroDivisionError or a negative time."""
    from harness.cli.errors import StateError
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.probe import summary
    from harness.profiles.hardware import HardwareProfile, link_line

    sound = {"latency_us": 300.0, "bandwidth_mbps": 1000.0}
    path = tmp_path / "local_2cpu.json"
    path.write_text(
        json.dumps(
            {
                "hardware": "local_2cpu",
                "source": "measured",
                "workers": 2,
                "nodes": 1,
                "facts": facts,
                "links": [{"src": 0, "dst": 1, "same_node": True, **sound, **link}],
                "allreduce": [{**sound, "workers": workers}],
            }
        )
    )
    try:
        profile = HardwareProfile.load(path)
    except StateError as err:
        assert str(path) in str(err) and "harness.probe" in str(err)
        return
    for cost in [link.cost for link in profile.links] + [a.cost for a in profile.allreduce]:
        assert 0 <= cost.seconds(1e6) < math.inf
    hardware = validate(compose_config(["hardware=local_2cpu"])).hardware
    assert isinstance(link_line(hardware, profile), str)
    assert isinstance(summary(profile), str)  # what harness.probe prints of it
    assert 0 <= profile.compute_lost_s_per_mb() < math.inf
    for collective in ("all_gather", "reduce_scatter"):
        curve = profile.collective_after_compute(collective, 2)
        assert curve is None or 0 <= curve.seconds_at(1e6) < math.inf


_LAYER = {
    "index": 0,
    "type": "Conv2d",
    "forward_ms": 1.0,
    "backward_ms": 2.0,
    "update_ms": 0.1,
    "activation_mb": 0.5,
    "parameter_mb": 0.2,
}


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    measured_at=_JSON,
    layer=st.fixed_dictionaries({}, optional=dict.fromkeys(_LAYER, _JSON)),
    profile=st.fixed_dictionaries({}, optional=dict.fromkeys(("batch_size", "device"), _JSON)),
    runtime=st.fixed_dictionaries({}, optional=dict.fromkeys(("mb", "context_mb"), _JSON)),
    stage=st.fixed_dictionaries(
        {}, optional=dict.fromkeys(("forward_s", "backward_s", "update_s"), _JSON)
    ),
    reference_ms=_JSON,
)
@example(measured_at=None, layer={}, profile={}, runtime={}, stage={}, reference_ms=None)
def test_any_kept_profile_runtime_or_stage_is_read_or_named_in_one_line(
    tmp_path: Path,
    measured_at: object,
    layer: dict[str, object],
    profile: dict[str, object],
    runtime: dict[str, object],
    stage: dict[str, object],
    reference_ms: object,
) -> None:
    """A facts file's layer profile, runtime share or stages timed in place whose fields hold
    any JSON value (beside a sound entry of the same key): refused naming the file, or read as
    numbers a prediction can use."""
    from harness.config.schema import ConfigError
    from harness.predict.facts.store import FactsStore, MissingMeasurement

    workload = {"network": "resnet18", "dataset": "mnist", "device": "cpu", "threads": 1}
    sound_profile = {"batch_size": 32, "device": "cpu", "layers": [_LAYER]}
    stages = {"forward_s": 0.1, "backward_s": 0.2, "update_s": 0.01}
    path = tmp_path / "local_2cpu.json"
    path.write_text(
        json.dumps(
            {
                "layer_profiles": [
                    {**workload, "measured_at": "2026-12-01", "profile": sound_profile},
                    {
                        **workload,
                        "measured_at": measured_at,
                        "profile": {**sound_profile, **profile, "layers": [{**_LAYER, **layer}]},
                    },
                ],
                "runtimes": [
                    {"key": ["k"], "mb": 10.0, "measured_at": "2026-12-01"},
                    {"key": ["k"], "measured_at": measured_at, **runtime},
                ],
                "stages_in_place": [
                    {"key": ["k"], "stages": [stages], "measured_at": "2026-12-01"},
                    {
                        "key": ["k"],
                        "stages": [{**stages, **stage}],
                        "reference_ms": reference_ms,
                        "measured_at": measured_at,
                    },
                ],
            }
        )
    )
    try:
        store = FactsStore.load(path, "local_2cpu")
        kept = store.profile("resnet18", "mnist", "cpu", 1, batch=32)
        share = store.runtime(["k"])
        in_place = store.in_place(["k"])
    except (MissingMeasurement, ConfigError) as err:
        assert str(path) in str(err), err
        return
    assert kept.batch_size > 0 and all(
        math.isfinite(layer.compute_ms(1.0))
        and layer.compute_ms(1.0) >= 0
        and layer.activation_mb >= 0
        and layer.parameter_mb >= 0
        for layer in kept.layers
    )
    assert share is not None and share.mb >= 0 and share.context_mb >= 0
    assert in_place is not None and all(
        math.isfinite(s.forward_s + s.backward_s + s.update_s) for s in in_place.stages
    )
    assert in_place.reference_ms is None or in_place.reference_ms > 0
