"""A cell's index entry names its result relative to the output root, so that the root moved
as a whole still finds it; an entry kept with an absolute path is found again after a move."""

from __future__ import annotations

import json
from pathlib import Path

from harness.records.resume import finished_result, index_path, index_result


def _result(output_dir: Path, key: str) -> dict:
    output_dir.mkdir(parents=True)
    result = {
        "cell_key": key,
        "status": "ok",
        "run_name": "cell",
        "finished_at": "2026-12-07T00:00:00+00:00",
        "output_dir": str(output_dir),
    }
    (output_dir / "result.json").write_text(json.dumps(result))
    return result


def test_an_entry_names_its_result_relative_to_the_root_and_follows_a_move(tmp_path: Path) -> None:
    root = tmp_path / "out1"
    index_result(root, "k1", _result(root / "sweeps" / "2026" / "0", "k1"))
    assert json.loads(index_path(root, "k1").read_text())["result"] == "sweeps/2026/0/result.json"
    moved = tmp_path / "moved" / "out2"
    moved.parent.mkdir()
    root.rename(moved)
    found = finished_result(moved, "k1")
    assert found is not None and found["output_dir"] == str(moved / "sweeps" / "2026" / "0")


def test_an_absolute_entry_of_a_moved_root_is_found_by_the_tail_under_it(tmp_path: Path) -> None:
    root = tmp_path / "out1"
    _result(root / "sweeps" / "2026" / "0", "k1")
    index_path(root, "k1").parent.mkdir(parents=True)
    index_path(root, "k1").write_text(
        json.dumps({"status": "ok", "result": str(root / "sweeps/2026/0/result.json")})
    )
    moved = tmp_path / "out2"
    root.rename(moved)
    found = finished_result(moved, "k1")
    assert found is not None and Path(found["output_dir"]).is_relative_to(moved)
    # another cell's result at that place is not taken for this one
    assert finished_result(moved, "k2") is None


def test_the_same_result_indexed_again_counts_once_whichever_way_it_was_named(
    tmp_path: Path,
) -> None:
    root = tmp_path / "out"
    result = _result(root / "sweeps" / "0", "k1")
    index_path(root, "k1").parent.mkdir(parents=True)
    absolute = {"status": "ok", "ok_runs": 1, "result": str(root / "sweeps/0/result.json")}
    index_path(root, "k1").write_text(json.dumps(absolute))
    index_result(root, "k1", result)
    assert json.loads(index_path(root, "k1").read_text())["ok_runs"] == 1
