"""The devices' revocation lists, kept up to date from the admin's machine.

The cluster's list is signed and kept in the authority's folder (``Credentials.revoked_file``);
a coordinator whose cluster file names that folder pushes it (``revoke``, admin role) to the
devices: ``quarry token revoke`` to every device at once, and each catalog read
(``Membership.refresh``) to a device whose hello says it holds an older list or asks fewer
peers than the file lists. A push names the file's other servers, at any depth, as the
device's peers: the devices it asks for a newer list on its own (``device.revocation_sync``),
so one that misses a push still learns it within ``QUARRY_REVOCATION_SYNC_S``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from quarry.auth.credentials import Credentials
from quarry.coordinator.membership.cluster_file import DeviceSpec
from quarry.coordinator.membership.device_client import DeviceClient
from quarry.errors import QuarryError
from quarry.protocol.control import HelloReply, RevocationList, RevocationPush, RevocationsHeld

log = logging.getLogger("quarry.coordinator")
PUSHES_AT_ONCE = 16


def every(specs: Iterable[DeviceSpec]) -> tuple[DeviceSpec, ...]:
    """Every server a cluster file lists: the host's devices, then what is behind each."""
    found: list[DeviceSpec] = []
    for spec in specs:
        found.append(spec)
        found.extend(every(spec.drives))
    return tuple(found)


def authority_of(specs: Iterable[DeviceSpec]) -> Credentials | None:
    """The authority a cluster file names (the admin's machine), if it holds a revocation
    list; None for a file handed out to someone else."""
    for spec in specs:
        if spec.credentials:
            found = Credentials(Path(spec.credentials))
            if found.revoked_file.exists():
                return found
    return None


def push(
    clients: Mapping[str, DeviceClient], held: RevocationList, addresses: Mapping[str, str]
) -> dict[str, RevocationsHeld | QuarryError]:
    """Push ``held`` to every client, each told the others of ``addresses`` as its peers;
    per device what it holds now, or the error that kept it from taking the list."""

    def one(name: str) -> RevocationsHeld | QuarryError:
        peers = tuple(a for n, a in sorted(addresses.items()) if n != name)
        try:
            return clients[name].push_revocations(RevocationPush(held, peers))
        except QuarryError as error:
            return error

    names = sorted(clients)
    if not names:
        return {}
    with ThreadPoolExecutor(min(PUSHES_AT_ONCE, len(names)), "quarry-revoke") as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


def bring_up_to_date(
    specs: Iterable[DeviceSpec],
    clients: Mapping[str, DeviceClient],
    answered: Mapping[str, HelloReply],
) -> None:
    """Push the authority's list to the devices that ``answered`` a hello showing an older list
    or fewer peers than the file lists; nothing when the file names no authority. A device
    that refuses is left as it is (logged): its peers or the next read try again."""
    specs = tuple(specs)
    authority = authority_of(specs)
    if authority is None:
        return
    addresses = {spec.name: spec.address for spec in every(specs)}
    peers_wanted = len(addresses) - 1
    try:
        held = authority.revocations()
    except QuarryError as error:
        log.warning("revocations not pushed: %s", error)
        return
    behind = {
        name: clients[name]
        for name, hello in answered.items()
        if name in clients and (hello.revocations < held.version or hello.peers < peers_wanted)
    }
    for name, result in push(behind, held, addresses).items():
        if isinstance(result, QuarryError):
            log.warning("%s did not take revocation list %d: %s", name, held.version, result)
