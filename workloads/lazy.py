"""Packages that name their modules' exports without importing them (PEP 562).

`from workloads.datasets import EpochLoader` still works, but importing the package, which
Python does on the way to any of its modules, runs none of them: a command that reads a
dataset's facts (`workloads.datasets.spec`) or a network's name (`workloads.networks.ref`)
answers without loading torch. The same pattern as scientific Python's `lazy_loader` (SPEC 1),
in the few lines it takes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`, whose name `name` is the attribute of
    the same name of its module `exports[name]` (relative to the package), imported when the
    name is first asked for."""

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module attribute hook of PEP 562
        try:
            module = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:  # noqa: N807 - the module attribute hook of PEP 562
        return sorted(exports)

    return __getattr__, __dir__
