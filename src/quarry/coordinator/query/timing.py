"""Where a query's time went: EXPLAIN ANALYZE's ``time`` section, wall and CPU seconds per part.

On the host the parts follow one another along the query's path, so they add up to at most its
wall time (the rest is the reader's own time between batches, and what no part names):

- ``planning``: from the query asked for to its plan (the catalog's check, the cut or the kept
  one, the cost model under ``auto``), and later waiting for the catalog's check to answer;
- ``fragments``: from the start of the run until every fragment's output was in: the devices at
  work as the host sees it (its CPU meanwhile: receiving, decoding, completing);
- ``super_plan``: the super-plan's own run over those outputs (0 for a pass-through; for a
  row-by-row super-plan it runs while the fragments still arrive).

``host_completion`` is the part of ``fragments`` the host spent completing handed-back slices,
summed over the streams doing it at once.

On the devices the parts are summed over every exchange (devices work at once, so they may
add up to more than the query's wall time): ``device_queueing`` (from asking a device to open
a stream to its admitting it, busy refusals and back-off included, over every stream the host
opened: work exchanges, raw scans, fetches of pushed-back slices), ``store_read``, ``decode``
(with the host's own decompression of slices shipped as stored), ``execute`` and ``ship``;
``devices`` is the exchanges' wall time and the devices' CPU, summed, which the parts are a
share of. A raw scan (``pushdown="never"``) or a fetch reports no device times: what it cost
shows in ``fragments``.

CPU seconds are the threads' that did the work, except for the query, the fragments and the
super-plan: there the host process's (DataFusion works on threads of its own).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from quarry.coordinator.dispatch.report import WorkReport
from quarry.tally import Tally


@dataclass(frozen=True)
class Span:
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def __post_init__(self) -> None:
        assert self.wall_s >= 0 and self.cpu_s >= 0, f"a negative time: {self}"

    @classmethod
    def of(cls, tally: Tally) -> Span:
        # clocks read on different threads may disagree by a hair: never below zero
        return cls(max(0.0, tally.wall_s), max(0.0, tally.cpu_s))

    def to_json(self) -> dict[str, float]:
        return {"wall_s": round(self.wall_s, 6), "cpu_s": round(self.cpu_s, 6)}


HOST_PARTS = ("planning", "fragments", "host_completion", "super_plan")
DEVICE_PARTS = ("device_queueing", "store_read", "decode", "execute", "ship")


@dataclass(frozen=True)
class QueryTime:
    wall_s: float  # from the query asked for to its last row read
    cpu_s: float  # the host process's over the same span
    planning: Span
    fragments: Span
    host_completion: Span
    super_plan: Span
    device_queueing: Span
    store_read: Span
    decode: Span
    execute: Span
    ship: Span
    devices: Span  # the exchanges' wall and the devices' CPU, summed
    streams: int  # work exchanges, raw scans and fetches the host opened

    def host_path_s(self) -> float:
        """The host's parts along the query's path, which its wall time contains."""
        return self.planning.wall_s + self.fragments.wall_s + self.super_plan.wall_s

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            body[f.name] = value.to_json() if isinstance(value, Span) else value
        body["wall_s"], body["cpu_s"] = round(self.wall_s, 6), round(self.cpu_s, 6)
        return body

    def render(self) -> list[str]:
        """The section as text, one line for the query, one for the host, one for the
        devices: ``wall / cpu`` milliseconds per part."""

        def part(name: str, span: Span) -> str:
            return f"{name} {_ms(span.wall_s)}/{_ms(span.cpu_s)}"

        host = [
            part("planning", self.planning),
            part("fragments", self.fragments),
            f"(completing {_ms(self.host_completion.wall_s)}/{_ms(self.host_completion.cpu_s)})",
            part("super-plan", self.super_plan),
        ]
        devices = [
            f"queueing {_ms(self.device_queueing.wall_s)}",
            part("read", self.store_read),
            part("decode", self.decode),
            part("execute", self.execute),
            part("ship", self.ship),
        ]
        return [
            f"time, wall/cpu ms: query {_ms(self.wall_s)}/{_ms(self.cpu_s)}",
            "  host     " + " · ".join(host),
            "  devices  "
            + " · ".join(devices)
            + f" (of {_ms(self.devices.wall_s)}/{_ms(self.devices.cpu_s)}"
            + f"; {self.streams} stream{'s' if self.streams != 1 else ''})",
        ]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


@dataclass
class HostClocks:
    """What the host counts while a query runs (``Query``), made into a ``QueryTime`` after."""

    planning: Tally
    fragments: Tally
    super_plan: Tally
    host_completion: Tally
    opening: Tally
    streams: int


def query_time(
    wall_s: float, cpu_s: float, host: HostClocks, reports: list[WorkReport]
) -> QueryTime:
    """The section, from the host's clocks and every device's account (``WorkReport``)."""
    read, decode, execute, ship, devices = Tally(), Tally(), Tally(), Tally(), Tally()
    for report in reports:
        times = report.times
        read.add(Tally(times.read_s, times.read_cpu_s))
        decode.add(Tally(times.decode_s, times.decode_cpu_s))
        execute.add(Tally(times.execute_s, times.execute_cpu_s))
        ship.add(Tally(times.ship_s, times.ship_cpu_s))
        devices.add(Tally(report.wall_s, report.counters.device_cpu_s))
        # the host's own decompression of slices shipped as stored: on one thread, wall = CPU
        decode.add(Tally(report.decode_s, report.decode_s))
    return QueryTime(
        wall_s=max(0.0, wall_s),
        cpu_s=max(0.0, cpu_s),
        planning=Span.of(host.planning),
        fragments=Span.of(host.fragments),
        host_completion=Span.of(host.host_completion),
        super_plan=Span.of(host.super_plan),
        device_queueing=Span.of(host.opening),
        store_read=Span.of(read),
        decode=Span.of(decode),
        execute=Span.of(execute),
        ship=Span.of(ship),
        devices=Span.of(devices),
        streams=host.streams,
    )
