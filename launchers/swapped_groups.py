"""A sweep's cells composed from a few of Hydra's compositions, for the dry run.

A grid's cells differ mostly in which option of a config group each takes (`dataset=cifar10
network=vgg16`): the thesis grid's 480 cells are 4 datasets x 6 networks x 20 settings files.
Hydra composes each from scratch (its defaults tree, about 15 files loaded and merged: 60-70 ms
a cell here), so listing the grid took 30 s of CPU. Yet where a group's option writes only under
the group's own node, and nothing else of the cell writes there, the cell is the composition of
its other overrides with that node taken from the option's own composition: composing
`dataset=cifar10 network=vgg16 +sweep/scaling=gpipe_1x2` is composing `+sweep/scaling=gpipe_1x2`,
then putting in the `dataset` node of `dataset=cifar10` and the `network` node of
`network=vgg16`. The grid then costs Hydra 20 + 4 + 6 compositions, and each cell a copy.

`SwappedGroups.compose` does that only where it is sure, from the defaults lists Hydra computes
(which file is merged where, under which package):

- the option's own composition (`group=option` alone) differs from the primary config's only in
  what the group's own entry loads, all of it under the group's package;
- in the composition of the cell's other overrides, the group keeps the primary config's option
  (no `override /group:` in a settings file), no other entry writes under the group (a file of
  package `_global_` with a key of that name, or of the group's package), and no `key=value`
  override names a key under it.

Any other override (a `key=value`, an appended group `+a/b=x`, a group that fails a check) stays
with the others, composed by Hydra. The result is the cell's config without Hydra's own node
(what `harness.config.schema.validate` reads), equal to Hydra's composition of the cell minus that
node: `tests/unit/launchers/test_swapped_groups.py` compares both for every cell of the sweeps in
`conf/sweep/`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, ValueType
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness.config.schema import without_hydra

_PRIMARY = "config"  # the primary config's path in a defaults list (conf/config.yaml)


class SwappedGroups:
    """Cells composed as above. `compose_cell(overrides)` is Hydra's composition of a cell
    (Hydra's node included, as the launcher composes it); `defaults_list(overrides)` Hydra's
    defaults list of the same composition (`ConfigLoader.compute_defaults_list`); `load(path)`
    the content of a config file (`ConfigRepository.load_config(path).config`)."""

    def __init__(
        self,
        compose_cell: Callable[[list[str]], DictConfig],
        defaults_list: Callable[[list[str]], Any],
        load: Callable[[str], DictConfig | None],
    ) -> None:
        self._compose_cell = compose_cell
        self._defaults_list = defaults_list
        self._load = load
        self._parser = OverridesParser.create()
        self._lists: dict[tuple[str, ...], _Entries] = {}  # overrides -> their defaults list
        self._plain = self._entries(())
        # group -> its package, for the primary config's own groups (dataset, network, ...)
        self._groups = {group: entry.package for group, entry in self._plain.groups().items()}
        self._composed: dict[tuple[str, ...], DictConfig] = {}
        self._nodes: dict[tuple[str, str], DictConfig | None] = {}  # (group, option) -> node
        self._kept_in: dict[tuple[tuple[str, ...], str], bool] = {}
        self._parses: dict[str, Override] = {}

    @classmethod
    def of_sweep(cls, loader: ConfigLoader, master: DictConfig) -> SwappedGroups:
        """The cells of the sweep whose config is `master`, as its launcher composes them
        (`launchers.cells.cell_config`: Hydra's `load_sweep_config`)."""
        hydras = OmegaConf.to_container(master.hydra.overrides.hydra)
        assert isinstance(hydras, list)  # Hydra's own overrides of the sweep: "key=value"s
        name = str(master.hydra.job.config_name)
        return cls(
            lambda overrides: loader.load_sweep_config(master, overrides),
            lambda overrides: loader.compute_defaults_list(
                name, [*map(str, hydras), *overrides], RunMode.RUN
            ),
            lambda path: _content(loader, path),
        )

    def compose(self, overrides: Sequence[str]) -> DictConfig:
        """The cell's config without Hydra's node, as Hydra composes it (module docstring)."""
        base, options = self._plan(list(overrides))
        return self._swapped_into(self._composition(base), options)

    def swapped(self, overrides: Sequence[str]) -> dict[str, str]:
        """The groups whose node `compose` takes from their option's own composition: group ->
        option."""
        return self._plan(list(overrides))[1]

    def _plan(self, overrides: list[str]) -> tuple[tuple[str, ...], dict[str, str]]:
        """The overrides Hydra composes the cell's base from, and the groups swapped into it."""
        swapped, others = self._split(overrides)
        # A group something else writes under goes back to Hydra. The others' check holds with
        # it back among them: its option writes only under its own node (`_split`).
        refused = {
            text
            for group, (text, _) in swapped.items()
            if not self._stays_own(tuple(others), group)
        }
        base = tuple(text for text in overrides if text in refused or text in others)
        return base, {
            group: option for group, (text, option) in swapped.items() if text not in refused
        }

    def common_part(self, overrides: Sequence[str]) -> tuple[str, ...]:
        """What cells composed from the same Hydra composition have in common, told cheaply
        (no parsing): their overrides but those of the form `group=...` of a primary group.
        Such cells are best composed in one process (`launchers.cell_pool`)."""
        return tuple(text for text in overrides if text.split("=")[0] not in self._groups)

    def _swapped_into(self, base: DictConfig, options: dict[str, str]) -> DictConfig:
        """A copy of `base` with each group's node that of its option's own composition. The
        nodes swapped out are not copied (a placeholder stands in, as in
        `harness.config.schema.without_hydra`); OmegaConf copies a node as it is set."""
        placeholders = {
            id(base._get_node(self._groups[group])): DictConfig({}) for group in options
        }
        config = copy.deepcopy(base, memo=placeholders)
        for group, option in options.items():
            node = self._node(group, option)
            assert node is not None  # _split keeps only options that have their own node
            setattr(config, self._groups[group], node)
        return config

    def _split(self, overrides: list[str]) -> tuple[dict[str, tuple[str, str]], list[str]]:
        """The overrides that choose an option of a primary group whose composition writes only
        under the group (group -> (override, option)), and the others, in order."""
        parsed = [self._parsed(text) for text in overrides]
        groups = [override.key_or_group for override in parsed]
        swapped: dict[str, tuple[str, str]] = {}
        others: list[str] = []
        for text, override in zip(overrides, parsed):
            group = override.key_or_group
            if (
                _is_plain_choice(override)
                and group in self._groups
                and groups.count(group) == 1
                and self._node(group, str(override.value())) is not None
            ):
                swapped[group] = (text, str(override.value()))
            else:
                others.append(text)
        return swapped, others

    def _parsed(self, text: str) -> Override:
        """An override parsed by Hydra's parser (a grammar: a millisecond each), once."""
        if text not in self._parses:
            self._parses[text] = self._parser.parse_overrides([text])[0]
        return self._parses[text]

    def _composition(self, overrides: tuple[str, ...]) -> DictConfig:
        if overrides not in self._composed:
            self._composed[overrides] = without_hydra(self._compose_cell(list(overrides)))
        return self._composed[overrides]

    def _node(self, group: str, option: str) -> DictConfig | None:
        """The group's node as `group=option` alone composes it; None where that composition
        differs from the primary config's elsewhere than under the group, or fails (an option
        that is not there, or that reaches beyond its group: the cell is Hydra's, which says
        what is wrong with it, if anything)."""
        key = (group, option)
        if key not in self._nodes:
            alone = [f"{group}={option}"]
            try:
                entries = self._entries(tuple(alone))
            except Exception:  # noqa: BLE001 - any of Hydra's errors: see the docstring
                self._nodes[key] = None
                return None
            own = self._groups[group]
            changed = entries.differing(self._plain) + self._plain.differing(entries)
            writes_elsewhere = any(not _under(entry.package, own) for entry in changed)
            self._nodes[key] = (
                None
                if writes_elsewhere or entries.config_overrides
                else OmegaConf.select(self._composition(tuple(alone)), own)
            )
        return self._nodes[key]

    def _stays_own(self, others: tuple[str, ...], group: str) -> bool:
        """Whether, composing `others`, the group keeps the primary config's option and nothing
        else writes under its node (so its node can be swapped for another option's). Not where
        `others` alone cannot be composed (a file that overrides the group's option, which
        Hydra allows only with the group chosen too): the cell is Hydra's."""
        key = (others, group)
        if key not in self._kept_in:
            try:
                entries = self._entries(others)
            except Exception:  # noqa: BLE001 - any of Hydra's errors: see the docstring
                self._kept_in[key] = False
                return False
            package = self._groups[group]
            kept = entries.groups().get(group) == self._plain.groups()[group]
            own = entries.subtree(group)
            kept = kept and not any(
                _under(str(override.key_or_group), package) for override in entries.config_overrides
            )
            kept = kept and not any(
                self._writes_under(entry, package)
                for entry in entries.defaults
                if entry not in own and entry not in self._plain.defaults
            )
            self._kept_in[key] = kept
        return self._kept_in[key]

    def _entries(self, overrides: tuple[str, ...]) -> _Entries:
        if overrides not in self._lists:
            self._lists[overrides] = _Entries(self._defaults_list(list(overrides)))
        return self._lists[overrides]

    def _writes_under(self, entry: Any, package: str) -> bool:
        """Whether a defaults-list entry (a file merged at its package) sets a key under
        `package`."""
        at = entry.package or ""
        if _under(at, package):
            return True
        if at and not package.startswith(at + "."):
            return False  # another branch of the config
        content = self._load(entry.config_path)
        if content is None:
            return False
        inner = package[len(at) + 1 :] if at else package
        return OmegaConf.select(content, inner, default=_ABSENT) is not _ABSENT


_ABSENT = object()


def _content(loader: ConfigLoader, path: str) -> DictConfig | None:
    """A config file's content, as Hydra's repository loads it (its defaults list apart)."""
    loaded = loader.repository.load_config(path)  # type: ignore[attr-defined]
    return None if loaded is None else loaded.config


def _is_plain_choice(override: Override) -> bool:
    """`group=option`: not appended (+), forced (++), deleted (~), packaged (@) or swept."""
    return (
        override.type == OverrideType.CHANGE
        and override.package is None
        and override.value_type == ValueType.ELEMENT
        and isinstance(override.value(), str)
    )


def _under(package: str, node: str) -> bool:
    return package == node or package.startswith(node + ".")


class _Entries:
    """A defaults list's entries (Hydra's ResultDefault: config_path, package, parent)."""

    def __init__(self, defaults_list: Any) -> None:
        self.defaults: list[Any] = [
            entry for entry in defaults_list.defaults if not _under(entry.package or "", "hydra")
        ]
        self.config_overrides: list[Override] = [
            override
            for override in defaults_list.config_overrides
            if not override.is_hydra_override()
        ]

    def groups(self) -> dict[str, Any]:
        """The primary config's own groups: group -> the entry of the option it loads."""
        chosen: dict[str, Any] = {}
        for entry in self.defaults:
            path = entry.config_path or ""
            if entry.parent == _PRIMARY and "/" in path:
                chosen.setdefault(path.split("/")[0], entry)
        return {
            group: entry
            for group, entry in chosen.items()
            if entry.package == group and "/" not in group
        }

    def subtree(self, group: str) -> list[Any]:
        """The entries the group's chosen option brings: its file and its own defaults."""
        top = self.groups().get(group)
        if top is None:
            return []
        parents = {entry.config_path: entry.parent for entry in self.defaults}

        def below(entry: Any) -> bool:
            path, seen = entry.config_path, set()
            while path is not None and path not in seen:
                if path == top.config_path:
                    return True
                seen.add(path)
                path = parents.get(path)
            return False

        return [entry for entry in self.defaults if below(entry)]

    def differing(self, other: _Entries) -> list[Any]:
        return [entry for entry in self.defaults if entry not in other.defaults]
