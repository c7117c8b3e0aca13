"""Composing a sweep's cells reads each config file once (launchers.config_files) and composes
each cell once per process (launchers.cells.cell_config); what comes out is what Hydra
composes on its own, to the last key."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from harness.compose import CONFIG_MODULE
from harness.distributions.registry import register_configs, specs
from launchers import cells
from launchers.config_files import config_files_read_once
from launchers.hydra_main import _sweep_cells

# Every model one after another (a model's settings node, merged into `distribution`, is
# changed by the next model's merge if a loaded config were shared), on two hardwares.
SWEEP = ["network=mobilenetv2", f"distribution={','.join(specs())}",
         "hardware=local_2cpu,emulated_2nodes_1gbit"]


@pytest.fixture
def no_composed_cells() -> Iterator[None]:
    cells._composed.clear()
    yield
    cells._composed.clear()


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
        return master, [cells.cell_config(hydra.config_loader, master, job, number)
                        for number, job in enumerate(job_overrides)]


def _text(configs: list[DictConfig]) -> list[str]:
    return [OmegaConf.to_yaml(config) for config in configs]  # unresolved: the hydra node too


def test_files_read_once_and_cells_composed_once_give_hydras_configs(
        no_composed_cells: None) -> None:
    with config_files_read_once():
        _, first = _cells(SWEEP)  # every file read once, every cell composed and kept
    time.sleep(1.1)  # the next sweep's ${now:} is another second
    with config_files_read_once():
        master, again = _cells(SWEEP)  # every cell a copy of the first composition
    cells._composed.clear()
    _, hydras = _cells(SWEEP)  # as Hydra composes on its own: nothing read or kept before
    assert len(hydras) == 2 * len(specs())
    assert _text(first) == _text(again) == _text(hydras)
    # each cell takes the resolved values of its own sweep, not of the sweep it was copied from
    assert {str(cell.hydra.sweep.dir) for cell in again} == {str(master.hydra.sweep.dir)}
    assert str(first[0].hydra.sweep.dir) != str(master.hydra.sweep.dir)
    assert [cell.hydra.job.num for cell in again] == list(range(len(again)))


def test_a_cell_is_composed_once_per_process(no_composed_cells: None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    composed: list[list[str]] = []
    original = ConfigLoaderImpl.load_sweep_config

    def counted(self: ConfigLoaderImpl, master: DictConfig, overrides: list[str]) -> DictConfig:
        composed.append(overrides)
        return original(self, master, overrides)

    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", counted)
    _, first = _cells(SWEEP)
    _, again = _cells(SWEEP)  # the launcher, after the check: the same cells
    assert len(composed) == len(first) == len(again)
    assert again[0] is not first[0]  # a copy: a cell's config is its own to change
