"""Who is in a cluster and what they hold: the devices, which answer, and the catalog.

The catalog is a cache rebuilt from what the devices say they hold (no central metadata
server). Everything the coordinator does over a cluster (ingest, SQL, gene statistics,
calibration) is a function over a ``Membership``; ``quarry.coordinator.cluster.Cluster`` puts
those functions behind one handle for users.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
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
# ``auto``'s cost model reads each device's load: one a pulse said this recently is as good as
# a new one (a device's load is its slots' use over the last two seconds, BUSY_WINDOW_S), so a
# query need not wait for its own pulse to choose its cut
LOADS_FRESH_S = 0.5


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


class CatalogCheck:
    """Whether the catalog a query planned on still holds, asked of every device at once (its
    pulse: a generation that changes whenever what it holds may have) while the query goes on.

    The catalog holds if every device that answered when it was read answers now with the
    generation it was read under, the devices that did not still do not, and no one read it
    again meanwhile (its version). If it does not hold, ``holds`` reads it again, so the caller
    plans on the new one."""

    def __init__(self, cluster: Membership, version: int, answers: dict[str, Future] | None):
        self.cluster = cluster
        self.version = version
        self._answers = answers  # None: answered already (the catalog was just read)
        self._held: bool | None = True if answers is None else None
        self._loads: dict[str, LoadStatus] = {}
        self.waited_s = 0.0  # how long ``holds`` waited for the answers

    def holds(self) -> bool:
        if self._held is None:
            started = time.perf_counter()
            assert self._answers is not None
            answers = {name: future.result() for name, future in self._answers.items()}
            self.waited_s = time.perf_counter() - started
            stale, self._loads = self.cluster.compare(answers)
            self.cluster.loads_taken(self._loads)
            if stale and self.cluster.catalog_version == self.version:
                self.cluster.refresh()
            self._held = not stale and self.cluster.catalog_version == self.version
        return self._held

    def loads(self) -> dict[str, LoadStatus]:
        """Each answering device's load (waits for the answers)."""
        self.holds()
        return self._loads


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
        self._loads: tuple[float, dict[str, LoadStatus]] | None = None  # (when, loads)
        self.refresh()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.devices)} devices, {len(self.catalog)} datasets)"

    def close(self) -> None:
        for client in self.devices.values():
            client.close()

    def each(self, call: Any) -> dict[str, Any]:
        """Call every device in parallel; a device that does not answer is recorded as down."""
        return {name: future.result() for name, future in self.each_started(call).items()}

    def each_started(self, call: Any) -> dict[str, Future]:
        """``each``, under way: per device a future of its answer (or of the
        ``DeviceUnavailable`` it raised), at most ``PROBE_WORKERS_MAX`` calls at once, so a
        device that takes its time to answer does not hold up the others."""
        futures: dict[str, Future] = {name: Future() for name in sorted(self.devices)}

        def run(name: str) -> None:
            future = futures[name]
            try:
                future.set_result(call(self.devices[name]))
            except DeviceUnavailable as error:
                future.set_result(error)
            except BaseException as error:
                future.set_exception(error)

        if len(futures) == 1:  # nothing to overlap: this thread asks
            run(next(iter(futures)))
        else:
            tasks = [(lambda name=name: run(name)) for name in futures]
            threads.lanes(tasks, PROBE_WORKERS_MAX, "quarry-probe")
        return futures

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
            # each replaced whole, the version last: a query planning on another thread sees
            # one catalog or the next, never half of each, and never a newer version number
            # over an older catalog (plans are kept per version)
            self.info, self.down, self.generations = info, down, generations
            self.catalog = catalog
            self.catalog_version += 1

    def check(self) -> CatalogCheck:
        """A pulse of every device, under way while a query plans on the catalog as it is and
        its devices start (``CatalogCheck``); nothing of the query is let out before it says
        that catalog holds."""
        return CatalogCheck(self, self.catalog_version, self.each_started(_pulse))

    def checked(self) -> CatalogCheck:
        """A check already answered: the catalog was just read from the devices."""
        return CatalogCheck(self, self.catalog_version, None)

    def pulse(self) -> dict[str, LoadStatus]:
        """The catalog checked now (read again if it does not hold); every answering device's
        load."""
        check = self.check()
        check.holds()
        return check.loads()

    def recent_loads(self) -> dict[str, LoadStatus] | None:
        """The devices' loads from a pulse at most ``LOADS_FRESH_S`` old, or None."""
        taken = self._loads
        if taken is None or time.monotonic() - taken[0] > LOADS_FRESH_S:
            return None
        return taken[1]

    def forget_loads(self) -> None:
        """A load was just started on a device: the next query asks again."""
        self._loads = None

    def compare(self, answers: dict[str, Any]) -> tuple[bool, dict[str, LoadStatus]]:
        """Pulses against the catalog: whether it is stale, and each answering device's
        load."""
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
        return stale, loads

    def loads_taken(self, loads: dict[str, LoadStatus]) -> None:
        self._loads = (time.monotonic(), loads)

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
