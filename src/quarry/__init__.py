"""quarry: computational storage. Devices that compute, and queries that go to the data."""

import os

# Batches that arrive over Flight sit at 8-byte, not 64-byte, alignment; Arrow's Acero (used
# when DuckDB or pyarrow.dataset scan them) warns on every batch. Correctness is unaffected.
os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "ignore")

__all__ = ["Cluster", "connect", "local"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``quarry.local``, ``quarry.connect``, ``quarry.Cluster``, imported when first asked for:
    a device process imports only what a device needs, not the coordinator."""
    if name in ("Cluster", "connect"):
        from quarry.coordinator import cluster

        return getattr(cluster, name)
    if name == "local":
        from quarry.coordinator.local import local

        return local
    raise AttributeError(f"module 'quarry' has no attribute {name!r}")
