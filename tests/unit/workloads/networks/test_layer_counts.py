"""A network's layer count, remembered on disk (`workloads.networks.layer_counts`): the same
count as building the network, read back without building it again, per version of the code
that builds it; a user's own module is always counted afresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.datasets.spec import DATASET_SPECS
from workloads.networks import layer_count
from workloads.networks import layer_counts as remembered
from workloads.networks import remembered as facts
from workloads.networks.ref import NetworkRef, canonical_json

MNIST = DATASET_SPECS["mnist"]
CIFAR = DATASET_SPECS["cifar10"]


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "layer-counts").glob("*.json"))


@pytest.fixture
def nothing_kept_with_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache alone, as for a network whose count is not kept with the code."""
    monkeypatch.setattr(remembered, "kept_counts", dict)


@pytest.mark.parametrize(
    "ref",
    [
        NetworkRef.builtin("mobilenetv2"),
        NetworkRef.builtin("resnet18"),
        NetworkRef(name="alexnet", source="torchvision", arch="alexnet"),
    ],
    ids=str,
)
@pytest.mark.usefixtures("nothing_kept_with_the_code")
def test_a_count_is_the_built_networks_and_is_read_back_unbuilt(
    tmp_path: Path, ref: NetworkRef
) -> None:
    counted = remembered.remembered_layer_count(ref, CIFAR, tmp_path)
    assert counted == layer_count(ref, CIFAR)
    (entry,) = _entries(tmp_path)
    # Read back from the file, not built again: what the file says is the answer.
    entry.write_text(json.dumps({"layers": counted + 100}))
    assert remembered.remembered_layer_count(ref, CIFAR, tmp_path) == counted + 100


@pytest.mark.usefixtures("nothing_kept_with_the_code")
def test_each_dataset_shape_and_code_version_has_its_own_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = NetworkRef.builtin("vgg11")
    remembered.remembered_layer_count(ref, MNIST, tmp_path)
    remembered.remembered_layer_count(ref, CIFAR, tmp_path)
    assert len(_entries(tmp_path)) == 2
    # distbench's network code changed: its earlier counts are not this code's
    monkeypatch.setattr(facts, "network_code_digest", lambda: "other code")
    remembered.remembered_layer_count(ref, CIFAR, tmp_path)
    assert len(_entries(tmp_path)) == 3


@pytest.mark.usefixtures("nothing_kept_with_the_code")
def test_a_users_module_is_counted_afresh_and_a_broken_entry_is_counted_again(
    tmp_path: Path,
) -> None:
    ref = NetworkRef(
        name="tiny", source="module", target="torch.nn:Sequential", options_json=canonical_json({})
    )
    assert remembered._entry_path(ref, CIFAR, tmp_path) is None  # its code may change
    builtin = NetworkRef.builtin("mobilenetv2")
    counted = remembered.remembered_layer_count(builtin, MNIST, tmp_path)
    (entry,) = _entries(tmp_path)
    entry.write_text("{not json")
    assert remembered.remembered_layer_count(builtin, MNIST, tmp_path) == counted
    assert json.loads(entry.read_text())["layers"] == counted  # kept anew


def test_a_cache_that_cannot_be_written_still_answers(tmp_path: Path) -> None:
    cache = tmp_path / "a-file"  # no folder can be made under it (root ignores a chmod)
    cache.write_text("")
    assert remembered.remembered_layer_count(
        NetworkRef.builtin("resnet18"), MNIST, cache
    ) == layer_count("resnet18", MNIST)


def test_the_counts_kept_with_the_code_are_todays_code_counts() -> None:
    """Every built-in network on every image dataset, kept beside the module under the name
    its cache entry has: when the network code or a pinned library changes, the names change
    and this fails until `python -m workloads.networks.layer_counts` writes them anew."""
    assert remembered.kept_counts() == remembered.builtin_counts(), (
        "the kept layer counts are not this code's: python -m workloads.networks.layer_counts"
    )


def test_a_count_kept_with_the_code_is_read_unbuilt_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = NetworkRef.builtin("vgg16")
    entry = remembered._entry_path(ref, CIFAR, tmp_path)
    assert entry is not None and entry.name in remembered.kept_counts()
    monkeypatch.setattr(remembered, "kept_counts", lambda: {entry.name: 1000})
    assert remembered.remembered_layer_count(ref, CIFAR, tmp_path) == 1000  # not built
    assert _entries(tmp_path) == []  # a check of input writes nothing
    # the cache, where a worker kept one, comes first
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps({"layers": 7}))
    assert remembered.remembered_layer_count(ref, CIFAR, tmp_path) == 7


@pytest.mark.parametrize(
    "kept", ["{not json", '{"layers": [1, 2]}', None], ids=["unreadable", "not a table", "missing"]
)
def test_a_kept_file_that_cannot_be_read_leaves_counting_to_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: str | None
) -> None:
    path = tmp_path / "layer_counts.json"
    if kept is not None:
        path.write_text(kept)
    monkeypatch.setattr(remembered, "_KEPT", path)
    remembered.kept_counts.cache_clear()
    try:
        assert remembered.kept_counts() == {}
        assert remembered.remembered_layer_count(
            NetworkRef.builtin("resnet18"), MNIST, tmp_path
        ) == layer_count("resnet18", MNIST)
    finally:
        monkeypatch.undo()
        remembered.kept_counts.cache_clear()  # the real file again, for the tests after
