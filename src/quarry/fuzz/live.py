"""A running device fed malformed requests over Flight: action bodies, tickets, descriptors.

Seeds are real traffic: the requests the coordinator sends while it answers queries, a scan and
an ingest, recorded on their way out (``Recorder``). Each mutation goes to the same device in
the same kind of call, carrying the cluster's admin token (the role allowed the most). An
answer is a clear error when it carries a typed quarry error other than the device's "device
error" (a bug it caught), unclear otherwise; the device is a crash if it stops answering, a
hang if a call outlives ``CALL_TIMEOUT_S``. ``Load`` and ``Calibrate`` are left out: keeping a
device busy for as long as asked is what they are for.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyarrow import flight

from quarry.fuzz.core import EXAMPLES_MAX, Outcomes, mutate
from quarry.protocol import control, frame
from quarry.pushdown import Pushdown

CALL_TIMEOUT_S = 10.0
BUSY_KINDS = ("load", "calibrate")
CALLS = ("action", "ticket", "exchange", "put")


@dataclass
class Traffic:
    """What a coordinator sent: seeds per kind of call (put seeds keep their schema)."""

    action: list[tuple[str, bytes]] = field(default_factory=list)
    ticket: list[bytes] = field(default_factory=list)
    exchange: list[bytes] = field(default_factory=list)
    put: list[tuple[bytes, pa.Schema]] = field(default_factory=list)


class Recorder:
    """Stands in for a device client's Flight client: records each request, then sends it."""

    def __init__(self, inner: flight.FlightClient, traffic: Traffic):
        self._inner = inner
        self._traffic = traffic

    def do_action(self, action: flight.Action, options: Any = None) -> Any:
        if action.type not in BUSY_KINDS:
            self._traffic.action.append((action.type, action.body.to_pybytes()))
        return self._inner.do_action(action, options)

    def do_get(self, ticket: flight.Ticket, options: Any = None) -> Any:
        self._traffic.ticket.append(ticket.ticket)
        return self._inner.do_get(ticket, options)

    def do_exchange(self, descriptor: flight.FlightDescriptor, options: Any = None) -> Any:
        self._traffic.exchange.append(descriptor.command)
        return self._inner.do_exchange(descriptor, options)

    def do_put(self, descriptor: flight.FlightDescriptor, schema: pa.Schema, options: Any = None):
        self._traffic.put.append((descriptor.command, schema))
        return self._inner.do_put(descriptor, schema, options)

    def close(self) -> None:
        self._inner.close()


def record(devices: list[Any], work: Callable[[], None]) -> Traffic:
    """The traffic ``work`` sends to ``devices`` (their DeviceClients)."""
    traffic = Traffic()
    originals = [device._client for device in devices]
    for device in devices:
        device._client = Recorder(device._client, traffic)
    try:
        work()
    finally:
        for device, original in zip(devices, originals):
            device._client = original
    return traffic


def everyday(cluster: Any, dataset: str, sql: str, scratch: str) -> Traffic:
    """The requests of everyday work on ``dataset`` (a particle table): ``sql`` under each
    pushdown, a group-by, a scan, and an ingest and drop of ``scratch`` (never of ``dataset``,
    whose answers must not change while its device is fuzzed)."""
    from quarry.samples import particles

    table = dataset.replace("/", ".")

    def work() -> None:
        for pushdown in (Pushdown.ALWAYS, Pushdown.NEVER, Pushdown.AUTO):
            cluster.sql(sql, pushdown=pushdown).read_all()
        cluster.sql(f"SELECT id % 7 AS g, avg(ke) FROM {table} GROUP BY 1 ORDER BY 1").read_all()
        cluster.scan(dataset, columns=["id", "ke"]).read_all()
        cluster.ingest(particles.table(2_000, seed=4), scratch)
        cluster.drop(scratch)

    return record(list(cluster.devices.values()), work)


def on(cluster: Any, traffic: Traffic) -> Target:
    """A target on the cluster's first device, with the cluster's own credentials."""
    device = next(iter(cluster.devices.values()))
    return Target(device.address, device._headers, traffic)


class Target:
    """One device, called with mutations of ``traffic``'s seeds."""

    def __init__(self, address: str, headers: list[tuple[bytes, bytes]], traffic: Traffic):
        self.client = flight.FlightClient(address)
        self.options = flight.FlightCallOptions(timeout=CALL_TIMEOUT_S, headers=headers)
        self.traffic = traffic
        self.seeds = {
            "action": [body for _, body in traffic.action],
            "ticket": traffic.ticket,
            "exchange": traffic.exchange,
            "put": [command for command, _ in traffic.put],
        }

    def close(self) -> None:
        self.client.close()

    def send(self, call: str, data: bytes, rng: random.Random) -> None:
        if call == "action":
            # the type a device checks against the body's own kind: usually the body's
            kind = rng.choice(self.traffic.action)[0] if rng.random() < 0.2 else _kind(data)
            list(self.client.do_action(flight.Action(kind, data), self.options))
        elif call == "ticket":
            self.client.do_get(flight.Ticket(data), self.options).read_all()
        elif call == "exchange":
            descriptor = flight.FlightDescriptor.for_command(data)
            writer, reader = self.client.do_exchange(descriptor, self.options)
            with writer:
                writer.done_writing()
                while True:
                    try:
                        reader.read_chunk()
                    except StopIteration:
                        break
        else:
            _, schema = rng.choice(self.traffic.put)
            descriptor = flight.FlightDescriptor.for_command(data)
            writer, reader = self.client.do_put(descriptor, schema, self.options)
            with writer:
                writer.write_table(_rows(schema, rng))
                writer.done_writing()
                reader.read()

    def alive(self) -> bool:
        try:
            hello = control.Hello()
            list(self.client.do_action(flight.Action(hello.KIND, hello.encode()), self.options))
            return True
        except flight.FlightError as error:
            return frame.decode_error(str(error)) is not None

    def fuzz(self, call: str, inputs: int, rng: random.Random) -> Outcomes:
        outcomes = Outcomes()
        seeds = self.seeds[call]
        for _ in range(inputs if seeds else 0):
            data = mutate(rng.choice(seeds), rng, seeds)
            started = time.perf_counter()
            try:
                self.send(call, data, rng)
                outcomes.accepted += 1
            except flight.FlightTimedOutError:
                outcomes.hangs += 1
            except (flight.FlightError, OSError, pa.ArrowException) as error:
                if not self._count(outcomes, error, data):
                    outcomes.crashes += 1
                    return outcomes
            elapsed = time.perf_counter() - started
            outcomes.slowest_s = max(outcomes.slowest_s, elapsed)
            outcomes.inputs += 1
        return outcomes

    def _count(self, outcomes: Outcomes, error: Exception, data: bytes) -> bool:
        """Count an error; False when the device is gone."""
        typed = frame.decode_error(str(error))
        if typed is not None and not str(typed).startswith("device error"):
            outcomes.clear[type(typed).__name__] += 1
            return True
        if not self.alive():
            outcomes.examples.setdefault("crash", []).append(f"input {data[:80]!r}")
            return False
        name = type(typed or error).__name__
        outcomes.unclear[name] += 1
        kept = outcomes.examples.setdefault(name, [])
        if len(kept) < EXAMPLES_MAX:
            kept.append(f"{str(error).splitlines()[0][:200]} | input {data[:80]!r}")
        return True


def _kind(body: bytes) -> str:
    try:
        return frame.decode(body)[0]
    except Exception:  # the body no longer decodes: any type will do, the device refuses it
        return "hello"


def _rows(schema: pa.Schema, rng: random.Random) -> pa.Table:
    """A few rows of ``schema`` (none when it has a type without an easy value)."""
    numeric = all(pa.types.is_integer(c.type) or pa.types.is_floating(c.type) for c in schema)
    rows = rng.randint(0, 8) if numeric else 0
    columns = [
        pa.array([rng.randint(-5, 5) for _ in range(rows)], pa.int64()).cast(c.type) for c in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)
