"""What a setting accepts, declared once beside its field, and the check derived from it.

A config field declares its kind, unit and range (numbers), or that it is a path (to create or
to read), a name that becomes one file or directory name (a path component), or a line of text:
`lr: float = field(default=0.01, metadata=number(low=0, high=1e3, low_open=True))`.
`allowed(declaration, value)` says what is wrong with a value (None when it is accepted);
`harness.config.schema.check_declared` runs it over every field of every config group in
`validate()`, so a value that no `__post_init__` thought of (inf, nan, 1e15 GB, `../..` in a name,
an empty path) is refused in one line before anything starts. The bounds are physical: generous
enough for any real machine or run, tight enough that no arithmetic on them overflows
(docs/config.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

# Linux's limits (PATH_MAX, NAME_MAX): a longer path or name fails in open()/mkdir().
PATH_MAX_BYTES = 4096
NAME_MAX_BYTES = 255
# MLflow's longest experiment name (and of a param's value).
MLFLOW_NAME_CHARS = 500
# Longest line of free text (a description, a URI, a run name): anything longer is a mistake.
TEXT_CHARS = 10_000
# Largest count of anything a cell iterates over (samples, batches, bytes per message): below
# 2**40, so that products of two counts stay exact in a float and in int64.
MAX_COUNT = 2**40

Kind = Literal["number", "integer", "path", "component", "text"]


@dataclass(frozen=True)
class Accepts:
    """What one field accepts. Numbers: the range [low, high] (`low_open`: low excluded),
    always finite. Paths: non-empty, no NUL, at most PATH_MAX bytes, every part at most
    NAME_MAX bytes; `path` says whether the command creates it or reads it. Components (a
    name that becomes a file or directory name): also no separator, no `..`, no newline, at
    most `max_chars`. Text: one line (no NUL, no newline), at most `max_chars`. A list's
    declaration applies to each element. `null`: what null means, if null is accepted (the
    type says whether it is)."""

    kind: Kind
    unit: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    path: Literal["create", "read", None] = None
    max_chars: int = TEXT_CHARS
    empty: bool = False

    def describe(self) -> str:
        """What is allowed, as the error's tail says it."""
        if self.kind in ("number", "integer"):
            what = "a finite number" if self.kind == "number" else "a whole number"
            low = "(" if self.low_open else "["
            unit = f" {self.unit}" if self.unit else ""
            return f"{what} in {low}{_num(self.low)}, {_num(self.high)}]{unit}"
        if self.kind == "path":
            return (
                f"a path to {self.path or 'use'}: not empty, no NUL, at most "
                f"{PATH_MAX_BYTES} bytes, each part at most {NAME_MAX_BYTES} bytes"
            )
        if self.kind == "component":
            return (
                f"a name that becomes a file or directory name: {'' if self.empty else '1-'}"
                f"{self.max_chars} characters and at most {NAME_MAX_BYTES} bytes, without "
                f"'/', '\\', '..', NUL or a newline"
            )
        return f"one line of text, at most {self.max_chars} characters"


def _num(bound: float | None) -> str:
    if bound is None:
        return "?"
    if float(bound).is_integer() and abs(bound) < 1e16:
        return f"{int(bound):,}"
    return f"{bound:g}"


def number(low: float, high: float, unit: str = "", *, low_open: bool = False) -> dict[str, Any]:
    """Metadata of a float field: finite, in [low, high] (or (low, high])."""
    return {"accepts": Accepts("number", unit, low, high, low_open)}


def integer(low: int, high: float, unit: str = "") -> dict[str, Any]:
    """Metadata of an int field: in [low, high]."""
    return {"accepts": Accepts("integer", unit, low, high)}


def path(use: Literal["create", "read"]) -> dict[str, Any]:
    """Metadata of a path the command creates (a directory it writes into) or reads."""
    return {"accepts": Accepts("path", path=use)}


def component(max_chars: int = NAME_MAX_BYTES) -> dict[str, Any]:
    """Metadata of a name that becomes a file or directory name (or an MLflow name stored as
    one): refused if it could leave its root or exceed the file system's limits."""
    return {"accepts": Accepts("component", max_chars=max_chars)}


def text(max_chars: int = TEXT_CHARS, *, empty: bool = True) -> dict[str, Any]:
    """Metadata of one line of free text."""
    return {"accepts": Accepts("text", max_chars=max_chars, empty=empty)}


def shown(value: Any) -> str:
    """A refused value as an error line shows it: its repr, a long one cut (a 10,000-character
    name would bury what is allowed)."""
    text = repr(value.value if isinstance(value, Enum) else value)
    if len(text) <= 80:
        return text
    return f"{text[:60]}...' ({len(str(value))} characters)"


def declared(metadata: Any) -> Accepts | None:
    """A field's declaration, if it has one."""
    accepts = metadata.get("accepts") if metadata else None
    return accepts if isinstance(accepts, Accepts) else None


def allowed(accepts: Accepts, value: Any) -> str | None:
    """None if `value` is accepted, else what is allowed (the error's tail). None (null) is
    left to the type: a field that is not Optional never holds it."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        bad = [element for element in value if _allowed_one(accepts, element) is not None]
        return f"every element: {accepts.describe()}" if bad else None
    return _allowed_one(accepts, value)


def _allowed_one(accepts: Accepts, value: Any) -> str | None:
    ok = (
        _number_ok(accepts, value)
        if accepts.kind in ("number", "integer")
        else _string_ok(accepts, str(value))
    )
    return None if ok else f"allowed: {accepts.describe()}"


def finite_number(value: object) -> bool:
    """Whether `value` is a finite int or float, not a bool (JSON's true is Python's 1): what
    a setting's number, and a number read back from a state file, must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number_ok(accepts: Accepts, value: Any) -> bool:
    if not finite_number(value):
        return False
    low, high = accepts.low, accepts.high
    above_low = low is None or (value > low if accepts.low_open else value >= low)
    return above_low and (high is None or value <= high)


def _string_ok(accepts: Accepts, value: str) -> bool:
    if "\x00" in value:
        return False
    if accepts.kind == "path":
        return _path_ok(value)
    if "\n" in value or "\r" in value or len(value) > accepts.max_chars:
        return False
    if accepts.kind == "text":
        return accepts.empty or bool(value.strip())
    return _name_ok(value)


def _path_ok(value: str) -> bool:
    if not value.strip() or len(value.encode("utf-8", "surrogatepass")) > PATH_MAX_BYTES:
        return False
    return all(
        len(part.encode("utf-8", "surrogatepass")) <= NAME_MAX_BYTES for part in value.split("/")
    )


def _name_ok(value: str) -> bool:
    """A single path component that stays in its root: not empty, not '.'/'..' or holding
    '..', no separator, at most NAME_MAX bytes."""
    if not value.strip() or value in (".", "..") or ".." in value:
        return False
    if "/" in value or "\\" in value:
        return False
    return len(value.encode("utf-8", "surrogatepass")) <= NAME_MAX_BYTES
