"""Built-in device programs, invoked by name (like the Kinetic ``exec`` of Skytether §5.2).

A program is a function registered under a name; the coordinator runs it on a device with a
``do_exchange`` of kind ``program``. It gets a ``ProgramContext`` (the device's store, its
emulated resources and a small cache) and returns a ``ProgramResult``: an output schema, a
stream of record batches, and a JSON summary sent after the last batch. Arbitrary user code is
not accepted: only what is registered here, by modules shipped with quarry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from quarry.device.emulation import Emulator
from quarry.errors import KeyNotFound, QuarryError
from quarry.store import naming
from quarry.store import partition as partitions
from quarry.store.kv import KeyValueStore

# Modules whose import registers programs; loaded lazily on first use.
PROGRAM_MODULES = ("quarry.genes.device", "quarry.capacity.device")


@dataclass
class ProgramResult:
    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    summary: dict[str, Any] = field(default_factory=dict)  # filled while batches stream


@dataclass
class ProgramContext:
    store: KeyValueStore
    emulator: Emulator
    device: str
    bytes_read: int = 0
    rows_read: int = 0

    def meta(self, domain: str, dataset: str, partition: int) -> partitions.PartitionMeta:
        return partitions.read_meta(self.store, domain, dataset, partition)

    def read_slice(self, meta: partitions.PartitionMeta, number: int) -> pa.RecordBatch:
        """One slice off the store, through the internal bandwidth limit."""
        self.emulator.read(meta.slices[number].bytes_stored)
        batch = partitions.read_slice(self.store, meta, number)
        self.bytes_read += meta.slices[number].bytes_stored
        self.rows_read += batch.num_rows
        return batch

    def compute(self, work: Callable[[], Any]) -> Any:
        """Run CPU work in a device slot, stretched by the profile's compute factor."""
        return self.emulator.run(work)

    def cache_key(self, domain: str, dataset: str, *parts: str) -> str:
        return f"{naming.CACHE_PREFIX}{domain}/{dataset}/" + "/".join(parts)

    def cache_get(self, key: str) -> bytes | None:
        try:
            keys = [k for k in self.store.list(key) if k == key or k.startswith(key + ".")]
            if not keys:
                return None
            return b"".join(self.store.get_many(keys))
        except KeyNotFound:
            return None

    def cache_put(self, key: str, value: bytes) -> None:
        """Store a cached result (striped when over the value limit), replacing any older one."""
        limit = self.store.kv_bytes_max
        with self.store.transaction() as txn:
            for old in txn.list(key):
                if old == key or old.startswith(key + "."):
                    txn.delete(old)
            if len(value) <= limit:
                txn.put(key, value)
            else:
                for i in range(0, len(value), limit):
                    txn.put(naming.stripe_key(key, i // limit), value[i : i + limit])


Program = Callable[[ProgramContext, dict[str, Any], bytes], ProgramResult]
REGISTRY: dict[str, Program] = {}


def register(name: str) -> Callable[[Program], Program]:
    def decorate(function: Program) -> Program:
        assert name not in REGISTRY or REGISTRY[name] is function, f"program {name} twice"
        REGISTRY[name] = function
        return function

    return decorate


def lookup(name: str) -> Program:
    if name not in REGISTRY:
        for module in PROGRAM_MODULES:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as error:
                if error.name != module:
                    raise
    if name not in REGISTRY:
        raise QuarryError(
            f"no device program named {name!r}; this device has: {', '.join(sorted(REGISTRY))}"
        )
    return REGISTRY[name]
