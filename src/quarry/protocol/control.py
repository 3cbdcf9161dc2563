"""Control-plane messages: who a device is, what it holds, its store, its load, calibration.

Each request names its ``KIND`` (the Flight action type); each has one reply class. Replies travel
as bare JSON (``to_bytes``) except ``KvValue``, which carries the value as a frame payload.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pyarrow as pa

from quarry.protocol.counters import WorkCounters
from quarry.protocol.frame import Action, Get
from quarry.protocol.integrity import ScrubSummary
from quarry.protocol.message import Message, bounded

NAME_CHARS_MAX = 256
KEY_CHARS_MAX = 511  # LMDB's key limit
KV_LIST_LIMIT_MAX = 100_000
LOAD_SECONDS_MAX = 3600.0
KERNEL_REPEAT_MAX = 1024
PARTITION_MAX = 1 << 20
DEVICE_PARTITIONS_MAX = 1 << 20
COLUMNS_MAX = 1 << 16
# a blocked slice's messages per column (blocks, head, end marker: ``store.codec.BLOCKS_MAX``)
BLOCK_MESSAGES_MAX = (1 << 16) + 2
GENERATION_CHARS_MAX = 64 << 10  # a storage server's names each of its drives'


# ---- whether a device is there ------------------------------------------------------------------

HEARTBEAT_PERIOD_S_MIN = 0.05
HEARTBEAT_PERIOD_S_MAX = 60.0
HEARTBEAT_LIFETIME_S_MAX = 3600.0


@dataclass(frozen=True)
class Heartbeat(Message):
    """A ticket: stream an empty batch every ``period_s`` for ``lifetime_s`` (or until the caller
    goes). The host keeps one open per device it talks to; the device's writes on it keep gRPC
    from taking the host's keepalive pings for abuse while a long call is otherwise silent."""

    KIND = Get.HEARTBEAT

    period_s: float = bounded(low=HEARTBEAT_PERIOD_S_MIN, high=HEARTBEAT_PERIOD_S_MAX)
    lifetime_s: float = bounded(low=HEARTBEAT_PERIOD_S_MIN, high=HEARTBEAT_LIFETIME_S_MAX)


HEARTBEAT_SCHEMA = pa.schema([pa.field("beat", pa.int8())])  # every heartbeat batch: no rows


# ---- who a device is ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello(Message):
    KIND = Action.HELLO


@dataclass(frozen=True)
class ProfileInfo(Message):
    """A device's resource profile, as it reports it (quarry.device.profile.Profile)."""

    name: str = bounded(chars_max=NAME_CHARS_MAX)
    description: str = ""
    compute_factor: float = bounded(low=1e-6, high=1e6, default=1.0)
    cores: int | None = bounded(low=1, high=4096, default=None)
    memory_bytes: int | None = bounded(low=0, default=None)
    internal_bytes_per_s: float | None = bounded(low=0, default=None)
    external_bytes_per_s: float | None = bounded(low=0, default=None)
    kv_bytes_max: int = bounded(low=4096, default=4 << 20)
    capabilities: str = "full"
    expressions: tuple[str, ...] = bounded(items_max=1024, default=())
    column_cache_bytes: int | None = bounded(low=0, default=None)


# the role a storage server answers hello with (a drive's is "device"): the host reads it to
# know which of its devices have drives of their own behind them
SERVER_ROLE = "server"


@dataclass(frozen=True)
class HelloReply(Message):
    protocol: int
    id: str = bounded(chars_max=NAME_CHARS_MAX)
    name: str = bounded(chars_max=NAME_CHARS_MAX)
    profile: ProfileInfo = ProfileInfo(name="host")
    pid: int = bounded(low=0, default=0)
    data: str = ""
    started_at: float = 0.0
    role: str = bounded(chars_max=16, default="device")  # or SERVER_ROLE: a storage server
    # it refuses work and scans asked under another generation than its own (``generation``
    # of WorkRequest and ScanRequest): a coordinator need not ask its pulse first
    checks_generation: bool = False
    # drives that hold partitions behind it: 1 for a device, its drives' for a storage server
    # (an ingest deals a table's partitions over drives, not over what the host sees)
    drives: int = bounded(low=1, high=1 << 16, default=1)
    # its failure domain (from its enrollment, ``quarry device enroll --host-label, --rack``,
    # or ``quarry device serve --host-label, --rack``): the host it runs on and its rack ("":
    # none given); two replicas of a partition never share one while enough exist
    host: str = bounded(chars_max=NAME_CHARS_MAX, default="")
    rack: str = bounded(chars_max=NAME_CHARS_MAX, default="")
    # the version of the cluster's revocation list it holds (0: none), and how many peers it
    # asks for newer ones: a coordinator of the admin's pushes the list to a device behind
    revocations: int = bounded(low=0, default=0)
    peers: int = bounded(low=0, default=0)

    @property
    def is_server(self) -> bool:
        return self.role == SERVER_ROLE


# ---- what a device holds --------------------------------------------------------------------


@dataclass(frozen=True)
class StripeGroup(Message):
    """The partitions of one stripe group of an erasure-coded ingest (``store/parity.py``):
    K data partitions, in stripe position order, and the M parity partitions computed over
    them, in parity block order."""

    data: tuple[int, ...] = bounded(items_max=64)
    parity: tuple[int, ...] = bounded(items_max=16)


@dataclass(frozen=True)
class IngestRecord(Message):
    """One ingest, as every partition it wrote remembers it (and the catalog rebuilds from)."""

    id: str = bounded(chars_max=64)
    first_partition: int = bounded(low=0, high=PARTITION_MAX)
    partitions: int = bounded(low=1, high=PARTITION_MAX)
    replicas: int = bounded(low=1, high=64)
    mode: str = "create"
    created_at: float = 0.0
    # partition number (as text) -> the devices it was placed on, in placement order
    placement: dict[str, list[str]] = bounded(default_factory=dict)
    source: str = ""
    # the participant whose commit decides the ingest, and where every participant listens:
    # a device that missed the outcome (it was down, or the coordinator died) asks it
    decider: str = ""
    addresses: dict[str, str] = bounded(default_factory=dict)
    # rows of each group dealt round-robin to the partitions, first_partition first (0: not
    # recorded): the source's order is group 0 of the first partition, group 0 of the next...
    group_rows: int = bounded(low=0, default=0)
    # the column each partition was sorted by ("" none): slices then hold narrow ranges of it,
    # which zone maps prune (Kinetic Pipe's clustered index); the source's order is not kept
    cluster_by: str = bounded(chars_max=NAME_CHARS_MAX, default="")
    # erasure coded ("ec:K+M"; "" kept in ``replicas`` copies): its stripe groups, whose
    # parity partitions are in ``placement`` too
    redundancy: str = bounded(chars_max=32, default="")
    stripes: tuple[StripeGroup, ...] = bounded(items_max=PARTITION_MAX, default=())

    def __post_init__(self) -> None:
        assert self.mode in ("create", "append"), f"mode must be create or append: {self.mode!r}"

    def written(self) -> list[int]:
        """Every partition this ingest writes: its data partitions, then its parity ones."""
        data = range(self.first_partition, self.first_partition + self.partitions)
        return [*data, *(p for group in self.stripes for p in group.parity)]


@dataclass(frozen=True)
class Inventory(Message):
    KIND = Action.INVENTORY


@dataclass(frozen=True)
class PartitionSummary(Message):
    """A committed partition, without its zone maps (an entry of a device's inventory)."""

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)
    ingest: IngestRecord
    schema: pa.Schema
    compression: str = "none"
    metadata: dict[str, str] = bounded(default_factory=dict)
    hints: dict[str, Any] = bounded(default_factory=dict)
    rows: int = bounded(low=0, default=0)
    slices: int = bounded(low=0, default=0)
    bytes_stored: int = bounded(low=0, default=0)
    bytes_arrow: int = bounded(low=0, default=0)
    device: str = ""
    # every slice carries checksums, checked on every read (False: written before them)
    verified: bool = False


@dataclass(frozen=True)
class InventoryReply(Message):
    partitions: list[PartitionSummary] = bounded(items_max=DEVICE_PARTITIONS_MAX)
    # a storage server whose drives these are not answering: what they hold is missing from
    # ``partitions``, lost for now rather than never written
    drives_down: tuple[str, ...] = bounded(items_max=4096, default=())
    # what ``PulseReply.generation`` says while this inventory holds ("": not known, a write
    # was under way while it was read; whoever caches it asks again)
    generation: str = bounded(chars_max=GENERATION_CHARS_MAX, default="")


@dataclass(frozen=True)
class PartitionRef(Message):
    """One partition of one dataset (``describe``)."""

    KIND = Action.DESCRIBE

    domain: str = bounded(chars_max=NAME_CHARS_MAX)
    dataset: str = bounded(chars_max=NAME_CHARS_MAX)
    partition: int = bounded(low=0, high=PARTITION_MAX)


@dataclass(frozen=True)
class ZoneMap(Message):
    """One column of one slice: its range and nulls. Dates and decimals are tagged values
    (``{"$date": ...}``, see quarry.store.zonemap)."""

    min: Any = None
    max: Any = None
    null_count: int = bounded(low=0, default=0)
    rows: int = bounded(low=0, default=0)
    nan_count: int | None = bounded(low=0, default=None)  # floats: NaNs (None: not counted)
    sum: Any = None  # numeric columns, when exact to keep (``quarry.store.zonemap``)


@dataclass(frozen=True)
class SliceDescription(Message):
    rows: int = bounded(low=0)
    bytes_stored: int = bounded(low=0)
    bytes_arrow: int = bounded(low=0)
    stripes: int = bounded(low=0)
    zone_map: dict[str, ZoneMap] = bounded(default_factory=dict)
    version: int = bounded(low=0, default=1)
    # each column's stream length in the slice value (None: stored whole), and its stripe size
    columns: list[int] | None = bounded(items_max=COLUMNS_MAX, default=None)
    stripe_bytes: int = bounded(low=0, default=0)
    # each column stream's XXH3-64 checksum (None: written before checksums)
    checksums: list[int] | None = bounded(
        items_max=COLUMNS_MAX, low=0, high=(1 << 64) - 1, default=None
    )
    # a blocked slice: rows per block, and per column its messages' lengths and checksums
    # (head, each block, end marker; ``quarry.store.codec.message_lengths``)
    block_rows: int = bounded(low=0, default=0)
    blocks: list[list[int]] | None = bounded(items_max=BLOCK_MESSAGES_MAX, low=0, default=None)
    block_checksums: list[list[int]] | None = bounded(
        items_max=BLOCK_MESSAGES_MAX, low=0, high=(1 << 64) - 1, default=None
    )


@dataclass(frozen=True)
class PartitionDescription(Message):
    """A partition's metadata slice: the summary and, per slice, its size and zone maps."""

    summary: PartitionSummary
    slices: list[SliceDescription]


# ---- the store ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats(Message):
    KIND = Action.STATS


@dataclass(frozen=True)
class CopyInFlight(Message):
    """A partition being copied into this device (a move or a repair), as far as it came."""

    dataset: str = bounded(chars_max=2 * NAME_CHARS_MAX + 1)  # domain/name
    partition: int = bounded(low=0, high=PARTITION_MAX)
    source: str = bounded(chars_max=NAME_CHARS_MAX)  # the device it is copied from
    bytes_received: int = bounded(low=0)
    bytes_total: int = bounded(low=0)  # what the copier said it sends (0: not said)


COPIES_MAX = 4096  # copies into one device at once, as its stats list them
QUARANTINED_MAX = 1024  # sub-plan shapes a device keeps in quarantine (the oldest go first)
SHAPE_CHARS_MAX = 64
DETAIL_CHARS_MAX = 1024


class QuarantineCause(StrEnum):
    """What put a sub-plan shape in quarantine on a device."""

    FAILED_STAGE = "failed_stage"  # its stage failed there: the engine panicked, a fault
    TIME_LIMIT = "time_limit"  # a chunk's stage ran past ``QUARRY_STAGE_S_MAX``


@dataclass(frozen=True)
class QuarantinedPlan(Message):
    """A sub-plan shape (``plan.shape``: its plan without literals) a device declines for a
    dataset until ``expires_at`` (seconds since the epoch), or until ``quarry quarantine
    clear``: the host runs that work meanwhile (docs/operations.md, "Quarantine")."""

    dataset: str = bounded(chars_max=2 * NAME_CHARS_MAX + 1)  # domain/name
    unit: str = bounded(chars_max=NAME_CHARS_MAX)
    shape: str = bounded(chars_max=SHAPE_CHARS_MAX)
    cause: QuarantineCause
    detail: str = bounded(chars_max=DETAIL_CHARS_MAX)  # what failed, in the device's words
    entered_at: float = bounded(low=0.0)
    expires_at: float = bounded(low=0.0)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.dataset, self.unit, self.shape)


@dataclass(frozen=True)
class QuarantineClear(Message):
    """Lift every quarantine a device holds (an admin's: the next work of those shapes runs
    on the device again)."""

    KIND = Action.QUARANTINE_CLEAR


@dataclass(frozen=True)
class QuarantineCleared(Message):
    cleared: int = bounded(low=0)  # shapes it held


@dataclass(frozen=True)
class StatsReply(Message):
    keys: int = bounded(low=0)
    file_bytes: int = bounded(low=0)
    partitions: int = bounded(low=0, default=0)
    pending_partitions: int = bounded(low=0, default=0)
    # ingest streams open now: rows of a coordinator that died may still be arriving, and a
    # pending partition may appear after ``pending_partitions`` read 0
    ingesting: int = bounded(low=0, default=0)
    # admission (device/admission.py): work running now, its bound, and since start how much
    # was admitted and how much refused as busy
    running: int = bounded(low=0, default=0)
    exchanges_max: int = bounded(low=0, default=0)
    admitted: int = bounded(low=0, default=0)
    refused: int = bounded(low=0, default=0)
    queued_bytes: int = bounded(low=0, default=0)  # output computed, not yet sent
    # integrity (docs/integrity.md): damaged copies it found and holds until they are mended,
    # partitions written before checksums (read unverified), and its last whole scrub
    corrupt_copies: int = bounded(low=0, default=0)
    unverified_partitions: int = bounded(low=0, default=0)
    last_scrub: ScrubSummary | None = None
    # partitions being copied into it now: the moves (and repairs) in flight
    copies: tuple[CopyInFlight, ...] = bounded(items_max=COPIES_MAX, default=())
    # since the process started, for rates (``quarry top``): every byte through its drive's
    # internal link (read) and external one (shipped), whatever for; the work counters of every
    # work stream it answered (its ``WorkDone`` messages, summed); and the free space where it
    # stores (a storage server: where its own data folder is)
    read_bytes: int = bounded(low=0, default=0)
    shipped_bytes: int = bounded(low=0, default=0)
    work: WorkCounters = WorkCounters()
    free_bytes: int = bounded(low=0, default=0)
    # sub-plan shapes it declines for now, and why (docs/operations.md, "Quarantine")
    quarantined: tuple[QuarantinedPlan, ...] = bounded(items_max=QUARANTINED_MAX, default=())


@dataclass(frozen=True)
class KvGet(Message):
    KIND = Action.KV_GET

    key: str = bounded(chars_max=KEY_CHARS_MAX)


@dataclass(frozen=True)
class KvValue(Message):
    """The answer to ``kv_get``: the version here, the value as the frame's payload."""

    KIND = "kv_value"

    version: int = bounded(low=0)


@dataclass(frozen=True)
class KvPut(Message):
    """The value is the payload. ``expected_version``: None writes unconditionally, 0 only if
    the key does not exist, n only if the key is at version n (compare-and-swap)."""

    KIND = Action.KV_PUT

    key: str = bounded(chars_max=KEY_CHARS_MAX)
    expected_version: int | None = bounded(low=0, default=None)


@dataclass(frozen=True)
class KvDelete(Message):
    KIND = Action.KV_DELETE

    key: str = bounded(chars_max=KEY_CHARS_MAX)
    expected_version: int | None = bounded(low=0, default=None)


@dataclass(frozen=True)
class KvList(Message):
    KIND = Action.KV_LIST

    prefix: str = bounded(chars_max=KEY_CHARS_MAX, default="")
    limit: int = bounded(low=1, high=KV_LIST_LIMIT_MAX, default=1000)


@dataclass(frozen=True)
class KvKeys(Message):
    keys: list[str] = bounded(items_max=KV_LIST_LIMIT_MAX)


@dataclass(frozen=True)
class Version(Message):
    version: int = bounded(low=0)


@dataclass(frozen=True)
class Deleted(Message):
    """How many key-values a request deleted (``drop``, ``abort``; 0 or 1 for ``kv_delete``)."""

    deleted: int = bounded(low=0)


# ---- load and calibration -------------------------------------------------------------------


@dataclass(frozen=True)
class Load(Message):
    """Emulated background load on the drive, ending by itself."""

    KIND = Action.LOAD

    cpu: float = bounded(low=0.0, below=1.0)  # share of the drive's cores, busy elsewhere
    seconds: float = bounded(low=0.001, high=LOAD_SECONDS_MAX, default=60.0)


@dataclass(frozen=True)
class LoadStarted(Message):
    cpu: float
    seconds: float
    device: str


@dataclass(frozen=True)
class LoadStatusRequest(Message):
    KIND = Action.STATUS_LOAD


@dataclass(frozen=True)
class LoadStatus(Message):
    cpu_busy: float = bounded(low=0.0, high=1.0)
    run_queue: float = bounded(low=0.0)
    background_load: float = bounded(low=0.0, high=1.0)


@dataclass(frozen=True)
class Pulse(Message):
    """Asked before every query, instead of the whole inventory: a coordinator that cached the
    catalog keeps it while every device answers the generation it was read under."""

    KIND = Action.PULSE


@dataclass(frozen=True)
class PulseReply(Message):
    # changes whenever what ``inventory`` or ``hello`` would answer may have (a write to the
    # store, a restart); "" when the device cannot tell (never equal to a cached one)
    generation: str = bounded(chars_max=GENERATION_CHARS_MAX)
    load: LoadStatus  # what ``load_status`` answers: the cost model's figure under auto


class CalibratePart(StrEnum):
    KERNEL = "kernel"  # time the compute kernel on the drive
    READS = "reads"  # internal read bandwidth


@dataclass(frozen=True)
class Calibrate(Message):
    KIND = Action.CALIBRATE

    part: CalibratePart
    repeat: int = bounded(low=1, high=KERNEL_REPEAT_MAX, default=1)


@dataclass(frozen=True)
class CalibrateReply(Message):
    kernel_s: float | None = bounded(low=0.0, default=None)
    internal_bytes_per_s: float | None = bounded(low=0.0, default=None)


@dataclass(frozen=True)
class Measured(Message):
    """A profile's figure beside what calibration measured."""

    expected: float | None
    measured: float
    within_10_percent: bool | None = None
    spread: float | None = None  # of the per-round ratios (compute factor only)
    # times it was measured before it settled (the machine's own load moved it); not settled:
    # the figure is the best seen, not to be trusted (``within_10_percent`` is then None)
    attempts: int = bounded(low=1, high=64, default=1)
    settled: bool = True


@dataclass(frozen=True)
class CalibrationReport(Message):
    """What ``quarry calibrate`` measured on one device; stored on it (``~sys/calibration``) so
    any coordinator, and the cost model, can read it later."""

    device: str
    profile: str
    compute_factor: Measured
    internal_bytes_per_s: Measured
    external_bytes_per_s: Measured
    host_kernel_s: float | None = None
    device_kernel_s: float | None = None
    measured_at: float | None = None


# ---- credentials: the cluster's revocation list -------------------------------------------

REVOKED_MAX = 100_000  # tokens revoked and not yet expired (the authority drops expired ones)
PEERS_MAX = 1024
TOKEN_ID_CHARS_MAX = 64
SIGNATURE_CHARS_MAX = 128  # an Ed25519 signature is 64 bytes, 86 in base64url


@dataclass(frozen=True)
class RevokedToken(Message):
    """A token that no device may accept any more, until it would have expired anyway."""

    id: str = bounded(chars_max=TOKEN_ID_CHARS_MAX)
    expires_at: float = bounded(low=0.0)


@dataclass(frozen=True)
class RevocationList(Message):
    """Every revoked token, signed by the cluster's authority (Ed25519 over ``signed_bytes``):
    a device takes a list only if the key it checks tokens with verifies it, and only if its
    ``version`` is newer than the one it holds, so anyone may carry one but no one can forge
    or roll one back."""

    version: int = bounded(low=0)
    issued_at: float = bounded(low=0.0)
    revoked: tuple[RevokedToken, ...] = bounded(items_max=REVOKED_MAX, default=())
    signature: str = bounded(chars_max=SIGNATURE_CHARS_MAX, default="")

    def signed_bytes(self) -> bytes:
        """What the signature covers: every field but itself, as canonical JSON."""
        body = self.to_json()
        del body["signature"]
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def ids(self) -> frozenset[str]:
        return frozenset(entry.id for entry in self.revoked)


@dataclass(frozen=True)
class RevocationPush(Message):
    """The admin's: take this list (if newer) and ask these peers for newer ones from now on
    (the addresses of the cluster's other devices), so a device that misses a push learns it
    from them."""

    KIND = Action.REVOKE

    revocations: RevocationList
    peers: tuple[str, ...] = bounded(items_max=PEERS_MAX, default=())


@dataclass(frozen=True)
class RevocationsHeld(Message):
    """What a device holds after a push: the list's version, and how many peers it asks."""

    version: int = bounded(low=0)
    peers: int = bounded(low=0, default=0)


@dataclass(frozen=True)
class RevocationsAsk(Message):
    """A device's, of its peers: a list newer than ``version``, if you have one."""

    KIND = Action.REVOCATIONS

    version: int = bounded(low=0)


@dataclass(frozen=True)
class RevocationsReply(Message):
    version: int = bounded(low=0)
    revocations: RevocationList | None = None  # only when newer than the asker's
