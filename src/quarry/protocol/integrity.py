"""Integrity messages: the damaged copies a device found, scrubbing its slices, mending one copy
from a good one (DESIGN §2a, "Integrity"; docs/integrity.md).

A device checks every value it reads against its checksum. What fails is never an answer: the
device raises ``CorruptSlice`` and remembers the copy (``CorruptCopy``) until it is mended. A
scrub reads a range of a partition's slices on the device itself (``Scrub``), so nothing but the
findings crosses the network; a coordinator walks every partition of every device that way and
then mends each damaged copy from a good one: a slice rewritten from a replica's rows
(``RepairSlice``), a metadata slice replaced by a replica's (``RepairMeta``), after which the
device checks its own slices against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from quarry.errors import CorruptSlice
from quarry.protocol.frame import Action, Put
from quarry.protocol.message import Message, bounded

NAME_CHARS_MAX = 256
PARTITION_MAX = 1 << 20
SLICES_MAX = 1 << 24
DETAIL_CHARS_MAX = 4096
CORRUPT_KEPT_MAX = 10_000  # damaged copies a device remembers (the oldest go first)
SCRUB_BYTES_PER_S_MAX = 1e12


class CopyPart(StrEnum):
    """Which stored value of a partition is damaged."""

    SLICE = "slice"
    METADATA = "metadata"  # the metadata slice: the whole copy is unreadable
    CATALOG = "catalog"  # the catalog entry made from it: rebuilt from the metadata slice


class FoundBy(StrEnum):
    READ = "read"  # a query or a copy read it
    SCRUB = "scrub"


@dataclass(frozen=True)
class CorruptCopy(Message):
    """A damaged copy a device holds, remembered until it is mended."""

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)
    part: CopyPart
    slice: int | None = bounded(low=0, high=SLICES_MAX, default=None)  # SLICE only
    device: str = bounded(chars_max=NAME_CHARS_MAX, default="")
    detail: str = bounded(chars_max=DETAIL_CHARS_MAX, default="")  # what the check found
    found_at: float = bounded(low=0.0, default=0.0)
    found_by: FoundBy = FoundBy.READ

    def __post_init__(self) -> None:
        assert (self.slice is not None) == (self.part is CopyPart.SLICE), (
            "a damaged slice names its number, nothing else does"
        )

    @property
    def qualified(self) -> str:
        return f"{self.domain}/{self.dataset}"

    @property
    def key(self) -> tuple[str, str, int, str, int | None]:
        """What names the copy: the same copy found twice is remembered once."""
        return (self.domain, self.dataset, self.partition, self.part.value, self.slice)

    @classmethod
    def of(
        cls, error: CorruptSlice, device: str, found_at: float, found_by: FoundBy = FoundBy.READ
    ) -> CorruptCopy | None:
        """The copy a ``CorruptSlice`` names (None: it names none, a slice shipped as stored
        that broke on the way)."""
        if error.dataset is None or error.partition is None or error.part is None:
            return None
        domain, dataset = error.dataset.split("/")
        return cls(
            domain,
            dataset,
            error.partition,
            CopyPart(error.part),
            error.slice,
            error.device or device,
            str(error)[:DETAIL_CHARS_MAX],
            found_at,
            found_by,
        )


@dataclass(frozen=True)
class Scrub(Message):
    """Read slices ``first`` to ``end`` of a partition on the device, check each against its
    checksum and its zone map against its rows, at most ``bytes_per_s`` off the store. A zone
    map that disagrees with rows that check is rewritten from the rows (the data is trusted
    over its summary), and a catalog entry that fails its check is rebuilt from the metadata
    slice; everything else damaged is reported, and remembered, for a good copy to mend."""

    KIND = Action.SCRUB

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)
    first: int = bounded(low=0, high=SLICES_MAX, default=0)
    end: int | None = bounded(low=0, high=SLICES_MAX, default=None)  # None: to the last
    bytes_per_s: float | None = bounded(low=1.0, high=SCRUB_BYTES_PER_S_MAX, default=None)


@dataclass(frozen=True)
class ScrubReply(Message):
    slices: int = bounded(low=0)  # slices read and checked
    slices_total: int = bounded(low=0)  # in the partition (0: its metadata slice is damaged)
    rows: int = bounded(low=0, default=0)
    bytes_read: int = bounded(low=0, default=0)
    unverified: int = bounded(low=0, default=0)  # of them, written before checksums
    corrupt: tuple[CorruptCopy, ...] = bounded(items_max=SLICES_MAX, default=())
    zone_maps_fixed: int = bounded(low=0, default=0)
    catalog_fixed: bool = False
    seconds: float = bounded(low=0.0, default=0.0)


@dataclass(frozen=True)
class ScrubSummary(Message):
    """A device's last whole scrub, as it keeps it for ``quarry status``."""

    started_at: float = bounded(low=0.0)
    finished_at: float = bounded(low=0.0)
    partitions: int = bounded(low=0, default=0)
    slices: int = bounded(low=0, default=0)
    bytes_read: int = bounded(low=0, default=0)
    corrupt: int = bounded(low=0, default=0)  # damaged copies found
    repaired: int = bounded(low=0, default=0)  # of them, mended from a good copy
    zone_maps_fixed: int = bounded(low=0, default=0)
    unverified: int = bounded(low=0, default=0)  # slices written before checksums
    errors: tuple[str, ...] = bounded(items_max=100, default=())  # what could not be done


@dataclass(frozen=True)
class Scrubbed(Message):
    """A coordinator's word that a whole scrub of the device is over, and what it found."""

    KIND = Action.SCRUBBED

    summary: ScrubSummary


@dataclass(frozen=True)
class Integrity(Message):
    KIND = Action.INTEGRITY


@dataclass(frozen=True)
class IntegrityReply(Message):
    corrupt: tuple[CorruptCopy, ...] = bounded(items_max=CORRUPT_KEPT_MAX, default=())
    last_scrub: ScrubSummary | None = None


@dataclass(frozen=True)
class RepairSlice(Message):
    """Rewrite one damaged slice from a good copy's rows (the Flight stream of the put): the
    same rows, so its version, row count and zone map stay; the answer is a ``Version``."""

    KIND = Put.REPAIR_SLICE

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)
    slice: int = bounded(low=0, high=SLICES_MAX)
    version: int = bounded(low=1)  # the slice's, on the good copy: refused if it differs here


@dataclass(frozen=True)
class RepairMeta(Message):
    """Replace a damaged metadata slice with a good copy's (the payload: its stored value,
    sealed with its checksum, which the device checks). Replicas hold the same slices, so the
    device keeps its own slice values and scrubs them against it at once: the answer is that
    ``ScrubReply``, and a slice that does not check is mended like any other."""

    KIND = Action.REPAIR_META

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)
