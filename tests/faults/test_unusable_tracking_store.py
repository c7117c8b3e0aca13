"""A tracking store that cannot be used: unreachable (a closed port), a `mlflow.db` of random
bytes or a directory of that name. Every command that reads the store (`harness.analysis`,
`harness.sweeps export`, `harness.sync`) ends in ONE line naming `tracking.uri`, with exit status 3
(harness.cli.errors.one_door), within the cells' bounded wait (2 retries); a cell keeps its
result.json and says the store is unusable. A URI no store accepts (`bogus://`) is bad input:
refused with the config, exit status 2, by every command (the bad-input table's rows too).
Real files, a real closed port, the commands' real entry points (in this process, except where
the process itself is what is checked)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.cli.errors import ENVIRONMENT_EXIT_CODE
from tests.helpers import run_module, tiny_overrides

# Seconds a command may take to give up on a closed port: 2 retries with 1 s back-off, plus
# the imports; MLflow's defaults waited about 4 minutes.
BOUNDED_S = 60


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _random_db(root: Path) -> str:
    (root / "mlflow.db").write_bytes(bytes(range(256)) * 16)
    return f"run.output_dir={root}"


def _directory_db(root: Path) -> str:
    (root / "mlflow.db").mkdir()
    return f"run.output_dir={root}"


STORES: dict[str, Callable[[Path], str]] = {
    "closed-port": lambda root: f"tracking.uri=http://127.0.0.1:{_closed_port()}",
    "random-bytes-db": _random_db,
    "directory-db": _directory_db,
}
SAYS = {
    "closed-port": "cannot be used",
    "random-bytes-db": "is not an SQLite database",
    "directory-db": "is a directory",
}


def _analysis(root: Path, store: str) -> None:
    from harness.analysis.__main__ import main

    main(["--no-probe", f"run.output_dir={root}", store])


def _export(root: Path, store: str) -> None:
    from harness.sweeps.cli import main

    main(["export", "distbench", "--out", str(root / "cells.csv"), store])


def _sync(root: Path, store: str) -> None:
    from harness.sync import main

    main([f"run.output_dir={root}", store])


@pytest.fixture(autouse=True)
def _bounded_http(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's bound (harness.records.mlflow_store._HTTP_DEFAULTS) is set with setdefault: keep
    this process's environment as it was after each test."""
    for name in (
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
        "MLFLOW_HTTP_REQUEST_TIMEOUT",
    ):
        monkeypatch.delenv(name, raising=False)


# Every command against every unusable store, except the closed port's bounded wait: one
# command checks it in-process (analysis), the subprocess test below checks it for export.
_COMMANDS = {"analysis": _analysis, "export": _export, "sync": _sync}
_CASES = [
    (name, store)
    for name in _COMMANDS
    for store in STORES
    if store != "closed-port" or name == "analysis"
]


@pytest.mark.parametrize("name", _COMMANDS)
def test_a_uri_no_store_accepts_is_bad_input(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        _COMMANDS[name](tmp_path, "tracking.uri=bogus://nowhere")
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    assert err.count("\n") == 1, err
    assert "tracking.uri='bogus://nowhere' is invalid: no MLflow store has the scheme" in err


@pytest.mark.parametrize(("name", "store"), _CASES, ids=[f"{n}-{s}" for n, s in _CASES])
def test_an_unusable_store_is_one_line_naming_tracking_uri(
    name: str, store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = _COMMANDS[name]
    override = STORES[store](tmp_path)
    started = time.monotonic()
    with pytest.raises(SystemExit) as stopped:
        command(tmp_path, override)
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert stopped.value.code == ENVIRONMENT_EXIT_CODE, err
    assert err.count("\n") == 1 and err.startswith("distbench: error"), err
    assert "tracking.uri=" in err and SAYS[store] in err and "Traceback" not in err, err
    if store.endswith("db"):
        assert "move it aside" in err, err
    assert took < BOUNDED_S, f"{took:.0f} s"


def test_export_from_a_closed_port_ends_in_one_line_within_the_bounded_wait(tmp_path: Path) -> None:
    """The whole process, as a user runs it: no traceback (MLflow's retries, urllib3's
    warnings), status 3, and the traceback kept in a file the line names."""
    port = _closed_port()
    started = time.monotonic()
    done = run_module(
        "harness.sweeps",
        [
            "export",
            "distbench",
            "--out",
            str(tmp_path / "cells.csv"),
            f"tracking.uri=http://127.0.0.1:{port}",
        ],
        tmp_path,
    )
    took = time.monotonic() - started
    assert done.returncode == ENVIRONMENT_EXIT_CODE, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"tracking.uri=http://127.0.0.1:{port}" in lines[0], lines
    saved = Path(lines[0].rsplit("[traceback: ", 1)[1].rstrip("]"))
    assert "Traceback" in saved.read_text()
    assert took < BOUNDED_S, f"{took:.0f} s"


def test_sync_with_nothing_to_sync_from_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed "synced" and exited 0 for a directory that does not exist."""
    with pytest.raises(SystemExit) as stopped:
        _sync(tmp_path / "missing", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db")
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "no such directory" in err, err
    assert not (tmp_path / "missing").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_cell_whose_store_is_a_directory_keeps_its_result_and_says_so(tmp_path: Path) -> None:
    """It stalled 103 s on SQLAlchemy's retries; now the store is refused at once, the result
    waits in result.json for harness.sync, and the warning says how to recover."""
    (tmp_path / "mlflow.db").mkdir()
    started = time.monotonic()
    done = run_module("harness", tiny_overrides(tmp_path), tmp_path)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    [result_file] = (tmp_path / "runs").rglob("result.json")
    result = json.loads(result_file.read_text())
    assert result["status"] == "ok" and result["pending_sync"] is True
    assert (
        "is a directory" in result["tracking_error"]
        and "move it aside" in (result["tracking_error"])
    )
    assert took < BOUNDED_S, f"{took:.0f} s"


def test_a_sweep_cell_the_launcher_cannot_record_stays_pending_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local sweep's launcher records its cells (rank 0 leaves it the upload): where the
    store is unreachable, the cell's result stays pending for harness.sync, with the reason,
    as rank 0 would have left it, and the sweep goes on and ends ok."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # refused at once
    done = run_module(
        "harness",
        [
            "-m",
            *tiny_overrides(
                tmp_path, "run.epochs=1", f"tracking.uri=http://127.0.0.1:{_closed_port()}"
            ),
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    [result_file] = (tmp_path / "sweeps").rglob("result.json")
    result = json.loads(result_file.read_text())
    assert result["status"] == "ok" and result["pending_sync"] is True
    assert result["mlflow_run_id"] is None and result["tracking_error"]
    assert "pending `python -m harness.sync`" in done.stdout + done.stderr


def test_any_escaping_exception_is_one_line_and_its_traceback_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The door itself (harness.cli.errors.one_door, behind @command): a library's exception is one
    line, status 3, the traceback in the file the line names; DISTBENCH_DEBUG=1 lets it out."""
    from harness.cli.errors import DEBUG_ENV, command

    @command
    def broken() -> None:
        json.loads("{")  # a library's error, not ours

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read afresh
    with pytest.raises(SystemExit) as stopped:
        broken()
    err = capsys.readouterr().err
    assert stopped.value.code == ENVIRONMENT_EXIT_CODE and err.count("\n") == 1, err
    assert "JSONDecodeError: Expecting property name" in err, err
    [saved] = (tmp_path / "distbench-errors").iterdir()
    assert f"[traceback: {saved}]" in err and "Traceback" in saved.read_text()
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(json.JSONDecodeError):
        broken()
