"""`NetworkRef`: which network a cell trains, as a hashable value.

A network is one of the six built-in CNNs of the thesis (`source="builtin"`, by name), a
user's own module (`source="module"`: an importable factory or class and its keyword
arguments), a model of a zoo by name (`torchvision`, `timm`), a Hugging Face `transformers`
model built from its config class (`hf`: `arch` is the model type, `options` the config's
fields), or one of a source another package registers (`workloads.networks.registry`).
Everything that builds, profiles or caches facts of a network takes a `NetworkRef`, so the
same code serves all of them; `key` tells two networks apart wherever facts are cached.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

# The source of the six built-in networks, which a bare name means (`as_ref`); every source,
# this one's spec included, is in `workloads.networks.registry`.
BUILTIN = "builtin"


class NetworkError(ValueError):
    """A network that cannot be built, split or run on the dataset's input; the message is one
    line that names the setting (`network.<key>`) and what to do."""


def canonical_json(options: dict[str, Any]) -> str:
    """`options` as sorted, compact JSON: equal settings give equal refs and keys."""
    return json.dumps(options, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class NetworkRef:
    """A network, as the config names it.

    Attributes:
        name: the network's label in tables, run names and MLflow (a built-in's name, or a
            preset's, e.g. `llama_tiny`, or what the user called it).
        source: where it comes from: the name of a network source
            (`workloads.networks.registry.sources()`).
        target: `module`: "package.module:attribute" (or "package.module.attribute") of a
            factory or an `nn.Module` class.
        arch: `torchvision`/`timm`: the model's name in the zoo; `hf`: the model type of a
            `transformers` config class (`gpt2`, `llama`, `bert`, ...).
        options_json: `options` as canonical JSON (hashable): the factory's keyword arguments,
            or the `hf` config's fields.
        blocks: dotted path of the module's repeated block container (pipelines split there),
            or None.
    """

    name: str
    source: str = BUILTIN
    target: str | None = None
    arch: str | None = None
    options_json: str = "{}"
    blocks: str | None = None
    _options: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_options", json.loads(self.options_json))

    @classmethod
    def builtin(cls, name: str) -> NetworkRef:
        return cls(name=name)

    @property
    def options(self) -> dict[str, Any]:
        """The keyword arguments (or config fields), a fresh copy."""
        return json.loads(self.options_json)

    @property
    def is_builtin(self) -> bool:
        return self.source == BUILTIN

    @property
    def key(self) -> str:
        """A file-name-safe identity: the name for a built-in network, else the name and a
        digest of everything that defines the network (two settings never share facts)."""
        if self.is_builtin:
            return self.name
        identity = canonical_json(
            {
                "source": self.source,
                "target": self.target,
                "arch": self.arch,
                "options": self._options,
                "blocks": self.blocks,
            }
        )
        digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
        return f"{self.name}-{digest}"

    def __str__(self) -> str:
        return self.name


def as_ref(network: str | NetworkRef) -> NetworkRef:
    """A built-in network's name, or a ref, as a ref."""
    return network if isinstance(network, NetworkRef) else NetworkRef.builtin(network)
