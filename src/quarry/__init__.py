"""quarry: computational storage. Devices that compute, and queries that go to the data."""

from quarry.coordinator.cluster import Cluster, connect
from quarry.coordinator.local import local

__all__ = ["Cluster", "connect", "local"]
__version__ = "0.1.0"
