"""State files that the commands read, damaged: a facts file, a fit.json, a cell's index entry,
a result.json, a measured hardware profile, and a runtime-memory probe that fails. Each is named
in ONE line with how to recover (harness.cli: exit 2 for a file the user named, 3 for one found
under run.output_dir), not a TypeError/KeyError traceback, and nothing is probed first. Real
files, the commands' real entry points, in this process."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from harness.cli import ENVIRONMENT_EXIT_CODE

RECOMMEND = ["dataset=mnist", "network=mobilenetv2", "hardware=local_2cpu", "--no-probe"]


def _recommend(root: Path, *extra: str) -> None:
    from harness.recommend import main

    main([*RECOMMEND, f"run.output_dir={root}", *extra])


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("distbench: "), err
    assert "Traceback" not in err, err
    return err


def test_a_facts_file_of_the_wrong_shape_is_named(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
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
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It probed for 163 s, then skipped every option with a JSON error naming no file, and
    exited 0."""
    from harness.hardware_profile import Cost, HardwareProfile, Link, profile_path

    path = profile_path(tmp_path, "local_2cpu")
    path.parent.mkdir()
    text = json.dumps(HardwareProfile("local_2cpu", "probe", 2, 1,
                                      [Link(0, 1, True, Cost(1e-5, 1e9))]).to_json())
    path.write_text(text[:len(text) // 2])
    with pytest.raises(SystemExit) as stopped:
        _recommend(tmp_path)
    err = _one_line(capsys)
    assert stopped.value.code == ENVIRONMENT_EXIT_CODE, err
    assert f"{path}: not a hardware profile" in err and "move it aside" in err, err
    assert not (tmp_path / "facts").exists()  # nothing probed, nothing kept


@pytest.mark.parametrize("damage", ["index-is-a-list", "result-without-status"])
def test_a_damaged_index_entry_or_result_runs_the_cell_again_saying_so(
        damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
        ending: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's process (a real one, standing in for the interpreter) fails: the error
    names its exit and its last line; an empty message was all a killed probe left."""
    from harness.compose import compose_config
    from harness.config import validate
    from harness.predict.runtime import ProbeFailed, measure_runtime_mb

    script = tmp_path / "python"
    body = {"traceback": "echo 'Traceback (most recent call last):' >&2\n"
                         "echo 'MemoryError: cannot allocate 64 MB' >&2\nexit 1",
            "killed": "kill -9 $$"}[ending]
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(script))
    config = validate(compose_config(["dataset=mnist", "network=mobilenetv2",
                                      f"run.output_dir={tmp_path}"]))
    with pytest.raises(ProbeFailed) as failed:
        measure_runtime_mb(config, timeout_s=30)
    message = str(failed.value)
    assert "\n" not in message
    assert message.endswith({"traceback": "(exit status 1): MemoryError: cannot allocate 64 MB",
                             "killed": "(killed by SIGKILL): no error recorded"}[ending]), message
