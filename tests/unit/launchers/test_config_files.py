"""Composing a sweep's cells reads each config file once and composes each cell once per
process (launchers.config_files); what comes out is what Hydra composes on its own, to the
last key."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from harness.commands.compose import CONFIG_MODULE
from harness.distributions.registry import register_configs, specs
from launchers import cells
from launchers.config_files import cells_not_kept, config_files_read_once
from launchers.hydra_main import _sweep_cells
from tests.helpers import REPO_ROOT

# Every model one after another (a model's settings node, merged into `distribution`, is
# changed by the next model's merge if a loaded config were shared), on two hardwares.
SWEEP = [
    "network=mobilenetv2",
    f"distribution={','.join(specs())}",
    "hardware=local_2cpu,emulated_2nodes_1gbit",
]


def _cells(overrides: list[str]) -> tuple[DictConfig, list[DictConfig]]:
    """The sweep's master config (its sweep directory resolved, as Hydra's sweeper does before
    the first cell) and its cells, composed by a fresh config loader."""
    register_configs()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        master, job_overrides = _sweep_cells(hydra, overrides)
        assert job_overrides is not None
        str(master.hydra.sweep.dir)
        return master, [
            cells.cell_config(hydra.config_loader, master, job, number)
            for number, job in enumerate(job_overrides)
        ]


def _text(configs: list[DictConfig]) -> list[str]:
    return [OmegaConf.to_yaml(config) for config in configs]  # unresolved: the hydra node too


def test_files_read_once_and_cells_composed_once_give_hydras_configs() -> None:
    with config_files_read_once():
        _, first = _cells(SWEEP)  # every file read once, every cell composed and kept
        time.sleep(1.1)  # the next sweep's ${now:} is another second
        master, again = _cells(SWEEP)  # every cell a copy of the first composition
    _, hydras = _cells(SWEEP)  # as Hydra composes on its own: nothing read or kept before
    assert len(hydras) == 2 * len(specs())
    assert _text(first) == _text(again) == _text(hydras)
    # each cell takes the resolved values of its own sweep, not of the sweep it was copied from
    assert {str(cell.hydra.sweep.dir) for cell in again} == {str(master.hydra.sweep.dir)}
    assert str(first[0].hydra.sweep.dir) != str(master.hydra.sweep.dir)
    assert [cell.hydra.job.num for cell in again] == list(range(len(again)))
    assert again[0] is not first[0]  # a copy: a cell's config is its own to change


def _counting_compositions(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    composed: list[list[str]] = []
    original = ConfigLoaderImpl.load_sweep_config

    def counted(
        self: ConfigLoaderImpl, master_config: DictConfig, sweep_overrides: list[str]
    ) -> DictConfig:  # Hydra passes them by keyword
        composed.append(sweep_overrides)
        return original(self, master_config, sweep_overrides)

    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", counted)
    return composed


def test_a_cell_is_composed_once_while_open_and_a_dry_runs_cells_are_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    composed = _counting_compositions(monkeypatch)
    with config_files_read_once():
        _, first = _cells(SWEEP)
        _, again = _cells(SWEEP)  # the launcher, after the check: the same cells
        assert len(composed) == len(first) == len(again)
        with cells_not_kept():
            _cells(["network=resnet18", "distribution=ddp,gpipe"])
            _cells(["network=resnet18", "distribution=ddp,gpipe"])
        assert len(composed) == len(first) + 4


# What `python -m harness -m` composes before its first cell starts: the check's cells, the
# ones Hydra's sweeper checks, the launcher's; the launcher stops the sweep once prepared.
_SWEEP_PREPARED = textwrap.dedent("""
    import sys
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from launchers import cells
    composed = []
    original = ConfigLoaderImpl.load_sweep_config
    def counted(self, master_config, sweep_overrides):
        composed.append(sweep_overrides)
        return original(self, master_config, sweep_overrides)
    ConfigLoaderImpl.load_sweep_config = counted
    def prepared_then_stop(prepared, **_):
        print("composed", len(composed), "prepared", len(prepared), flush=True)
        raise SystemExit(0)
    cells.finished_earlier = prepared_then_stop
    sys.argv = ["distbench", *sys.argv[1:]]
    from harness.__main__ import cli
    cli()
""")


@pytest.mark.parametrize("multirun", [True, False])
def test_a_sweep_composes_each_cell_once_before_it_runs(multirun: bool, tmp_path: Path) -> None:
    """With -m, or with a sweep file that sets hydra.mode (Hydra then adds no override)."""
    grid = (
        ["-m", "distribution=sequential,ddp", "network=mobilenetv2,resnet18"]
        if multirun
        else ["+sweep=smoke"]
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _SWEEP_PREPARED,
            *grid,
            "tracking.enabled=false",
            f"run.output_dir={tmp_path / 'outputs'}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "composed 4 prepared 4" in done.stdout, done.stdout + done.stderr[-3000:]


def test_a_defaults_list_that_interpolates_composes_as_hydra_composes_it(tmp_path: Path) -> None:
    """The interpolation map (launchers.config_files builds it only where a defaults entry
    interpolates: distbench's own configs have none) still resolves such an entry."""
    from hydra import compose, initialize_config_dir

    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "mysql.yaml").write_text("port: 3306\n")
    (tmp_path / "db" / "sqlite.yaml").write_text("port: 0\n")
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "mysql_server.yaml").write_text("name: m\n")
    (tmp_path / "server" / "sqlite_server.yaml").write_text("name: s\n")
    (tmp_path / "config.yaml").write_text(
        "defaults:\n  - db: mysql\n  - server: ${db}_server\n  - _self_\nx: 1\n"
    )

    def composed(overrides: list[str]) -> str:
        with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
            return OmegaConf.to_yaml(compose("config", overrides))

    with config_files_read_once():
        read_once = [composed([]), composed(["db=sqlite"])]
    assert read_once == [composed([]), composed(["db=sqlite"])]
    assert "name: s" in read_once[1] and "name: m" in read_once[0]
