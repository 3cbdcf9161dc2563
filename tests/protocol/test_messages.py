"""Every message: one encode, one decode that checks types and bounds and names what was wrong."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from quarry.errors import ProtocolError, ProtocolMismatch
from quarry.protocol import control, frame, ingest, work
from quarry.protocol.examples import EXAMPLES, RECORD
from quarry.protocol.message import Message


def _message_classes() -> set[type[Message]]:
    found = set()
    for module in (control, ingest, work):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, Message)
                and cls is not Message
                and cls.__module__ == module.__name__
            ):
                found.add(cls)
    return found


def _types_in(value: object) -> set[type]:
    if isinstance(value, Message):
        found = {type(value)}
        for f in dataclasses.fields(value):
            found |= _types_in(getattr(value, f.name))
        return found
    if isinstance(value, (list, tuple)):
        return set().union(*(_types_in(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return set().union(*(_types_in(v) for v in value.values())) if value else set()
    return set()


def test_every_message_class_has_an_example():
    covered = set().union(*(_types_in(m) for m in EXAMPLES))
    assert _message_classes() - covered == set()


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_a_message_comes_back_as_it_left(message):
    again = type(message).from_bytes(message.to_bytes())
    assert again == message
    if message.KIND:
        decoded, payload = type(message).decode(message.encode(b"\x00payload"))
        assert decoded == message and payload == b"\x00payload"


@pytest.mark.parametrize(
    ("message", "body", "words"),
    [
        (
            control.PartitionRef,
            {"domain": "d", "dataset": "t", "partition": "3"},
            "PartitionRef.partition: expected an integer",
        ),
        (
            control.PartitionRef,
            {"domain": "d", "dataset": "t", "partition": True},
            "PartitionRef.partition: expected an integer",
        ),
        (
            control.PartitionRef,
            {"domain": "d", "dataset": "t", "partition": -1},
            "PartitionRef.partition: must be at least 0",
        ),
        (control.PartitionRef, {"domain": "d", "dataset": "t"}, "PartitionRef.partition: missing"),
        (
            control.PartitionRef,
            {"domain": "d", "dataset": "t", "partition": 1, "x": 1},
            "unknown field(s) x",
        ),
        (control.Load, {"cpu": 1.0}, "Load.cpu: must be below 1"),
        (control.Load, {"cpu": float("nan")}, "Load.cpu: must be finite"),
        (control.KvList, {"prefix": "", "limit": 10**9}, "KvList.limit: must be at most 100000"),
        (control.KvGet, {"key": "k" * 600}, "KvGet.key: longer than 511"),
        (
            control.Calibrate,
            {"part": "everything"},
            "Calibrate.part: 'everything' is not one of kernel, reads",
        ),
        (
            work.WorkRequest,
            {"unit": "u", "domain": "d", "dataset": "t", "partitions": []},
            "at least one partition",
        ),
        (
            work.WorkRequest,
            {"unit": "u", "domain": "d", "dataset": "t", "partitions": [1, 1]},
            "a partition listed twice",
        ),
        (
            work.WorkRequest,
            {
                "unit": "u",
                "domain": "d",
                "dataset": "t",
                "partitions": [0],
                "forced": [{"partition": 0, "first": 0, "end": 1, "stage": "half"}],
            },
            "WorkRequest.forced[0].stage: 'half' is not one of raw, filter, full",
        ),
        (
            work.WorkRequest,
            {
                "unit": "u",
                "domain": "d",
                "dataset": "t",
                "partitions": [0],
                "host": {"full_s_per_byte": 1},
            },
            "WorkRequest.host.raw_ratio: missing",
        ),
        (work.SliceRange, {"first": 3, "end": 1}, "first 3 after end 1"),
        (
            work.PushedBack,
            {"partition": 0, "ranges": [], "stage": "full", "rows": 0, "bytes_stored": 0},
            "raw or filtered",
        ),
        (
            control.PartitionSummary,
            {
                "domain": "d",
                "dataset": "t",
                "partition": 0,
                "ingest": {},
                "schema": "bm90IGEgc2NoZW1h",
            },
            "PartitionSummary.ingest.id: missing",
        ),
        (
            control.HelloReply,
            {"protocol": 2, "id": "x", "name": "y", "profile": {"name": "p", "cores": 0}},
            "HelloReply.profile.cores: must be at least 1",
        ),
    ],
)
def test_a_bad_field_is_named(message, body, words):
    with pytest.raises(ProtocolError) as caught:
        message.from_json(body)
    assert words in str(caught.value)


def test_a_schema_that_is_not_one_is_named():
    with pytest.raises(ProtocolError, match="PartitionSummary.schema: not an Arrow schema"):
        control.PartitionSummary.from_json(
            {
                "domain": "d",
                "dataset": "t",
                "partition": 0,
                "ingest": RECORD.to_json(),
                "schema": "eA==",
            }
        )


def test_free_form_values_are_plain_json_and_bounded_in_depth():
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(ProtocolError, match="nested deeper than"):
        ingest.PutPartition.from_json(
            {
                "domain": "d",
                "dataset": "t",
                "partition": 0,
                "ingest": RECORD.to_json(),
                "hints": {"x": deep},
            }
        )


def test_frames_refuse_garbage_other_versions_and_headers_that_are_not_json():
    with pytest.raises(ProtocolMismatch, match="not a quarry request"):
        frame.decode(b"GET / HTTP/1.1")
    good = control.KvGet("k").encode()
    ours = f'"protocol":{frame.PROTOCOL_VERSION}'.encode()
    assert ours in good
    other = good.replace(ours, b'"protocol":9')
    with pytest.raises(ProtocolMismatch, match="speaks quarry protocol 9"):
        frame.decode(other)
    broken = frame.MAGIC + (5).to_bytes(4, "big") + b"{nope"
    with pytest.raises(ProtocolError, match="not JSON"):
        frame.decode(broken)
    with pytest.raises(ProtocolError, match="expected a 'kv_get' message, got 'stats'"):
        control.KvGet.decode(control.Stats().encode())


def test_a_device_refuses_a_malformed_request_naming_the_field(cluster):
    client = cluster.devices["dev0"]
    bad = frame.encode("describe", {"domain": "d", "dataset": "t", "partition": "zero"})
    from pyarrow import flight

    with pytest.raises(ProtocolError, match="PartitionRef.partition: expected an integer"):
        action = flight.Action("describe", bad)
        client.guard(lambda: list(client._client.do_action(action, client._options())))


def test_unit_arguments_are_typed_by_the_unit(cluster):
    from quarry.protocol.work import WorkRequest

    client = cluster.devices["dev0"]
    request = WorkRequest(
        unit="sample", domain="d", dataset="t", partitions=(0,), args={"every": 0}
    )
    with pytest.raises(ProtocolError, match="SampleArgs.every: must be at least 1"):
        list(client.work(request))
    unknown = dataclasses.replace(request, unit="nothing")
    with pytest.raises(Exception, match="no unit of work named 'nothing'"):
        list(client.work(unknown))


def test_messages_carry_units_in_their_names():
    """Numbers with a unit say it (bytes, _s, _per_s): spot-check the wire."""
    names = {f.name for cls in _message_classes() for f in dataclasses.fields(cls)}
    assert {"bytes_stored", "wall_s", "link_bytes_per_s", "retry_after_s"} <= names
    assert not {"bytes_per_sec", "time", "size"} & names
    assert json.loads(control.Stats().to_bytes()) == {}
