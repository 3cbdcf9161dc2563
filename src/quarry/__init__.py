"""quarry: computational storage. Devices that compute, and queries that go to the data."""

import os

# Batches that arrive over Flight sit at 8-byte, not 64-byte, alignment; Arrow's Acero (used
# when DuckDB or pyarrow.dataset scan them) warns on every batch. Correctness is unaffected.
os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "ignore")
# The engine's allocator (mimalloc) hands freed memory back to the system after 10 ms; every
# engine run then faults its hash tables in again, which costs more on a virtual machine than
# the run's work (TPC-H Q18's key filter: 74 ms a run, 260 the first; 65 and 165 when memory
# is kept a second). Set before the engine loads; a device process gets it the same way.
os.environ.setdefault("MIMALLOC_PURGE_DELAY", "1000")

__all__ = ["Cluster", "connect", "local"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``quarry.local``, ``quarry.connect``, ``quarry.Cluster``, imported when first asked for:
    a device process imports only what a device needs, not the coordinator."""
    if name in ("Cluster", "connect"):
        from quarry.coordinator import cluster

        return getattr(cluster, name)
    if name == "local":
        from quarry.coordinator.processes.local import local

        return local
    raise AttributeError(f"module 'quarry' has no attribute {name!r}")
