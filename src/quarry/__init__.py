"""quarry: computational storage. Devices that compute, and queries that go to the data."""

import os

# Batches that arrive over Flight sit at 8-byte, not 64-byte, alignment; Arrow's Acero (used
# when DuckDB or pyarrow.dataset scan them) warns on every batch. Correctness is unaffected.
os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "ignore")

from quarry.coordinator.cluster import Cluster, connect
from quarry.coordinator.local import local

__all__ = ["Cluster", "connect", "local"]
__version__ = "0.1.0"
