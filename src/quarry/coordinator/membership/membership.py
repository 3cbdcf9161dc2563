"""Who is in a cluster and what they hold: the devices, which answer, and the catalog.

The catalog is a cache rebuilt from what the devices say they hold (no central metadata
server). Everything the coordinator does over a cluster (ingest, SQL, gene statistics,
calibration) is a function over a ``Membership``; ``quarry.coordinator.cluster.Cluster`` puts
those functions behind one handle for users.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from quarry import threads
from quarry.auth.credentials import Credentials, read_private
from quarry.coordinator.admin import revocations
from quarry.coordinator.membership import catalog as catalog_module
from quarry.coordinator.membership.catalog import DatasetEntry
from quarry.coordinator.membership.cluster_file import ClusterFile, DeviceSpec
from quarry.coordinator.membership.device_client import DeviceClient
from quarry.coordinator.membership.freshness import CatalogCheck, CatalogState, Loads
from quarry.coordinator.membership.placement import Domain
from quarry.coordinator.query.host_admission import Workload
from quarry.coordinator.query.plan_cache import Kept
from quarry.coordinator.query.settled_cuts import Settled
from quarry.errors import (
    ClusterError,
    DatasetNotFound,
    DeviceSilent,
    DeviceUnavailable,
    ProtocolError,
    QuarryError,
)
from quarry.protocol.control import (
    CalibrationReport,
    HelloReply,
    InventoryReply,
    LoadStatus,
    PulseReply,
)
from quarry.store import naming

PROBE_WORKERS_MAX = 16
# sampled slices kept (one per dataset version a query planned over lately): a TPC-H lineitem
# slice of every column is about 5 MB
SAMPLE_SLICES_KEPT_MAX = 16
# partitions' descriptions and datasets' value spans kept (what the join filters judge a key
# set's share by, asked for every query): a few kB each
DESCRIPTIONS_KEPT_MAX = 1024
# ``auto``'s cost model reads each device's load: one a pulse said this recently is as good as
# a new one (a device's load is its slots' use over the last two seconds, BUSY_WINDOW_S), so a
# query need not wait for its own pulse to choose its cut
LOADS_FRESH_S = 0.5
RECONCILED_KEPT_MAX = 4096  # commits sent to devices that missed them, remembered (``_reconcile``)

T = TypeVar("T")


def client_of(spec: DeviceSpec) -> DeviceClient:
    """A device's client from its cluster-file entry, with the credentials the entry names: a
    token inline or in a file (owner-readable), the CA its TLS certificate must chain to, and
    on the admin's machine (the entry names the authority) the certificate this side shows."""
    token = spec.token
    if token is None and spec.token_file:
        token = read_private(Path(spec.token_file)).decode().strip()
    root_ca = read_private(Path(spec.ca_file)) if spec.ca_file else None
    identity = None
    if root_ca is not None and spec.credentials:
        identity = Credentials(Path(spec.credentials)).host_identity()
    return DeviceClient(spec.name, spec.address, token=token, root_ca=root_ca, identity=identity)


def _stamp(source: str | None) -> tuple[int, int] | None:
    """When a cluster file was last written, and its size (None: no file, or none to read)."""
    if source is None:
        return None
    try:
        found = os.stat(source)
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size


def _read_device(client: DeviceClient) -> tuple[HelloReply, InventoryReply]:
    """Who a device is and what it holds, for ``refresh``."""
    _not_silent(client)
    return client.hello(), client.inventory_reply()


def _not_silent(client: DeviceClient) -> None:
    """A device whose heartbeat went silent is not asked (each call would wait out the silence
    bound): it is down until its heartbeat answers again, and that reads the catalog again
    (``Membership.settle``)."""
    if client.heartbeat.silent:
        raise client.liveness.silent(client.name, client.address, " (its heartbeat stopped)")


def _pulse(client: DeviceClient) -> PulseReply | None:
    """A device's pulse; None from a device that predates them (its catalog is read anew
    before every query, as it always was)."""
    _not_silent(client)
    try:
        return client.pulse()
    except ProtocolError:
        return None


class Membership:
    def __init__(self, devices: Sequence[DeviceSpec], source: str | None = None):
        """``devices``: their cluster-file entries (``ClusterFile.devices``); ``source``: the
        file they came from, if any."""
        if not devices:
            raise ClusterError("a cluster needs at least one device")
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            raise ClusterError(f"device names must be unique, got {names}")
        self.specs = tuple(devices)
        self.source = source
        self.devices = {d.name: client_of(d) for d in devices}
        self._file_stamp = _stamp(source)  # the cluster file as it was when read
        # the catalog and what it was read from, replaced whole by ``refresh`` (freshness.py)
        self.state = CatalogState()
        # each device's stored calibration, read once (None: it has none)
        self.calibration_cache: dict[str, CalibrationReport | None] = {}
        self.figures_cache: dict[tuple[bytes, str], Any] = {}  # auto's sampled sub-plan costs
        self.settled = Settled()  # auto: where the devices settled past the model's cut
        self.workload = Workload()  # the host's turns for long queries
        self.plans: Kept[Any] = Kept()  # planning.plan's decompositions, per catalog version
        self.slices: Kept[Any] = Kept(SAMPLE_SLICES_KEPT_MAX)  # figures.sample_slice's
        self.descriptions: Kept[Any] = Kept(DESCRIPTIONS_KEPT_MAX)  # cost_inputs.described's
        self.loads = Loads()  # each device's last said load
        self._refresh_lock = threading.Lock()
        # devices whose heartbeat went silent or answered again since the catalog was read:
        # the next query reads it again first (``settle``)
        self._liveness_changed: set[str] = set()
        self._liveness_lock = threading.Lock()
        # commits sent to devices that missed them, by device and generation: sent once
        self._reconciled: set[tuple[str, str, str]] = set()
        for client in self.devices.values():
            client.heartbeat.listen(self._heard)
        self.refresh()

    # the parts of the current state, as every function over a cluster reads them
    @property
    def catalog(self) -> dict[str, DatasetEntry]:
        return self.state.catalog

    @property
    def info(self) -> dict[str, HelloReply]:
        return self.state.info

    @property
    def down(self) -> dict[str, str]:
        return self.state.down

    @property
    def catalog_version(self) -> int:
        return self.state.version

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.devices)} devices, {len(self.catalog)} datasets)"

    def close(self) -> None:
        for client in self.devices.values():
            client.close()

    def each(self, call: Callable[[DeviceClient], T]) -> dict[str, T | DeviceUnavailable]:
        """Call every device in parallel; a device that does not answer is recorded as down."""
        if len(self.devices) == 1:  # nothing to overlap: this thread asks
            ((name, client),) = self.devices.items()
            try:
                return {name: call(client)}
            except DeviceUnavailable as error:
                return {name: error}
        return {name: future.result() for name, future in self.each_started(call).items()}

    def each_started(
        self, call: Callable[[DeviceClient], T], names: list[str] | None = None
    ) -> dict[str, Future[T | DeviceUnavailable]]:
        """``each``, under way (over ``names``, all by default): per device a future of its
        answer (or of the ``DeviceUnavailable`` it raised), at most ``PROBE_WORKERS_MAX`` calls
        at once, so a device that takes its time to answer does not hold up the others."""
        names = sorted(self.devices) if names is None else names
        futures: dict[str, Future[T | DeviceUnavailable]] = {name: Future() for name in names}

        def run(name: str) -> None:
            future = futures[name]
            try:
                future.set_result(call(self.devices[name]))
            except DeviceUnavailable as error:
                future.set_result(error)
            except BaseException as error:
                future.set_exception(error)

        tasks = [(lambda name=name: run(name)) for name in futures]
        threads.lanes(tasks, PROBE_WORKERS_MAX, "quarry-probe")
        return futures

    def refresh(self) -> None:
        """Rebuild the catalog from the devices' own metadata (no central metadata server),
        over the devices the cluster file lists now (``_reread``)."""
        with self._refresh_lock:
            self._reread()
            down: dict[str, str] = {}
            silent: set[str] = set()
            info = dict(self.info)
            answered: dict[str, HelloReply] = {}
            inventories, generations = {}, {}
            partial = set()  # storage servers with drives down: what they miss is lost, for now
            for name, result in self.each(_read_device).items():
                if isinstance(result, Exception):
                    down[name] = str(result)
                    if isinstance(result, DeviceSilent) or self.devices[name].heartbeat.silent:
                        silent.add(name)
                    continue
                answered[name], reply = result
                info[name] = answered[name]
                inventories[name] = reply.partitions
                generations[name] = reply.generation
                if reply.drives_down:
                    partial.add(name)
            self._reconcile(inventories, generations)
            catalog = catalog_module.build(
                inventories, frozenset(down) | frozenset(partial), frozenset(self.devices)
            )
            self.state = CatalogState(
                self.state.version + 1, catalog, info, down, generations, frozenset(silent)
            )
        # a device back from a partition or a restart may have missed a revocation
        revocations.bring_up_to_date(self.specs, self.devices, answered)

    def _reread(self) -> None:
        """The cluster file changed since it was read (a device added, drained or removed, by
        this process or another): its devices from now on. Partitions move to devices added
        after this handle was opened; without them its catalog would miss those partitions.
        Clients are replaced whole, never closed under a query that holds one."""
        stamp = _stamp(self.source)
        if self.source is None or stamp is None or stamp == self._file_stamp:
            return
        try:
            listed = ClusterFile.read(self.source).devices
        except ClusterError:
            return  # half-edited by hand, or gone: the devices as they were
        self._file_stamp = stamp
        if not listed:
            return
        known = {spec.name: spec for spec in self.specs}
        devices = {}
        for spec in listed:
            old = known.get(spec.name)
            same = old is not None and old.address == spec.address and spec.name in self.devices
            devices[spec.name] = self.devices[spec.name] if same else self._client(spec)
        self.specs = listed
        self.devices = devices

    def _client(self, spec: DeviceSpec) -> DeviceClient:
        """A client for a device the cluster file lists anew, its heartbeat heard here."""
        client = client_of(spec)
        client.heartbeat.listen(self._heard)
        return client

    def _reconcile(self, inventories: dict[str, list], generations: dict[str, str]) -> None:
        """A device back from a partition may have missed an ingest's commit (its lease has
        not run out yet: it holds the partitions pending): commit them on it now, as its own
        janitor would ask the decider to, before the catalog is built on what it lists (else a
        committed dataset would read as unfinished until then). Each once per generation."""
        for name, ingest_ids in catalog_module.missed_commits(inventories).items():
            asked = {(name, generations.get(name, ""), i) for i in ingest_ids} - self._reconciled
            if not asked:
                continue
            if len(self._reconciled) > RECONCILED_KEPT_MAX:  # a bound: at worst, asked again
                self._reconciled = set()
            self._reconciled |= asked
            client = self.devices[name]
            for _, _, ingest_id in sorted(asked):
                with contextlib.suppress(QuarryError):  # unfinished there, or gone: nothing
                    client.commit(ingest_id)
            with contextlib.suppress(QuarryError):
                reply = client.inventory_reply()
                inventories[name], generations[name] = reply.partitions, reply.generation

    def _heard(self, name: str, silent: bool) -> None:
        """A device's heartbeat went silent, or answered again (from its heartbeat thread)."""
        with self._liveness_lock:
            self._liveness_changed.add(name)

    def settle(self) -> None:
        """Read the catalog again if a device went silent or answered again since it was read:
        before a query plans, so that a partition costs one query at most the silence bound
        and a healed device serves again, with what it missed reconciled (``_reconcile``)."""
        with self._liveness_lock:
            changed = self._liveness_changed
            self._liveness_changed = set()
        known = self.state.silent
        # a device that answers again, or went silent where the catalog does not say so
        if any(not self.devices[n].heartbeat.silent or n not in known for n in changed):
            self.refresh()

    def check(
        self, devices: Iterable[str] | None = None, state: CatalogState | None = None
    ) -> CatalogCheck:
        """Pulses of ``devices`` (all by default) against ``state`` (the current one by
        default), under way while a query goes on (``CatalogCheck``); none asked: a check that
        holds."""
        names = sorted(self.devices if devices is None else devices)
        answers = self.each_started(_pulse, names) if names else None
        return CatalogCheck(self, state or self.state, answers)

    def checked(self) -> CatalogCheck:
        """A check already answered: the catalog was just read from the devices."""
        return CatalogCheck(self, self.state, None)

    def loads_seen(self, loads: dict[str, LoadStatus]) -> None:
        self.loads.seen(loads)

    def recent_loads(self) -> dict[str, LoadStatus] | None:
        """Every live device's load as it said it at most ``LOADS_FRESH_S`` ago, or None."""
        return self.loads.recent([c.name for c in self.live_devices()], LOADS_FRESH_S)

    def forget_loads(self) -> None:
        """A load was just started on a device: the next query asks again."""
        self.loads.forget()

    def live_devices(self) -> list[DeviceClient]:
        return [c for n, c in sorted(self.devices.items()) if n not in self.down]

    @property
    def drained(self) -> frozenset[str]:
        """Devices ``quarry device drain`` emptied: they take nothing new."""
        return frozenset(spec.name for spec in self.specs if spec.drained)

    def placing_devices(self) -> list[DeviceClient]:
        """The devices new partitions may go to: those that answer and are not drained."""
        return [c for c in self.live_devices() if c.name not in self.drained]

    def domains(self) -> dict[str, Domain]:
        """Every device's failure domain: as its hello says it, else as the cluster file
        does, else a host of its own (a device that says nothing shares no domain)."""
        found = {}
        for spec in self.specs:
            info = self.info.get(spec.name)
            host = (info.host if info else "") or spec.host or spec.name
            rack = (info.rack if info else "") or spec.rack or ""
            found[spec.name] = Domain(host, rack)
        return found

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
            down = ""
            if self.down:  # a small dataset lives on few devices, maybe only on these
                down = f" ({', '.join(sorted(self.down))} do not answer: they may hold it)"
            raise DatasetNotFound(f"no dataset {domain}/{name}; datasets are: {known}{down}")
        return entry
