"""What `python -m launchers.emulated down` touches on a shared machine: only what `up` noted.
Its processes are stopped by the ids noted, never by name (a process of the same name that
`up` did not start runs on); the slurm.conf it replaced comes back; with nothing noted nothing
is touched. Real processes and files; the SLURM daemons are stood in for by a copy of `sleep`
under the daemon's name (its process name is what the launcher reads), since a real slurmctld
would need root and another cluster's configuration. The whole bring-up is
tests/integration/test_emulated_nodes.py's."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launchers import emulated


@pytest.fixture
def noted_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The launcher's note and slurm.conf in `tmp_path` (no cluster is up there)."""
    monkeypatch.setattr(emulated, "STATE_DIR", tmp_path / "state")
    conf = tmp_path / "etc" / "slurm.conf"
    conf.parent.mkdir()
    monkeypatch.setattr(emulated, "SLURM_CONF", conf)
    return tmp_path


@pytest.fixture
def two_daemons(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, subprocess.Popen]]:
    """Two processes named slurmctld: one the launcher will have started, one somebody
    else's."""
    program = tmp_path / "slurmctld"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", program)
    processes = (
        subprocess.Popen([str(program), "300"]),
        subprocess.Popen([str(program), "300"]),
    )
    deadline = time.monotonic() + 5
    while not all(p.pid in emulated.daemon_pids("slurmctld") for p in processes):
        assert time.monotonic() < deadline, "the stand-in daemons did not start"
        time.sleep(0.05)
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def test_down_with_nothing_noted_touches_nothing(noted_here: Path) -> None:
    emulated.SLURM_CONF.write_text("somebody else's cluster\n")
    if emulated.namespaces() or emulated.links():
        pytest.skip("an emulated cluster is up on this machine: down would refuse, not pass")
    assert emulated.down() is False
    assert emulated.SLURM_CONF.read_text() == "somebody else's cluster\n"
    assert not emulated.STATE_DIR.exists()


def test_down_stops_the_noted_controller_by_its_id_only_and_puts_slurm_conf_back(
    noted_here: Path, two_daemons: tuple[subprocess.Popen, subprocess.Popen]
) -> None:
    ours, theirs = two_daemons
    emulated.SLURM_CONF.write_text("the cluster before\n")
    emulated._note(
        slurm_conf_before="the cluster before\n",
        slurm_conf_written="ours\n",
        slurmctld_pid=ours.pid,
    )
    emulated.SLURM_CONF.write_text("ours\n")
    assert f"slurmctld (process {ours.pid})" in emulated.leftovers()

    emulated.stop_slurm()
    emulated.restore_slurm_conf()

    assert ours.wait(timeout=10) is not None  # ended by its id
    assert theirs.poll() is None  # the other process of that name runs on
    assert emulated.SLURM_CONF.read_text() == "the cluster before\n"
    assert emulated.leftovers() == []


def test_a_slurm_conf_rewritten_since_is_left_and_one_of_its_own_is_removed(
    noted_here: Path,
) -> None:
    emulated._note(slurm_conf_before=None, slurm_conf_written="ours\n")
    emulated.SLURM_CONF.write_text("rewritten by somebody\n")
    emulated.restore_slurm_conf()
    assert emulated.SLURM_CONF.read_text() == "rewritten by somebody\n"
    emulated.SLURM_CONF.write_text("ours\n")
    emulated.restore_slurm_conf()  # none was there before `up`: its own is removed
    assert not emulated.SLURM_CONF.exists()


def test_a_pid_given_to_another_program_since_is_not_ours(noted_here: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        emulated._note(slurmctld_pid=sleeper.pid)  # a pid now held by `sleep`
        assert emulated._noted_pid("slurmctld_pid", "slurmctld") is None
        emulated.stop_slurm()
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_status_shows_a_nodes_traffic_as_a_table() -> None:
    proc_net_dev = (
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets "
        "errs drop fifo colls carrier compressed\n"
        "    lo:    1000      10    0    0    0     0          0         0     1000      10    "
        "0    0    0     0       0          0\n"
        "  eth0: 25000000   20000    0    0    0     0          0         0 50000000    40000    "
        "0    0    0     0       0          0\n"
    )
    rows = emulated.traffic_table(proc_net_dev)
    assert rows[0].split() == ["interface", "received", "MB", "packets", "sent", "MB", "packets"]
    assert rows[2].split() == ["eth0", "25.00", "20,000", "50.00", "40,000"]
    assert len(rows) == 3
