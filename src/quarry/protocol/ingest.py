"""Writing messages: a partition's rows in, one slice replaced, an ingest committed or aborted,
a dataset dropped. Rows travel as the Flight stream of a ``do_put``; these are its descriptor
and its one answer."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from quarry.protocol.control import NAME_CHARS_MAX, PARTITION_MAX, IngestRecord
from quarry.protocol.frame import Action, Put
from quarry.protocol.message import Message, bounded

SLICES_MAX = 1 << 24
METADATA_ITEMS_MAX = 10_000
LEASE_S_DEFAULT = 60.0  # a pending partition outlives a coordinator that stopped renewing it
LEASE_S_MAX = 3600.0


@dataclass(frozen=True)
class PutPartition(Message):
    """Phase one of an ingest: the device cuts the rows into slices and stores them pending."""

    KIND = Put.PARTITION

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)
    ingest: IngestRecord
    compression: str = "none"
    metadata: dict[str, str] = bounded(items_max=METADATA_ITEMS_MAX, default_factory=dict)
    hints: dict[str, Any] = bounded(items_max=METADATA_ITEMS_MAX, default_factory=dict)
    # the partition stays pending this long unless the coordinator renews it (``renew``)
    lease_s: float = bounded(low=0.1, high=LEASE_S_MAX, default=LEASE_S_DEFAULT)
    # rows per slice, the same on every replica so that slice numbers name the same rows
    # everywhere (failover resumes by slice number); None: sized from this device's limit
    slice_rows: int | None = bounded(low=1, high=1 << 40, default=None)
    # a copy of a partition committed elsewhere (a move or a repair): the device it comes from
    # and the bytes it will carry, so the device can say how far it came ("": an ingest)
    copy_from: str = bounded(chars_max=NAME_CHARS_MAX, default="")
    copy_bytes: int = bounded(low=0, default=0)


@dataclass(frozen=True)
class PartitionWritten(Message):
    """The answer once the partition is durable (pending until ``commit``)."""

    partition: int = bounded(low=0, high=PARTITION_MAX)
    rows: int = bounded(low=0)
    slices: int = bounded(low=0, high=SLICES_MAX)
    bytes_stored: int = bounded(low=0)


@dataclass(frozen=True)
class UpdateSlice(Message):
    """Replace one slice, compare-and-swap on its version; the answer is a ``Version``."""

    KIND = Put.UPDATE_SLICE

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)
    slice: int = bounded(low=0, high=SLICES_MAX)
    expected_version: int = bounded(low=0)


@dataclass(frozen=True)
class Commit(Message):
    """Phase two: every pending partition of the ingest becomes visible, in one transaction."""

    KIND = Action.COMMIT

    ingest_id: str = bounded(chars_max=64)


@dataclass(frozen=True)
class Committed(Message):
    committed: list[int]


@dataclass(frozen=True)
class Abort(Message):
    KIND = Action.ABORT

    ingest_id: str = bounded(chars_max=64)


@dataclass(frozen=True)
class Renew(Message):
    """The ingest's coordinator is alive: its pending partitions here stay for ``lease_s``."""

    KIND = Action.RENEW

    ingest_id: str = bounded(chars_max=64)
    lease_s: float = bounded(low=0.1, high=LEASE_S_MAX, default=LEASE_S_DEFAULT)


@dataclass(frozen=True)
class Renewed(Message):
    partitions: int = bounded(low=0)


class Outcome(StrEnum):
    COMMIT = "commit"
    ABORT = "abort"
    PENDING = "pending"  # the decider still holds it pending, its coordinator alive


@dataclass(frozen=True)
class OutcomeRequest(Message):
    """Asked of an ingest's decider by a participant that holds the ingest pending and missed
    its outcome. The decider's own commit decides; a pending ingest whose lease ran out there
    is aborted (its coordinator is gone) and so answered."""

    KIND = Action.OUTCOME

    ingest_id: str = bounded(chars_max=64)


@dataclass(frozen=True)
class OutcomeReply(Message):
    outcome: Outcome


@dataclass(frozen=True)
class Drop(Message):
    KIND = Action.DROP

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)


@dataclass(frozen=True)
class Retire(Message):
    """A partition copied to and committed on the devices that now hold it leaves this one:
    out of its inventory at once, its rows kept a grace for work planned before the move."""

    KIND = Action.RETIRE

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)
    ingest_id: str = bounded(chars_max=64)  # only this ingest's partition (not a newer one)


@dataclass(frozen=True)
class Holders(Message):
    """The devices that hold a partition now, for its copy here to remember (the catalog then
    waits for these, not for those the ingest first chose)."""

    KIND = Action.HOLDERS

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)
    ingest_id: str = bounded(chars_max=64)
    devices: tuple[str, ...] = bounded(items_max=64)


@dataclass(frozen=True)
class Applied(Message):
    """Whether the device held that ingest's partition, and so did as asked."""

    applied: bool
