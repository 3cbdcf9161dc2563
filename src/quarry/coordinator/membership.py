"""Who is in a cluster and what they hold: the devices, which answer, and the catalog.

The catalog is a cache rebuilt from what the devices say they hold (no central metadata
server). Everything the coordinator does over a cluster (ingest, SQL, gene statistics,
calibration) is a function over a ``Membership``; ``quarry.coordinator.cluster.Cluster`` puts
those functions behind one handle for users.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from quarry.auth.credentials import read_private
from quarry.coordinator import catalog as catalog_module
from quarry.coordinator.catalog import DatasetEntry
from quarry.coordinator.client import DeviceClient
from quarry.coordinator.workload import Workload
from quarry.errors import ClusterError, DatasetNotFound, DeviceUnavailable
from quarry.protocol.control import HelloReply
from quarry.store import naming

PROBE_WORKERS_MAX = 16


def client_of(spec: dict[str, Any]) -> DeviceClient:
    """A device's client from its cluster-file entry, with the credentials the entry names: a
    token inline or in a file (owner-readable), and the CA its TLS certificate must chain to."""
    token = spec.get("token")
    if token is None and spec.get("token_file"):
        token = read_private(Path(spec["token_file"])).decode().strip()
    root_ca = read_private(Path(spec["ca_file"])) if spec.get("ca_file") else None
    return DeviceClient(spec["name"], spec["address"], token=token, root_ca=root_ca)


class Membership:
    def __init__(self, devices: list[dict[str, Any]], source: str | None = None):
        if not devices:
            raise ClusterError("a cluster needs at least one device")
        names = [d["name"] for d in devices]
        if len(set(names)) != len(names):
            raise ClusterError(f"device names must be unique, got {names}")
        self.spec = devices
        self.source = source
        self.devices = {d["name"]: client_of(d) for d in devices}
        self.down: dict[str, str] = {}
        self.info: dict[str, HelloReply] = {}
        self.catalog: dict[str, DatasetEntry] = {}
        self.calibration_cache: dict[str, dict[str, Any]] = {}
        self.figures_cache: dict[tuple[bytes, str], Any] = {}  # auto's sampled sub-plan costs
        self.workload = Workload()  # the host's turns for long queries
        self.refresh()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.devices)} devices, {len(self.catalog)} datasets)"

    def close(self) -> None:
        for client in self.devices.values():
            client.close()

    def each(self, call: Any) -> dict[str, Any]:
        """Call every device in parallel; a device that does not answer is recorded as down."""
        results: dict[str, Any] = {}

        def run(name: str) -> tuple[str, Any]:
            try:
                return name, call(self.devices[name])
            except DeviceUnavailable as error:
                return name, error

        with ThreadPoolExecutor(max_workers=min(PROBE_WORKERS_MAX, len(self.devices))) as pool:
            for name, result in pool.map(run, sorted(self.devices)):
                results[name] = result
        return results

    def refresh(self) -> None:
        """Rebuild the catalog from the devices' own metadata (no central metadata server)."""
        inventories = {}
        self.down = {}
        partial = set()  # storage servers with drives down: what they miss is lost, for now
        for name, result in self.each(lambda c: (c.hello(), c.inventory_reply())).items():
            if isinstance(result, Exception):
                self.down[name] = str(result)
                continue
            self.info[name], reply = result
            inventories[name] = reply.partitions
            if reply.drives_down:
                partial.add(name)
        self.catalog = catalog_module.build(
            inventories, frozenset(self.down) | frozenset(partial), frozenset(self.devices)
        )

    def live_devices(self) -> list[DeviceClient]:
        return [c for n, c in sorted(self.devices.items()) if n not in self.down]

    def device(self, name: str) -> DeviceClient:
        if name not in self.devices:
            raise ClusterError(f"no device named {name!r}; devices are {sorted(self.devices)}")
        return self.devices[name]

    def entry(self, dataset: str) -> DatasetEntry:
        domain, name = naming.split_dataset(dataset)
        entry = self.catalog.get(f"{domain}/{name}")
        if entry is None:
            self.refresh()
            entry = self.catalog.get(f"{domain}/{name}")
        if entry is None:
            known = ", ".join(self.catalog) or "none"
            raise DatasetNotFound(f"no dataset {domain}/{name}; datasets are: {known}")
        return entry
