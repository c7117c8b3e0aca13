"""Facts about a network, remembered on disk between processes.

Some facts about a network cost building it: its layer count (`workloads.networks.
layer_counts`), whether it takes a dataset's input (`workloads.networks.check`), a decoder's
sizes (the planner's). Building costs 3-5 s of importing torch and torchvision, timm or
transformers, in processes that otherwise never load them: a sweep's launcher checking its
cells, a dry run, the planner. Such a fact depends only on what builds the network, so it is
kept per network and dataset shape, and per version of that code: distbench's own network code
(a digest of `workloads/networks/`, its sources included) and the installed libraries the
network's source builds with (`NetworkSourceSpec.libraries`). A user's own module
(`network=module`) is never remembered: its code can change between two commands without any
version saying so. Nothing here imports torch.

A fact is kept as one small JSON file per (kind of fact, network, dataset, code), under
`<cache_dir>/<kind>/`; an unreadable or damaged entry is read as absent (the fact is found
again), and an entry that cannot be written (a read-only cache) is not an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from workloads.datasets.atomic import write_json_atomic
from workloads.datasets.spec import DatasetSpec
from workloads.networks.ref import NetworkRef, canonical_json
from workloads.networks.registry import source_named

# The modules of this package that build no network: changing them changes no fact.
_BUILDS_NONE = frozenset({"remembered.py", "layer_counts.py"})


def entry_path(
    kind: str, ref: NetworkRef, dataset: DatasetSpec, cache_dir: str | Path
) -> Path | None:
    """Where the fact `kind` of (ref, dataset) by today's code is kept; None: not kept (a
    user's module, or a library that is not installed)."""
    versions = library_versions(ref.source)
    if versions is None:
        return None
    identity = canonical_json(
        {
            "network": dataclasses.asdict(ref) | {"_options": None},
            "dataset": dataclasses.asdict(dataset),
            "versions": versions,
            "code": network_code_digest(),
        }
    )
    digest = hashlib.sha256(identity.encode()).hexdigest()[:20]
    return Path(cache_dir).expanduser() / kind / f"{ref.key}-{dataset.name}-{digest}.json"


def read_entry(entry: Path | None) -> dict[str, Any] | None:
    """The fact kept at `entry`; None when there is none, or it cannot be read as a JSON
    object."""
    if entry is None:
        return None
    with contextlib.suppress(OSError, ValueError):
        fact = json.loads(entry.read_text())
        if isinstance(fact, dict):
            return fact
    return None


def keep_entry(entry: Path | None, fact: dict[str, Any]) -> None:
    """Keep `fact` at `entry` (written whole or not at all); nothing where it is not kept."""
    if entry is not None:
        with contextlib.suppress(OSError):
            write_json_atomic(entry, fact)


@functools.cache
def library_versions(source: str) -> dict[str, str] | None:
    """The installed versions of what builds a network of `source` (its spec's `libraries`);
    None: a source whose code no version covers (a user's module) or a library that is not
    installed (building says what is missing)."""
    libraries = source_named(source).libraries
    if libraries is None:
        return None
    try:
        return {name: metadata.version(name) for name in libraries}
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def network_code_digest() -> str:
    """A digest of the code that builds every network (this package's modules and its sources'
    specs, but those that build none: a change there leaves every fact, and the kept layer
    counts, as they were)."""
    digest = hashlib.sha256()
    folder = Path(__file__).parent
    for path in sorted(folder.rglob("*.py")):
        if path.parent != folder or path.name not in _BUILDS_NONE:
            name = path.relative_to(folder).as_posix()
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
