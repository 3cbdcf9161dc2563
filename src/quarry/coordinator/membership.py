"""Who is in a cluster and what they hold: the devices, which answer, and the catalog.

The catalog is a cache rebuilt from what the devices say they hold (no central metadata
server). Everything the coordinator does over a cluster (ingest, SQL, gene statistics,
calibration) is a function over a ``Membership``; ``quarry.coordinator.cluster.Cluster`` puts
those functions behind one handle for users.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from quarry import threads
from quarry.auth.credentials import read_private
from quarry.coordinator import catalog as catalog_module
from quarry.coordinator.catalog import DatasetEntry
from quarry.coordinator.client import DeviceClient
from quarry.coordinator.plans import Kept
from quarry.coordinator.workload import Workload
from quarry.errors import ClusterError, DatasetNotFound, DeviceUnavailable, ProtocolError
from quarry.protocol.control import HelloReply, LoadStatus, PulseReply
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


def _pulse(client: DeviceClient) -> PulseReply | None:
    """A device's pulse; None from a device that predates them (its catalog is read anew
    before every query, as it always was)."""
    try:
        return client.pulse()
    except ProtocolError:
        return None


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
        # per device, the generation its inventory was read under ("": ask again every time)
        self.generations: dict[str, str] = {}
        self.catalog_version = 0  # counts rebuilds of the catalog: plans are kept per version
        self.plans: Kept[Any] = Kept()  # planning.plan's decompositions
        self._refresh_lock = threading.Lock()
        self.refresh()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.devices)} devices, {len(self.catalog)} datasets)"

    def close(self) -> None:
        for client in self.devices.values():
            client.close()

    def each(self, call: Any) -> dict[str, Any]:
        """Call every device in parallel; a device that does not answer is recorded as down."""

        def run(name: str) -> Any:
            try:
                return call(self.devices[name])
            except DeviceUnavailable as error:
                return error

        names = sorted(self.devices)
        if len(names) == 1:  # nothing to overlap
            return {names[0]: run(names[0])}
        # on kept threads, at most PROBE_WORKERS_MAX at once: a device that takes its time
        # to answer does not hold up the others
        futures: dict[str, Any] = {}
        ready = threading.Semaphore(PROBE_WORKERS_MAX)

        def bounded(name: str) -> Any:
            try:
                return run(name)
            finally:
                ready.release()

        for name in names:
            ready.acquire()
            futures[name] = threads.submit(bounded, name, name="quarry-probe")
        return {name: future.result() for name, future in futures.items()}

    def refresh(self) -> None:
        """Rebuild the catalog from the devices' own metadata (no central metadata server)."""
        with self._refresh_lock:
            down: dict[str, str] = {}
            info = dict(self.info)
            inventories, generations = {}, {}
            partial = set()  # storage servers with drives down: what they miss is lost, for now
            for name, result in self.each(lambda c: (c.hello(), c.inventory_reply())).items():
                if isinstance(result, Exception):
                    down[name] = str(result)
                    continue
                info[name], reply = result
                inventories[name] = reply.partitions
                generations[name] = reply.generation
                if reply.drives_down:
                    partial.add(name)
            catalog = catalog_module.build(
                inventories, frozenset(down) | frozenset(partial), frozenset(self.devices)
            )
            # each replaced whole: a query planning on another thread sees one catalog or the
            # next, never half of each
            self.info, self.down, self.generations = info, down, generations
            self.catalog = catalog
            self.catalog_version += 1

    def pulse(self) -> dict[str, LoadStatus]:
        """Before a query: one call to every device says whether the catalog still holds (each
        device's generation is the one its inventory was read under, and the devices that
        answer are the ones that did); if not, it is rebuilt. Returns each answering device's
        load, which ``auto``'s cost model reads."""
        answers = self.each(_pulse)
        stale = False
        loads: dict[str, LoadStatus] = {}
        for name, answer in answers.items():
            if isinstance(answer, Exception):
                stale = stale or name not in self.down  # it stopped answering
                continue
            if answer is None or name in self.down:  # cannot tell, or it answers again
                stale = True
                continue
            known = self.generations.get(name, "")
            stale = stale or not known or answer.generation != known
            loads[name] = answer.load
        if stale:
            self.refresh()
        return loads

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
