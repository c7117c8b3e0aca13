"""Nothing lost, nothing counted twice, nothing left open: `harness.sync` killed while MLflow is
slow to answer, a truncated result.json, an output path with a quote in it, and a sweep's
MLflow parent run when the sweep is rejected, killed, or has nothing left to run.

Real processes and signals, a real `mlflow server` on loopback behind a small HTTP proxy (in
this test process) that can hold one kind of request unanswered, as a slow server does.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.commands.compose import compose_config
from harness.records.cell import check_cell
from harness.records.mlflow_store import DEFAULT_STORE_FILE, KIND_TAG
from harness.records.results import RunStatus
from harness.records.sweep_runs import (
    LAUNCHER_HOST_TAG,
    LAUNCHER_PID_TAG,
    LAUNCHER_START_TAG,
    close_stale_parent_runs,
    launcher_gone,
    sweep_parent_run,
)
from harness.records.tracking import RESULT_ID_TAG
from harness.system.processes import start_time
from tests.helpers import cell_worker_pids, run_module, starting_mlflow_server, tiny_overrides
from tests.in_process import in_process_command

HELD_WAIT_S = 180  # until sync's request reaches the proxy (its imports take most of it)


def _closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class HoldingProxy:
    """An HTTP proxy on 127.0.0.1 in front of a real MLflow server: every request is forwarded,
    except those whose path ends with `hold`, which are read and never answered (until the
    proxy closes), as by a server that takes forever."""

    def __init__(self, upstream_port: int) -> None:
        self.hold: str | None = None
        self.held = threading.Event()
        self._release = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy.hold and self.path.split("?")[0].endswith(proxy.hold):
                    proxy.held.set()
                    proxy._release.wait()
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=120)
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
                }
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream.close()

            # http.server dispatches a request to the method named do_<HTTP verb>
            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward  # noqa: N815

            def log_message(self, *args: object) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def holding(self, suffix: str) -> None:
        self.hold = suffix
        self.held.clear()

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def mlflow_server_starting(tmp_path: Path) -> Iterator[Callable[[], str]]:
    """`mlflow server` on a SQLite store of its own, on loopback, starting: calling this
    returns its URL once it answers (the test measures its cell meanwhile)."""
    folder = tmp_path / "server"
    folder.mkdir()
    with starting_mlflow_server(
        folder / "server.db",
        folder,
        "--artifacts-destination",
        str(folder / "artifacts"),
        "--workers",
        "1",
    ) as ready:
        yield ready


def _sync(output_root: Path, uri: str) -> subprocess.CompletedProcess[str]:
    # Quoted: Hydra's override grammar takes a path with a quote or a space only in quotes.
    return in_process_command(
        "harness.sync",
        [f'run.output_dir="{output_root}"', f"tracking.uri={uri}"],
        cwd=output_root.parent,
    )


def _sync_killed_while_held(output_root: Path, proxy: HoldingProxy, suffix: str) -> None:
    """Start `harness.sync` against the proxy, SIGKILL it while the proxy holds its request to
    `suffix` unanswered."""
    proxy.holding(suffix)
    env = dict(os.environ, MLFLOW_HTTP_REQUEST_TIMEOUT="600")  # slow, not failing
    sync = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.sync",
            f"run.output_dir={output_root}",
            f"tracking.uri={proxy.url}",
        ],
        cwd=output_root.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proxy.held.wait(HELD_WAIT_S), f"sync never asked for {suffix}"
    finally:
        sync.kill()
        out, _ = sync.communicate(timeout=60)
    assert sync.returncode == -signal.SIGKILL, out[-3000:]


def _pending_cell(output_root: Path) -> tuple[Path, dict]:
    """A tiny cell measured while MLflow was unreachable: its result.json, pending sync."""
    done = run_module(
        "harness",
        tiny_overrides(
            output_root, "run.epochs=1", f"tracking.uri=http://127.0.0.1:{_closed_port()}"
        ),
        cwd=output_root.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (output_root / "runs").glob("*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok" and result["pending_sync"], result
    assert (path.parent / "mllog.txt").exists()
    return path, result


def _pending_failure(output_root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict]:
    """A cell recorded as failed (harness.records.outcome.record_failure, as a launcher records a
    cell that died) while MLflow was unreachable: its result.json, pending sync. No training
    needed."""
    from harness.records.outcome import record_failure

    # A closed port refuses at once; MLflow's retries would only add seconds of back-off.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    cfg = compose_config(
        [
            f'run.output_dir="{output_root}"',
            "network=mobilenetv2",
            f"tracking.uri=http://127.0.0.1:{_closed_port()}",
        ]
    )
    cell_dir = output_root / "runs" / "cell"
    result = record_failure(check_cell(cfg), cell_dir, RunStatus.failed, "killed by a signal")
    assert result["pending_sync"], result
    return cell_dir / "result.json", result


def _runs_of(uri: str, result_id: str | None = None) -> list:
    """The active runs of experiment distbench at `uri` (of one result, given its id)."""
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("distbench")
    if experiment is None:
        return []
    return client.search_runs(
        [experiment.experiment_id],
        filter_string=(f"tags.`{RESULT_ID_TAG}` = '{result_id}'" if result_id else ""),
    )


def test_a_sync_killed_while_mlflow_is_slow_leaves_the_result_pending_and_no_duplicate(
    output_root: Path, mlflow_server_starting: Callable[[], str]
) -> None:
    path, _ = _pending_cell(output_root)  # while the server starts
    mlflow_server = mlflow_server_starting()  # its URL, once it answers
    proxy = HoldingProxy(int(mlflow_server.rsplit(":", 1)[1]))
    try:
        # Killed while the server has not answered `runs/create`: no run exists.
        _sync_killed_while_held(output_root, proxy, "/runs/create")
        assert json.loads(path.read_text())["pending_sync"], "marked synced, but no run exists"
        assert _runs_of(mlflow_server) == []
        # Killed while closing the run (its params, metrics, artifacts are in): a broken-off
        # run, still RUNNING.
        _sync_killed_while_held(output_root, proxy, "/runs/update")
        assert json.loads(path.read_text())["pending_sync"]
        assert [run.info.status for run in _runs_of(mlflow_server)] == ["RUNNING"]
    finally:
        proxy.close()

    synced = _sync(output_root, mlflow_server)
    assert synced.returncode == 0, synced.stdout + synced.stderr[-3000:]
    assert f"{path.parent}: uploaded" in synced.stdout
    (run,) = _runs_of(mlflow_server)  # the broken-off run was replaced, not duplicated
    assert run.info.status == "FINISHED"
    after = json.loads(path.read_text())
    assert not after["pending_sync"] and after["mlflow_run_id"] == run.info.run_id
    assert after["tracking_error"] is None
    client = MlflowClient(mlflow_server)
    artifacts = {entry.path for entry in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"config.yaml", "result.json", "mllog.txt"}  # as a cell uploads them
    copy = json.loads(
        Path(
            client.download_artifacts(run.info.run_id, "result.json", str(output_root.parent))
        ).read_text()
    )
    assert not copy["pending_sync"] and copy["tracking_error"] is None
    assert copy["started_at"] == after["started_at"] and copy["output_dir"] == after["output_dir"]
    assert run.data.tags[RESULT_ID_TAG]

    again = _sync(output_root, mlflow_server)  # nothing pending: nothing uploaded
    assert again.returncode == 0 and "uploaded" not in again.stdout, again.stdout
    # As if a sync had been killed after its upload but before it marked the result.
    path.write_text(json.dumps({**after, "pending_sync": True, "mlflow_run_id": None}))
    third = _sync(output_root, mlflow_server)
    assert third.returncode == 0 and f"{path.parent}: already recorded" in third.stdout
    assert [r.info.run_id for r in _runs_of(mlflow_server)] == [run.info.run_id]


def test_a_truncated_result_is_reported_and_not_counted_as_synced(
    output_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = _pending_failure(output_root, monkeypatch)
    path.write_text(path.read_text()[:200])  # as a disk that filled up mid-write leaves it
    done = _sync(output_root, f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("distbench:")]
    assert len(lines) == 1 and str(path) in lines[0], done.stderr
    assert "1 result(s) not synced" in done.stdout


def test_an_output_dir_with_a_quote_is_uploaded_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output_root = tmp_path / "it's outputs"
    output_root.mkdir()
    path, result = _pending_failure(output_root, monkeypatch)
    assert "'" in result["output_dir"]
    store = f"sqlite:///{tmp_path / 'store.db'}"
    first = _sync(output_root, store)
    assert first.returncode == 0 and "uploaded" in first.stdout, first.stderr[-3000:]
    synced = json.loads(path.read_text())
    # As if that sync had been killed after its upload but before it marked the result.
    path.write_text(json.dumps({**synced, "pending_sync": True, "mlflow_run_id": None}))
    second = _sync(output_root, store)
    assert second.returncode == 0 and "already recorded" in second.stdout, second.stdout
    (run,) = _runs_of(store)
    assert (
        run.info.run_id == synced["mlflow_run_id"] == json.loads(path.read_text())["mlflow_run_id"]
    )
    assert run.info.status == "FAILED" and run.data.tags["output_dir"] == result["output_dir"]


# --- a sweep's parent run -------------------------------------------------------------------


def _parents(output_root: Path, experiment: str = "distbench") -> list:
    store = output_root / DEFAULT_STORE_FILE
    if not store.exists():
        return []
    client = MlflowClient(f"sqlite:///{store}")
    found = client.get_experiment_by_name(experiment)
    return (
        []
        if found is None
        else client.search_runs(
            [found.experiment_id],
            filter_string=f"tags.`{KIND_TAG}` = 'sweep'",
            order_by=["attributes.start_time ASC"],
        )
    )


def test_a_rejected_sweep_opens_no_parent_run(output_root: Path) -> None:
    done = in_process_command(
        "harness",
        [
            "-m",
            "network=mobilenetv2,resnet19",
            "dataset.num_samples=16",
            "run.epochs=1",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert not (output_root / DEFAULT_STORE_FILE).exists()


def test_a_killed_sweeps_parent_is_closed_by_the_next_and_a_skipped_sweep_opens_none(
    output_root: Path,
) -> None:
    sweep = ["-m", *tiny_overrides(output_root, "run.warmup_batches=0")]
    # A long first cell: SIGKILL the sweep while its cell trains (its workers follow it).
    killed = subprocess.Popen(
        [sys.executable, "-m", "harness", *sweep, "run.epochs=200"],
        cwd=output_root.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not cell_worker_pids(output_root):
            assert killed.poll() is None and time.monotonic() < deadline, "no cell started"
            time.sleep(0.5)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)  # the launcher and submitit's controller
        killed.wait(timeout=30)
    deadline = time.monotonic() + 60
    while cell_worker_pids(output_root) and time.monotonic() < deadline:
        time.sleep(0.5)
    (stale,) = _parents(output_root)
    assert stale.info.status == "RUNNING"  # nothing could close it

    done = run_module("harness", [*sweep, "run.epochs=1"], cwd=output_root.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    old, new = _parents(output_root)
    assert old.info.run_id == stale.info.run_id and old.info.status == "KILLED"
    assert new.info.status == "FINISHED"

    # Nothing to train: its launcher runs in this process.
    again = in_process_command("harness", [*sweep, "run.epochs=1"], cwd=output_root.parent)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 cell(s) already measured, nothing to run" in again.stdout
    assert [r.info.run_id for r in _parents(output_root)] == [old.info.run_id, new.info.run_id]


def _sweep_config(output_root: Path):  # noqa: ANN202 - a DictConfig with Hydra's node
    return compose_config([f"run.output_dir={output_root}"], with_hydra=True)


@pytest.mark.parametrize(
    ("raised", "status"),
    [(None, "FINISHED"), (RuntimeError, "FAILED"), (KeyboardInterrupt, "KILLED")],
)
def test_the_parent_run_is_closed_however_the_launcher_ends(
    output_root: Path, raised: type[BaseException] | None, status: str
) -> None:
    config = _sweep_config(output_root)
    with sweep_parent_run(config, cells_to_run=0) as run_id:
        assert run_id is None
    assert not (output_root / DEFAULT_STORE_FILE).exists()  # nothing to run: no store

    try:
        with sweep_parent_run(config, cells_to_run=1) as run_id:
            assert run_id is not None and os.environ["DISTBENCH_PARENT_RUN_ID"] == run_id
            if raised is not None:
                raise raised
    except (RuntimeError, KeyboardInterrupt):
        pass
    assert "DISTBENCH_PARENT_RUN_ID" not in os.environ
    (parent,) = _parents(output_root)
    assert parent.info.status == status


def test_only_parent_runs_whose_launcher_is_provably_gone_are_closed(output_root: Path) -> None:
    gone = subprocess.Popen(["sleep", "60"])
    tags = {
        LAUNCHER_HOST_TAG: socket.gethostname(),
        LAUNCHER_PID_TAG: str(gone.pid),
        LAUNCHER_START_TAG: str(start_time(gone.pid)),
    }
    gone.kill()
    gone.wait()
    alive = {
        **tags,
        LAUNCHER_PID_TAG: str(os.getpid()),
        LAUNCHER_START_TAG: str(start_time(os.getpid())),
    }
    elsewhere = {**tags, LAUNCHER_HOST_TAG: "another-host"}
    assert launcher_gone(tags) and not launcher_gone(alive) and not launcher_gone(elsewhere)
    assert not launcher_gone({})  # an older run, without the tags: cannot tell

    uri = f"sqlite:///{output_root / DEFAULT_STORE_FILE}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("distbench")
    ids = {
        name: client.create_run(experiment, tags={KIND_TAG: "sweep", **launcher}).info.run_id
        for name, launcher in (("gone", tags), ("alive", alive), ("elsewhere", elsewhere))
    }
    assert close_stale_parent_runs(uri) == [ids["gone"]]
    statuses = {name: client.get_run(run_id).info.status for name, run_id in ids.items()}
    assert statuses == {"gone": "KILLED", "alive": "RUNNING", "elsewhere": "RUNNING"}


def test_a_sweep_ended_by_sigterm_closes_its_parent_run_and_leaves_no_worker(
    output_root: Path,
) -> None:
    """SIGTERM (kill, scancel, a shutdown) ends a sweep as Ctrl-C does (harness.cli): its
    parent run is closed KILLED at once, and its cell's workers end with it."""
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "-m",
            *tiny_overrides(output_root, "run.warmup_batches=0", "run.epochs=200"),
        ],
        cwd=output_root.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not cell_worker_pids(output_root):
            assert sweep.poll() is None and time.monotonic() < deadline, "no cell started"
            time.sleep(0.5)
        sweep.send_signal(signal.SIGTERM)  # the launcher only, as `kill <pid>` does
        _, stderr = sweep.communicate(timeout=60)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    (parent,) = _parents(output_root)
    assert parent.info.status == "KILLED"
    deadline = time.monotonic() + 60
    while cell_worker_pids(output_root) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not cell_worker_pids(output_root)
