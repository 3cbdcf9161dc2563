"""A device-local key-value namespace on LMDB, Kinetic-style.

Every key carries a version (a counter that starts at 1 and grows with each put). Writes may name
the version they expect (compare-and-swap, 0 = "must not exist"); a transaction that loses any of
its checks writes nothing. LMDB serialises write transactions and makes each one durable on
commit, which gives exactly-one-wins for two writers racing on the same slice.
"""

from __future__ import annotations

import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pyarrow as pa

from quarry.errors import KeyNotFound, ValueTooLarge, VersionConflict

MAP_BYTES_DEFAULT = 1 << 40  # virtual size only: LMDB grows the file as data arrives
KEY_BYTES_MAX = 480  # LMDB's compiled limit is 511; leave room
LIST_KEYS_MAX = 10_000_000
READERS_MAX = 512  # LMDB read transactions open at once
SNAPSHOTS_MAX = READERS_MAX // 2  # of which snapshots read in place may hold (``Snapshot``)

_VERSION = struct.Struct(">Q")


class Transaction:
    """Operations inside one LMDB write transaction; all or nothing."""

    def __init__(
        self,
        txn: lmdb.Transaction,
        data: object,
        versions: object,
        kv_bytes_max: int,
        shown: Callable[[], None] = lambda: None,
    ):
        self._txn = txn
        self._data = data
        self._versions = versions
        self._kv_bytes_max = kv_bytes_max
        self._shown = shown

    def show(self) -> None:
        """This transaction, begun as one no reader of committed data sees, changes what is
        committed after all (``KeyValueStore.visible_writes`` counts it)."""
        self._shown()

    def version(self, key: str) -> int:
        raw = self._txn.get(_encode_key(key), db=self._versions)
        return 0 if raw is None else _VERSION.unpack(raw)[0]

    def get(self, key: str) -> tuple[bytes, int]:
        value = self._txn.get(_encode_key(key), db=self._data)
        if value is None:
            raise KeyNotFound(f"no key {key!r} on this device")
        return bytes(value), self.version(key)

    def check(self, key: str, expected_version: int | None) -> int:
        current = self.version(key)
        if expected_version is not None and current != expected_version:
            raise VersionConflict(
                f"key {key!r} is at version {current}, not {expected_version}: another writer "
                "changed it first; nothing was written. Read it again and retry."
            )
        return current

    def put(self, key: str, value: bytes | memoryview, expected_version: int | None = None) -> int:
        size = len(value)
        if size > self._kv_bytes_max:
            raise ValueTooLarge(
                f"value for {key!r} is {size} bytes, over this device's limit of "
                f"{self._kv_bytes_max} bytes (kv_bytes_max): stripe it over several keys or use "
                "a profile with a larger limit"
            )
        current = self.check(key, expected_version)
        encoded = _encode_key(key)
        self._txn.put(encoded, value, db=self._data)
        self._txn.put(encoded, _VERSION.pack(current + 1), db=self._versions)
        return current + 1

    def delete(self, key: str, expected_version: int | None = None) -> bool:
        current = self.check(key, expected_version)
        if current == 0:
            return False
        encoded = _encode_key(key)
        self._txn.delete(encoded, db=self._data)
        self._txn.delete(encoded, db=self._versions)
        return True

    def list(self, prefix: str, limit: int = LIST_KEYS_MAX) -> list[str]:
        return _list(self._txn, self._data, prefix, limit)


class KeyValueStore:
    """One LMDB environment per device: a ``data`` and a ``versions`` table."""

    def __init__(self, path: str | Path, kv_bytes_max: int, map_bytes: int = MAP_BYTES_DEFAULT):
        assert kv_bytes_max > 0
        Path(path).mkdir(parents=True, exist_ok=True)
        self.path = Path(path)
        self.kv_bytes_max = kv_bytes_max
        self._env = lmdb.open(
            str(path),
            map_size=map_bytes,
            max_dbs=4,
            subdir=True,
            sync=True,
            metasync=True,
            # Slices are values of megabytes read whole, in place, through the map: the
            # kernel's read-ahead turns their page faults into large reads. Without it (LMDB's
            # MADV_RANDOM) a cold 3.2 GB of 8 MB values read at 74 MB/s, 43 s; with it, 1.2-2.1 s.
            readahead=True,
            max_readers=READERS_MAX,
        )
        self._data = self._env.open_db(b"data")
        self._versions = self._env.open_db(b"versions")
        self._writes = 0  # write transactions begun: what was read before may have changed
        # of which those that may change what a reader of committed data sees (``visible``)
        self._visible_writes = 0
        self._lock = threading.Lock()
        self._writer = threading.Lock()  # the one write transaction under way
        self._snapshots = 0  # open Snapshots

    def close(self) -> None:
        self._env.close()

    @contextmanager
    def transaction(self, visible: bool = True) -> Iterator[Transaction]:
        """A write transaction: commits on normal exit, writes nothing if anything raises.
        ``visible=False``: it writes only what no reader of committed partitions reads (rows of
        a partition still pending, a lease, a leftover's removal), so ``visible_writes`` stays."""
        shown = [visible]

        def show() -> None:
            if not shown[0]:
                shown[0] = True
                self._visible_writes += 1  # under way from now (odd), as if it began so

        # One writer at a time (LMDB's rule too), held until its count has moved past its
        # commit: a reader that finds the count even and unchanged around a read saw no write
        # under way, committed or not (counted before the commit, a reader could cache what
        # came before it under the count that follows it, for good).
        with self._writer:
            txn = self._env.begin(write=True)
            self._writes += 1
            self._visible_writes += visible
            try:
                yield Transaction(txn, self._data, self._versions, self.kv_bytes_max, show)
            except BaseException:
                txn.abort()
                raise
            else:
                txn.commit()
            finally:
                self._writes += 1  # and once more when it is over: odd means under way
                self._visible_writes += shown[0]

    def writes(self) -> int:
        """Changes whenever a write transaction begins or ends: a reader that saw the same
        number before and after reading saw no write (cache what it read under it)."""
        return self._writes

    def visible_writes(self) -> int:
        """``writes``, counting only those that may change what is committed: a device's
        catalog generation (a copy streaming into it, or a lease renewed, is not a change a
        query planned on its catalog must start again for)."""
        return self._visible_writes

    def get(self, key: str) -> tuple[bytes, int]:
        with self._env.begin() as txn:
            value = txn.get(_encode_key(key), db=self._data)
            if value is None:
                raise KeyNotFound(f"no key {key!r} on this device")
            raw = txn.get(_encode_key(key), db=self._versions)
            return bytes(value), _VERSION.unpack(raw)[0]

    def get_many(self, keys: list[str]) -> list[bytes]:
        """Values of several keys read in one snapshot (the stripes of a slice)."""
        with self._env.begin() as txn:
            values = []
            for key in keys:
                value = txn.get(_encode_key(key), db=self._data)
                if value is None:
                    raise KeyNotFound(f"no key {key!r} on this device")
                values.append(bytes(value))
            return values

    def get_ranges(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        """Byte ranges ``[start, end)`` of values, read in one snapshot. Only those bytes leave
        the memory map (the pages around them are all the drive touches); a range past a value's
        end comes back short, for the reader's checks to catch."""
        with self._env.begin(buffers=True) as txn:
            parts = []
            for key, start, end in ranges:
                value = txn.get(_encode_key(key), db=self._data)
                if value is None:
                    raise KeyNotFound(f"no key {key!r} on this device")
                parts.append(bytes(value[start:end]))
            return parts

    def snapshot(self) -> Snapshot | None:
        """A read snapshot whose values are read in place (None: ``SNAPSHOTS_MAX`` are open,
        or every reader slot is taken; read with copies, ``get_ranges``)."""
        with self._lock:
            if self._snapshots >= SNAPSHOTS_MAX:
                return None
            self._snapshots += 1
        try:
            return Snapshot(self._env.begin(buffers=True), self._data, self._snapshot_ended)
        except lmdb.ReadersFullError:
            self._snapshot_ended()
            return None

    def _snapshot_ended(self) -> None:
        with self._lock:
            self._snapshots -= 1

    def open_snapshots(self) -> int:
        return self._snapshots

    def version(self, key: str) -> int:
        with self._env.begin() as txn:
            raw = txn.get(_encode_key(key), db=self._versions)
            return 0 if raw is None else _VERSION.unpack(raw)[0]

    def put(self, key: str, value: bytes, expected_version: int | None = None) -> int:
        with self.transaction() as txn:
            return txn.put(key, value, expected_version)

    def delete(self, key: str, expected_version: int | None = None) -> bool:
        with self.transaction() as txn:
            return txn.delete(key, expected_version)

    def list(self, prefix: str = "", limit: int = LIST_KEYS_MAX) -> list[str]:
        with self._env.begin() as txn:
            return _list(txn, self._data, prefix, limit)

    def delete_prefix(self, prefix: str, visible: bool = True) -> int:
        """Delete every key under ``prefix`` in one transaction; returns how many."""
        assert prefix, "refusing to delete the whole namespace"
        with self.transaction(visible) as txn:
            keys = txn.list(prefix)
            for key in keys:
                txn.delete(key)
            return len(keys)

    def stats(self) -> dict[str, int]:
        with self._env.begin() as txn:
            entries = txn.stat(self._data)["entries"]
        # Summing value sizes would read every value; the file size is what the disk sees.
        info = self._env.info()
        return {"keys": entries, "file_bytes": info["last_pgno"] * self._env.stat()["psize"]}

    def count(self, prefix: str = "") -> int:
        return len(self.list(prefix))


class Snapshot:
    """A read transaction whose values are Arrow buffers over LMDB's memory map: no copy.

    LMDB keeps the pages a reader sees until its transaction ends, and writers reuse freed
    pages only after that. So the transaction ends when the last buffer over it goes (each
    buffer holds the snapshot as its base), never before: a slice read through it and still
    referenced (an engine's output passing a column through, rows parked for the host) keeps
    its bytes. Open snapshots take LMDB reader slots: at most ``SNAPSHOTS_MAX`` of the
    ``READERS_MAX`` are theirs, the rest kept for plain reads; past it the store reads with
    copies. Closing the store ends them all: a device closes it only on
    its way out."""

    def __init__(self, txn: lmdb.Transaction, data: object, ended: Callable[[], None]):
        self._txn = txn
        self._data = data
        weakref.finalize(self, _end, txn, ended)

    def ranges(self, ranges: list[tuple[str, int, int]]) -> list[pa.Buffer]:
        """Byte ranges ``[start, end)`` of values, in place; a range past a value's end comes
        back short, for the reader's checks to catch."""
        parts = []
        found: dict[str, tuple[int, int]] = {}  # key: its value's address and length
        for key, start, end in ranges:
            if key not in found:  # a slice's columns are ranges of one value: looked up once
                value = self._txn.get(_encode_key(key), db=self._data)
                if value is None:
                    raise KeyNotFound(f"no key {key!r} on this device")
                found[key] = (pa.py_buffer(value).address, len(value))
            address, length = found[key]
            start, end = min(start, length), min(max(start, end), length)
            parts.append(pa.foreign_buffer(address + start, end - start, base=self))
        return parts


def _end(txn: lmdb.Transaction, ended: Callable[[], None]) -> None:
    txn.abort()
    ended()


def _encode_key(key: str) -> bytes:
    encoded = key.encode()
    if not 0 < len(encoded) <= KEY_BYTES_MAX:
        raise ValueError(f"key {key[:60]!r} must be 1..{KEY_BYTES_MAX} bytes")
    return encoded


def _list(txn: lmdb.Transaction, db: object, prefix: str, limit: int) -> list[str]:
    encoded = prefix.encode()
    keys: list[str] = []
    cursor = txn.cursor(db=db)
    if not cursor.set_range(encoded):
        return keys
    for key in cursor.iternext(keys=True, values=False):
        if not key.startswith(encoded):
            break
        keys.append(key.decode())
        if len(keys) >= limit:
            break
    return keys
