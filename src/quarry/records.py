"""What a user holds (EXPLAIN and its rows): dataclasses whose JSON is their fields.

A ``Record``'s ``to_json`` writes each field under its own name, in order: nested records and
messages by their own ``to_json``, other dataclasses by their fields, tuples as lists, enums by
value. So a key is declared once, as a field, and renaming one is a change in one place that
every reader of the attribute sees. Two field markers shape the JSON where a record holds more
than a flat list of values: ``spread()`` writes a nested record's fields beside the others (the
work counters in a row of EXPLAIN ANALYZE, the cut in EXPLAIN), and ``unless_empty()`` leaves a
field out while it is empty (a section EXPLAIN shows only when there is something in it).

A leaf: it imports nothing of quarry, so every room may declare its records with it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

_SPREAD = "record.spread"
_UNLESS_EMPTY = "record.unless_empty"


def spread(default: Any = dataclasses.MISSING) -> Any:
    """A field whose own fields the JSON writes beside its record's."""
    return dataclasses.field(default=default, metadata={_SPREAD: True})


def unless_empty(default: Any = None, default_factory: Any = dataclasses.MISSING) -> Any:
    """A field the JSON leaves out while it is empty (None, or nothing in it)."""
    if default_factory is not dataclasses.MISSING:
        default = dataclasses.MISSING
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={_UNLESS_EMPTY: True}
    )


class Record:
    """The base of a record: a dataclass (frozen, or a report still being filled in)."""

    def to_json(self) -> dict[str, Any]:
        return record_json(self)


def record_json(record: Any) -> dict[str, Any]:
    """A dataclass's fields as JSON, under their names, shaped by the markers above."""
    body: dict[str, Any] = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if field.metadata.get(_UNLESS_EMPTY) and _empty(value):
            continue
        if field.metadata.get(_SPREAD):
            body.update(to_json(value))
        else:
            body[field.name] = to_json(value)
    return body


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, tuple | list | Mapping) and not value)


def to_json(value: Any) -> Any:
    """Any value a record holds, as JSON."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return record_json(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {(k.value if isinstance(k, enum.Enum) else k): to_json(v) for k, v in value.items()}
    return value
