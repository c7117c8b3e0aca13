"""The length of a network's layer list, remembered on disk between processes.

Checking a pipeline cell needs it (every stage needs a layer: `harness.distributions.
pipeline_config`), and counting builds the network on the meta device, in processes that
otherwise never load torch: a sweep's launcher checking its cells before any worker starts, a
dry run. It is kept as `workloads.networks.remembered` keeps a network's facts (per network,
dataset shape and version of the code that builds it; a user's own module is counted afresh
each time). Nothing here imports torch.

The built-in networks' counts on every image dataset are also kept with the code
(`layer_counts.json` beside this module, written by `python -m workloads.networks.layer_counts`),
under the same names as the cache's entries: a machine that never ran a pipeline cell (a login
node, a first dry run) checks one without loading torch, and a command that only checks its
input still writes nothing. A count of other network code or other library versions has
another name, so it is never read from there (counted instead);
`tests/unit/workloads/networks/test_layer_counts.py` says when the kept file is no longer this
code's.
"""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path

from workloads.datasets.atomic import write_json_atomic
from workloads.datasets.spec import DatasetSpec
from workloads.networks.ref import NetworkRef
from workloads.networks.remembered import entry_path, keep_entry, read_entry

_FOLDER = "layer-counts"
_KEPT = Path(__file__).with_name("layer_counts.json")


def remembered_layer_count(
    ref: NetworkRef, dataset: DatasetSpec, cache_dir: str | Path, *, keep: bool = True
) -> int:
    """`workloads.networks.layers.layer_count(ref, dataset)`, read from `cache_dir` when the
    same code counted it before; else counted (loading torch) and, if `keep`, kept there (a
    command that is only checking its input keeps nothing: bad input writes nothing). A count
    that cannot be kept (a read-only cache) is still returned. Raises NetworkError as
    `layer_count` does (not remembered: the message is built where it is raised)."""
    entry = _entry_path(ref, dataset, cache_dir)
    if entry is not None:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            return int((read_entry(entry) or {})["layers"])
        kept = kept_counts().get(entry.name)
        if kept is not None:
            return kept
    from workloads.networks.layers import layer_count  # builds the network: torch

    count = layer_count(ref, dataset)
    if keep:
        keep_entry(entry, {"layers": count, "network": ref.key, "dataset": dataset.name})
    return count


def _entry_path(ref: NetworkRef, dataset: DatasetSpec, cache_dir: str | Path) -> Path | None:
    return entry_path(_FOLDER, ref, dataset, cache_dir)


@functools.cache
def kept_counts() -> dict[str, int]:
    """The counts kept with the code (`_KEPT`), by the name a cache entry of the same network,
    dataset and code has; none where the file is missing or unreadable."""
    try:
        kept = json.loads(_KEPT.read_text())["layers"]
        return {str(name): int(count) for name, count in kept.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def builtin_counts() -> dict[str, int]:
    """Every built-in network on every image dataset, counted now (loads torch), by the name
    its cache entry has: what `_KEPT` holds for today's code."""
    from workloads.datasets.spec import DATASET_SPECS, IMAGE
    from workloads.networks.layers import NETWORK_NAMES, layer_count

    images = [dataset for dataset in DATASET_SPECS.values() if dataset.kind == IMAGE]
    counts = {}
    for ref in map(NetworkRef.builtin, NETWORK_NAMES):
        for dataset in images:
            entry = _entry_path(ref, dataset, ".")
            if entry is not None:  # None: torch or torchvision is not installed
                counts[entry.name] = layer_count(ref, dataset)
    return counts


def main() -> None:
    """Write `_KEPT` anew from the built-in networks as today's code builds them."""
    counts = builtin_counts()
    write_json_atomic(
        _KEPT,
        {
            "about": "layer counts of the built-in networks on every image dataset, by cache "
            "entry name (workloads/networks/layer_counts.py); written by python -m "
            "workloads.networks.layer_counts",
            "layers": dict(sorted(counts.items())),
        },
    )
    print(f"{len(counts)} counts kept in {_KEPT}")


if __name__ == "__main__":
    main()
