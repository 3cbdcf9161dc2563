"""Erasure-coded stripes: parity over K whole data slices, and a lost one rebuilt from any K.

Rows are never split across devices (Kinetic Pipe's alignment problem, solved as in C2's
RAID-aligned layout): a data slice is whole rows on one device, stored and computed on there
exactly as in a dataset kept in replicas. A *stripe* is slice ``s`` of each of the K data
partitions of a stripe group (K devices in K failure domains); its M parity blocks are computed
over the slices' stored values (every column's stream, as they lie in the store) padded with
zeros to the stripe's longest, and kept as slice ``s`` of the group's M parity partitions (on M
more devices), one row per stripe:

- ``parity``: the parity block (as long as the stripe's longest value);
- ``infos``: JSON, each data slice's ``SliceInfo`` (rows, stream lengths, checksums, zone
  map), null where a partition has no slice ``s``;

so a rebuilt value is cut to its own length and checked against the checksums it was written
with, exactly as a read on its device checks it. The parity partitions are partitions of the
dataset like any other (checksums, pending until commit, repair), numbered from
``PARITY_FIRST`` so they never meet a data partition's number.

The code is zfec's Reed-Solomon (systematic: the data blocks are the caller's own, unchanged,
and any K of the K+M blocks give them back); ``docs/redundancy.md`` says why it and not pyeclib.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import zfec

from quarry.errors import CorruptSlice, InvalidOption
from quarry.store import naming
from quarry.store.partition import SliceInfo
from quarry.store.zonemap import zone_map_from_json, zone_map_to_json

PARITY_FIRST = naming.PARTITIONS_MAX // 2  # parity partitions: 5000 and up; data below
DATA_BLOCKS_MAX = 32  # K: zfec takes at most 256 blocks in all; a stripe this wide is plenty
PARITY_BLOCKS_MAX = 8  # M
PARITY = "parity"
INFOS = "infos"
SCHEMA = pa.schema(
    [pa.field(PARITY, pa.large_binary(), nullable=False), pa.field(INFOS, pa.string())],
    metadata={b"quarry.parity": b"1"},
)
_EC = re.compile(r"^ec:(\d+)\+(\d+)$")


@dataclass(frozen=True)
class Code:
    """K data blocks and M parity blocks per stripe."""

    k: int
    m: int

    def __post_init__(self) -> None:
        if not (1 <= self.k <= DATA_BLOCKS_MAX and 1 <= self.m <= PARITY_BLOCKS_MAX):
            raise InvalidOption(
                f"erasure code {self.k}+{self.m}: K must be 1 to {DATA_BLOCKS_MAX} and M 1 to "
                f"{PARITY_BLOCKS_MAX}"
            )

    @property
    def text(self) -> str:
        return f"ec:{self.k}+{self.m}"

    @property
    def overhead(self) -> float:
        """Bytes stored per byte of data, ideally: (K + M) / K."""
        return (self.k + self.m) / self.k


def parse(redundancy: str) -> Code | None:
    """``"ec:K+M"`` as a code; ``""`` or ``"replicas"`` as None (plain replicas)."""
    if redundancy in ("", "replicas"):
        return None
    match = _EC.match(redundancy.strip().replace(" ", ""))
    if match is None:
        raise InvalidOption(
            f"redundancy {redundancy!r}: give 'ec:K+M' (for example ec:4+2), or leave it out "
            "for replicas"
        )
    return Code(int(match[1]), int(match[2]))


def encode(code: Code, values: list[bytes]) -> tuple[list[bytes], int]:
    """The M parity blocks of a stripe's K stored values (b"" where a partition has no slice
    at this number), and the block length: the longest value's."""
    assert len(values) == code.k, (len(values), code.k)
    length = max(1, max(len(v) for v in values))
    padded = [v + bytes(length - len(v)) if len(v) < length else v for v in values]
    wanted = list(range(code.k, code.k + code.m))
    return [
        bytes(block) for block in zfec.Encoder(code.k, code.k + code.m).encode(padded, wanted)
    ], length


def decode(code: Code, blocks: dict[int, bytes], length: int) -> list[bytes]:
    """The K data blocks (padded to ``length``) from any K of a stripe's blocks: block number
    -> bytes, data blocks 0..K-1 zero-padded as they were coded, parity blocks K..K+M-1."""
    if len(blocks) < code.k:
        raise CorruptSlice(f"{len(blocks)} blocks of a stripe survive; {code.k} are needed")
    chosen = sorted(blocks)[: code.k]
    # zfec wants each data block it is given at its own position, parity blocks in the gaps
    primary = [n for n in chosen if n < code.k]
    secondary = iter(n for n in chosen if n >= code.k)
    order = [n if n in primary else next(secondary) for n in range(code.k)]
    shares = []
    for n in order:
        block = blocks[n]
        shares.append(block + bytes(length - len(block)) if len(block) < length else block)
    decoded = zfec.Decoder(code.k, code.k + code.m).decode(shares, order)
    return [bytes(block) for block in decoded]


def parity_row(block: bytes, infos: list[dict[str, Any] | None]) -> pa.RecordBatch:
    """One stripe's row of a parity partition."""
    return pa.RecordBatch.from_arrays(
        [pa.array([block], pa.large_binary()), pa.array([json.dumps(infos)], pa.string())],
        schema=SCHEMA,
    )


def info_json(info: SliceInfo) -> dict[str, Any]:
    """A data slice's ``SliceInfo`` as a parity row keeps it."""
    return {**asdict(info), "zone_map": zone_map_to_json(info.zone_map)}


def info_from_json(body: dict[str, Any]) -> SliceInfo:
    return SliceInfo(**{**body, "zone_map": zone_map_from_json(body["zone_map"])})


def infos_of(text: str | None, k: int, what: str) -> list[dict[str, Any] | None]:
    """A parity row's slice infos, checked for shape (its checksum covered the bytes)."""
    try:
        infos = json.loads(text or "null")
    except ValueError as error:
        raise CorruptSlice(f"{what}: stripe description is not JSON ({error})") from None
    if not isinstance(infos, list) or len(infos) != k:
        raise CorruptSlice(f"{what}: stripe description does not list {k} slices")
    return infos
