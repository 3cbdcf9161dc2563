"""Records users hold: their JSON is their fields, shaped by two markers."""

from __future__ import annotations

import json
from dataclasses import dataclass

from quarry.protocol.stage import Stage
from quarry.records import Record, spread, unless_empty


@dataclass(frozen=True)
class Inner(Record):
    a: int
    b: Stage


@dataclass(frozen=True, kw_only=True)
class Outer(Record):
    name: str
    inner: Inner = spread()
    rows: tuple[Inner, ...] = ()
    by_stage: dict[Stage, int]
    note: str | None = unless_empty()
    extras: tuple[str, ...] = unless_empty(())


def test_the_json_is_the_fields_in_order():
    outer = Outer(name="x", inner=Inner(1, Stage.RAW), rows=(Inner(2, Stage.FULL),), by_stage={})
    body = outer.to_json()
    assert list(body) == ["name", "a", "b", "rows", "by_stage"]  # spread, the empty left out
    assert body["b"] == "raw" and type(body["b"]) is str
    assert body["rows"] == [{"a": 2, "b": "full"}]
    assert json.loads(json.dumps(body)) == body


def test_a_field_shows_once_it_holds_something():
    outer = Outer(
        name="x",
        inner=Inner(1, Stage.RAW),
        by_stage={Stage.FILTER: 3},
        note="n",
        extras=("e",),
    )
    body = outer.to_json()
    assert body["note"] == "n" and body["extras"] == ["e"]
    assert body["by_stage"] == {"filter": 3} and type(next(iter(body["by_stage"]))) is str
