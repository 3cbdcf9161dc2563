"""A running device joins a cluster (``quarry device add``): who it is, checked both ways, before
the cluster file names it.

The cluster's client calls the device's hello with the cluster's token, over TLS when its
address says so, checking the device's certificate against the cluster's CA; the device checks
the token. Only a device that passes both, says the name it is added under and is not already a
member is given its entry: the credentials the other entries use, and the failure domain it
says it is in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from quarry.auth.credentials import Credentials
from quarry.coordinator.membership.cluster_file import DeviceSpec
from quarry.coordinator.membership.membership import client_of
from quarry.errors import ClusterError, DeviceUnavailable, Unauthenticated
from quarry.protocol.control import HelloReply

TLS_SCHEME = "grpc+tls://"


def introduce(
    members: Sequence[DeviceSpec],
    address: str,
    name: str | None = None,
    known: Mapping[str, HelloReply] | None = None,
) -> DeviceSpec:
    """The cluster-file entry of the device listening at ``address``, once it answered this
    cluster's token with a certificate the cluster's CA signed (over TLS); ``known``: the
    members' hellos, so a device already in the cluster under another name is refused."""
    if not address.startswith(("grpc://", TLS_SCHEME)):
        raise ClusterError(f"{address!r} is not a device address: grpc+tls://HOST:PORT")
    spec = _with_credentials(members, address, name or "joining")
    client = client_of(spec)
    try:
        hello = client.hello()
    except Unauthenticated as error:
        raise ClusterError(
            f"the device at {address} refused this cluster's token ({error}): it checks "
            "another cluster's credentials"
        ) from None
    except DeviceUnavailable as error:
        checked = " with a certificate this cluster's CA signed" if _tls(address) else ""
        raise ClusterError(f"no device answers at {address}{checked}: {error}") from None
    finally:
        client.close()
    if name is not None and hello.name != name:
        raise ClusterError(
            f"the device at {address} calls itself {hello.name!r}, not {name!r}: add it as "
            f"{hello.name!r}, or start it with --name {name}"
        )
    for member, info in (known or {}).items():
        if info.id == hello.id:
            raise ClusterError(f"the device at {address} is already in the cluster as {member}")
    return replace(spec, name=hello.name, host=hello.host or None, rack=hello.rack or None)


def founding(authority: Path, address: str, name: str | None = None) -> DeviceSpec:
    """The entry of a cluster's first device (``quarry device add`` where no cluster file is
    yet: after ``quarry init``), checked both ways as every later one is, proving itself with
    the authority's admin token and CA."""
    credentials = Credentials(authority)
    if not credentials.admin_token_file.exists():
        raise ClusterError(
            f"no cluster file yet, and no cluster authority in {authority}: run `quarry init` "
            "(or pass --folder, or --cluster FILE of a cluster)"
        )
    template = DeviceSpec(
        name="authority",
        address=address,
        credentials=str(credentials.folder),
        token_file=str(credentials.admin_token_file),
        ca_file=str(credentials.ca_file),
    )
    return introduce([template], address, name)


def _tls(address: str) -> bool:
    return address.startswith(TLS_SCHEME)


def _with_credentials(members: Sequence[DeviceSpec], address: str, name: str) -> DeviceSpec:
    """An entry for ``address`` proving itself as the members' entries do (their token, their
    credentials folder), with the CA a TLS certificate must chain to."""
    template = next((m for m in members if m.token or m.token_file), None)
    if template is None:
        return DeviceSpec(name=name, address=address)
    ca_file = template.ca_file
    if ca_file is None and template.credentials:
        ca_file = str(Credentials(Path(template.credentials)).ca_file)
    if _tls(address) and ca_file is None:
        raise ClusterError(
            f"{address} is a TLS address, but the cluster file names no CA to check the "
            "device's certificate against"
        )
    return DeviceSpec(
        name=name,
        address=address,
        credentials=template.credentials,
        token=template.token,
        token_file=template.token_file,
        ca_file=ca_file if _tls(address) else None,
    )
