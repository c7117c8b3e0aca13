"""The dry run's cells composed from a few of Hydra's compositions (`launchers.swapped_groups`):
equal to Hydra's composition of each cell, for every cell of the sweeps distbench ships, and
Hydra's wherever a group's option or another override reaches beyond the group's own node (a
config directory of its own holds each such case)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness.commands.compose import CONF_DIR, CONFIG_MODULE
from harness.config.schema import without_hydra
from harness.distributions.registry import register_configs
from launchers import hydra_main
from launchers.config_files import cells_not_kept, config_files_read_once
from launchers.hydra_private import composing_hydra
from launchers.swapped_groups import SwappedGroups

# Every sweep in conf/sweep/. The thesis grid's 480 cells (imagenet_resnet's, which are in the
# suite, for 4 datasets x 6 networks: Hydra composes them in 30 s) are compared with -m perf.
SWEEPS = [
    pytest.param(path.stem, marks=pytest.mark.perf) if path.stem == "thesis_grid" else path.stem
    for path in sorted((CONF_DIR / "sweep").glob("*.yaml"))
]


def _same(hydras: DictConfig, swapped: DictConfig, cell: list[str]) -> None:
    """Equal as YAML (values, interpolations unresolved, order of keys) and node types (a
    model's settings class: `distribution` is a GpipeConfig, not its base class)."""
    expected, got = OmegaConf.to_yaml(hydras), OmegaConf.to_yaml(swapped)
    assert got == expected, f"{cell}:\n" + "".join(
        difflib.unified_diff(expected.splitlines(keepends=True), got.splitlines(keepends=True))
    )
    for key in hydras:
        assert OmegaConf.get_type(swapped, str(key)) is OmegaConf.get_type(hydras, str(key)), (
            cell,
            key,
        )


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_cell_of_a_shipped_sweep_is_hydras_composition(sweep: str) -> None:
    register_configs()
    # As the dry run composes them (launchers.hydra_main): each cell once, none kept for a later
    # composition, so that the composer's own compositions are its own, not copies of Hydra's.
    with (
        config_files_read_once(),
        cells_not_kept(),
        composing_hydra(CONFIG_MODULE) as hydra,
    ):
        master, cells = hydra_main._sweep_cells(hydra, [f"+sweep={sweep}", "hydra.mode=MULTIRUN"])
        assert cells
        composer = SwappedGroups.of_sweep(hydra.config_loader, master)
        for cell in cells:
            hydras = without_hydra(hydra.config_loader.load_sweep_config(master, cell))
            _same(hydras, composer.compose(cell), cell)


# A config directory of its own: two groups, and options and sweep files that reach beyond
# their group in each way the composer must see.
FILES = {
    "config.yaml": "defaults:\n  - a: x\n  - b: y\n  - _self_\ntop: 1\n",
    "a/x.yaml": "k: 1\nshared: ${top}\n",
    "a/z.yaml": "k: 2\n",
    "a/global.yaml": "# @package _global_\na:\n  k: 3\nb:\n  k: 30\n",  # writes under b
    "a/overriding.yaml": "# @package _global_\ndefaults:\n  - override /b: w\n  - _self_\n"
    "a:\n  k: 4\n",  # chooses b's option
    "a/nested.yaml": "defaults:\n  - /c@a.inner: one\n  - _self_\nk: 5\n",  # its own defaults
    "b/y.yaml": "k: 10\n",
    "b/w.yaml": "k: 20\n",
    "b/v.yaml": "k: 40\n",
    "c/one.yaml": "deep: 1\n",
    "s/writes_b.yaml": "# @package _global_\nb:\n  k: 50\ntop: 2\n",
    "s/writes_top.yaml": "# @package _global_\ntop: 3\n",
    "s/chooses_b.yaml": "# @package _global_\ndefaults:\n  - override /b: v\n",
}


@pytest.fixture(scope="module")
def composer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SwappedGroups, ...]]:
    root = tmp_path_factory.mktemp("conf")
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    with initialize_config_dir(config_dir=str(root), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        loader = hydra.config_loader

        def hydras(overrides: list[str]) -> DictConfig:
            return loader.load_configuration("config", overrides, RunMode.RUN)

        yield (
            SwappedGroups(
                hydras,
                lambda overrides: loader.compute_defaults_list("config", overrides, RunMode.RUN),
                lambda path: loader.repository.load_config(path).config,
            ),
            hydras,
        )


@pytest.mark.parametrize(
    ("cell", "swapped"),
    [
        (["a=z", "b=w"], {"a", "b"}),  # options that stay in their node: both taken whole
        (["a=nested", "b=w"], {"a", "b"}),  # an option's own defaults are its node's
        (["a=z", "+s=writes_top"], {"a"}),  # a sweep file writing elsewhere
        (["a=z", "b=w", "+s=writes_b"], {"a"}),  # ... and under b: b is Hydra's
        (["a=z", "b=w", "+s=chooses_b"], {"a"}),  # ... choosing b's option: the same
        (["a=z", "b=w", "b.k=7"], {"a"}),  # a key of b set on the command line
        (["a=z", "b=w", "+b.extra=7"], {"a"}),  # ... or added
        (["a=global", "b=w"], set()),  # an option writing under another group: neither
        (["a=overriding", "b=v"], set()),  # ... or choosing another group's option
        (["a=z", "a=x"], set()),  # a group chosen twice: Hydra's to refuse or resolve
        (["a=x", "top=5"], {"a"}),  # an interpolation inside the node: resolved in the cell
    ],
)
def test_a_group_is_swapped_only_where_nothing_else_reaches_its_node(
    composer: tuple, cell: list[str], swapped: set[str]
) -> None:
    swapping, hydras = composer
    try:
        expected = without_hydra(hydras(cell))
    except Exception as err:  # noqa: BLE001 - Hydra's own error, which the composer must raise
        with pytest.raises(type(err)):
            swapping.compose(cell)
        return
    assert set(swapping.swapped(cell)) == swapped
    composed = swapping.compose(cell)
    _same(expected, composed, cell)
    assert OmegaConf.to_container(composed, resolve=True) == OmegaConf.to_container(
        expected, resolve=True
    )


def test_a_cell_composed_is_its_own_copy(composer: tuple) -> None:
    """Changing one cell's config (validate may, when given it) changes no other's."""
    swapping, _ = composer
    first = swapping.compose(["a=z", "b=w"])
    first.a.k = 99
    first.top = 99
    again = swapping.compose(["a=z", "b=w"])
    assert (again.a.k, again.top) == (2, 1)
    assert swapping.compose(["a=z", "b=y"]).a.k == 2
