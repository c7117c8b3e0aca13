"""Which cells already have a finished result, so that a re-run sweep runs only the others.

A cell is known by its *cell key*: a hash of its resolved config minus what does not change
what is measured (where outputs and caches go, progress bars, where MLflow lives). The same
sweep command therefore gives every cell the same key again, although Hydra puts the re-run in
a new timestamped sweep directory.

The index lives under the output root, one small file per key (`<run.output_dir>/cells/
<key>.json`), pointing to the cell's latest result.json by its path relative to the root (the
root moved or copied as a whole resumes where it stands); result.json stays the source of
truth (the index entry is only trusted when the result it points to carries the same key). The
entry also counts the cell's runs that finished ok (`ok_runs`), which a sweep of several passes
(`hydra.launcher.passes`) measures each cell up to.
Rank 0 writes the entry right after result.json, so a cell that recorded itself while no
launcher was watching (a SLURM job whose submitting shell was gone) is found as well.

A launcher whose cells outlive it (SLURM) also notes each cell's job beside the index entry
(`<key>.job.json`, see `launchers.slurm.JobNote`), so that a re-run can tell a cell whose job
still runs from one whose job ended without a result while nobody watched.

Only a result with status `ok` counts as finished: `failed`, `timeout`, `oom`, `diverged` and
`interrupted` cells are run again on resume (a crash or a hang may have been transient; an
`oom` costs one more try; a diverged loss may have been an unlucky seed).
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from harness.config.schema import resolved_container
from harness.records.results import RESULT_FILE, RunStatus
from workloads.datasets.atomic import write_json_atomic

INDEX_DIR = "cells"
# Bumped when the key's recipe changes, so old keys never alias new ones.
_KEY_FORMAT = 1
# Config keys that say where things go or how they are shown, not what is measured.
# hardware.currency came after cells were keyed: leaving it out keeps their keys; so did
# probe.rounds, which `harness.probe` reads and a cell never does.
_VOLATILE_KEYS = (
    ("run", "output_dir"),
    ("run", "progress"),
    ("dataset", "cache_dir"),
    ("tracking", "uri"),
    ("tracking", "enabled"),
    ("hardware", "currency"),
    ("run", "submission_org"),
    ("run", "steadiness_threshold"),
    ("probe", "rounds"),
)


# Settings added after cells were recorded, whose value here means what their absence meant:
# left out of the key while they hold it, so that those cells keep their keys (hardware.link
# null: real nodes; hardware.one_host false: each node a machine of its own; run.global_batch
# null: the model's own batch; no activation checkpointing, float32).
_ABSENT_WHEN = (
    ("hardware", "link", None),
    ("hardware", "one_host", False),
    ("run", "global_batch", None),
    ("distribution", "activation_checkpointing", "none"),
    ("distribution", "checkpoint_every", 2),
    ("distribution", "precision", "fp32"),
)


def cell_key(cfg: DictConfig | dict[str, Any]) -> str:
    """The stable identity of a cell: the same resolved config gives the same key."""
    config = copy.deepcopy(cfg) if isinstance(cfg, dict) else resolved_container(cfg)
    for section, key in _VOLATILE_KEYS:
        config.get(section, {}).pop(key, None)
    for section, key, absent in _ABSENT_WHEN:
        if key in config.get(section, {}) and _is(config[section][key], absent):
            config[section].pop(key)
    text = json.dumps({"format": _KEY_FORMAT, "config": config}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _is(value: Any, absent: Any) -> bool:
    """Whether a setting holds what its absence meant (an enum by its value; False is not 0)."""
    plain = value.value if isinstance(value, Enum) else value
    return type(plain) is type(absent) and plain == absent


def index_path(output_root: str | Path, key: str) -> Path:
    return Path(output_root) / INDEX_DIR / f"{key}.json"


def job_note_path(output_root: str | Path, key: str) -> Path:
    """Where a launcher notes the job it submitted for the cell (beside the index entry)."""
    return Path(output_root) / INDEX_DIR / f"{key}.job.json"


def index_result(output_root: str | Path, key: str, result: dict[str, Any]) -> None:
    """Point the cell's index entry at `result` (its latest result.json), counting the cell's
    runs that finished ok (`ok_runs`): a sweep of `hydra.launcher.passes` measures a cell until
    it has that many. The same result indexed again (rank 0 and then a launcher) counts once."""
    path = index_path(output_root, key)
    entry = _entry(path)
    result_path = kept_path(Path(result["output_dir"]) / RESULT_FILE, output_root)
    earlier = _ok_runs_of(entry) if entry is not None else 0
    if entry is not None and _same_result(entry.get("result"), result_path, output_root):
        earlier -= entry.get("status") == RunStatus.ok.value  # this result, counted before
    ok_now = result["status"] == RunStatus.ok.value
    write_json_atomic(
        path,
        {
            "cell_key": key,
            "status": result["status"],
            "run_name": result["run_name"],
            "result": result_path,
            "finished_at": result["finished_at"],
            "ok_runs": earlier + ok_now,
        },
    )


def kept_path(path: Path, output_root: str | Path) -> str:
    """How a file under the output root is kept in the root's own notes (the cell index, a
    SLURM job's note): relative to the root where it lies under it, so that the root moved or
    copied as a whole still finds it; absolute otherwise."""
    root = Path(output_root).resolve()
    resolved = path.resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(resolved)


def path_now(kept: str, output_root: str | Path) -> Path:
    """The file a note of the output root names (`kept_path`), where it is now. A relative name
    is under the output root; an absolute one written before names were kept relative, of a
    root since moved (`mv out1 moved/out2`), is found by the longest tail of its path that lies
    under the root now (for a result, its cell key, checked by `latest_result`, rules out
    another cell's)."""
    path, root = Path(kept), Path(output_root)
    if not path.is_absolute():
        return root / path
    if path.exists():
        return path
    for start in range(1, len(path.parts) - 1):
        moved = root.joinpath(*path.parts[start:])
        if moved.exists():
            return moved
    return path


def _same_result(kept: Any, result_path: str, output_root: str | Path) -> bool:
    """Whether an index entry's result (as kept, relative or absolute) is `result_path`."""
    if not isinstance(kept, str):
        return False
    root = Path(output_root)
    return path_now(kept, root).resolve() == (root / result_path).resolve()


def _entry(path: Path) -> dict[str, Any] | None:
    """The index entry at `path`, or None where there is none or it is not one (said once, by
    `latest_result`, when the sweep looks for the cell's result)."""
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) else None


def _ok_runs_of(entry: dict[str, Any]) -> int:
    """How many of the cell's runs finished ok, by its index entry. Entries written before the
    count was kept say only their latest run's status: one run, if that one was ok."""
    count = entry.get("ok_runs")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    return int(entry.get("status") == RunStatus.ok.value)


def finished_runs(output_root: str | Path, key: str) -> int:
    """How many runs of the cell finished ok under `output_root` (0 where it has no entry)."""
    entry = _entry(index_path(output_root, key))
    return _ok_runs_of(entry) if entry is not None else 0


def latest_result(output_root: str | Path, key: str) -> dict[str, Any] | None:
    """The cell's latest result, or None if it has none (or the index points nowhere valid)."""
    path = index_path(output_root, key)
    try:
        entry = json.loads(path.read_text())
    except FileNotFoundError:
        return None  # never run here
    except (OSError, ValueError) as err:
        _damaged(path, f"unreadable ({err})")
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("result"), str):
        _damaged(path, f"a JSON {type(entry).__name__} without the path of a result")
        return None
    result_path = path_now(entry["result"], output_root)
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return None  # the result it points to is gone or was cut short: run the cell again
    if not isinstance(result, dict) or not isinstance(result.get("status"), str):
        _damaged(result_path, "not a cell's record (no status)")
        return None
    if result.get("cell_key") != key:
        return None
    # where the cell's files are now, whatever folder they were written in
    return {**result, "output_dir": str(result_path.parent)}


def _damaged(path: Path, what: str) -> None:
    """Say, in one line, that a state file of a resumed sweep is damaged and what happens:
    the cell counts as unfinished and runs again, which rewrites the index entry."""
    print(
        f"distbench: {path}: {what}; the cell runs again and its index entry is rewritten "
        f"(delete the file to silence this)",
        file=sys.stderr,
        flush=True,
    )


def finished_result(output_root: str | Path, key: str) -> dict[str, Any] | None:
    """The cell's result if it finished (status ok), else None: the cell is to be run."""
    result = latest_result(output_root, key)
    return result if result is not None and result["status"] == RunStatus.ok.value else None
