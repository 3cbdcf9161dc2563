"""Starting the endpoint: ``quarry serve`` and ``quarry up --flight-sql-port``.

The endpoint reads the cluster file as any client does (the devices' addresses, their CA under
TLS, the host's profile) and, when the file names the cluster's authority, the public key that
checks tokens (and the revocation list as it starts), to refuse a bad token at the door;
without it the devices refuse it.
Off loopback it must use TLS, as devices must: tokens must not cross a network in the clear.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from quarry.auth.credentials import Credentials, read_private
from quarry.auth.revocation import Revocations, Verifier
from quarry.coordinator.cluster import connect
from quarry.coordinator.membership.cluster_file import DeviceSpec
from quarry.errors import ClusterError
from quarry.flightsql.server import FlightSqlServer
from quarry.flightsql.sessions import Sessions
from quarry.flightsql.statements import QUERY_SECONDS_MAX_DEFAULT, Statements
from quarry.pushdown import Pushdown

log = logging.getLogger("quarry.flightsql")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
NAME = "flight-sql"


@dataclass(frozen=True)
class Options:
    host: str = "127.0.0.1"
    port: int = 0
    tls: bool = False  # with the cluster's certificate, or these:
    tls_cert: Path | None = None
    tls_key: Path | None = None
    pushdown: Pushdown = Pushdown.AUTO
    query_seconds_max: float = QUERY_SECONDS_MAX_DEFAULT


def start(cluster_file: str | Path, options: Options = Options()) -> FlightSqlServer:
    """An endpoint listening (``server.port``) in front of the cluster the file names; it
    serves on gRPC's threads until ``shutdown``."""
    spec = _cluster_spec(cluster_file)
    credentials = _credentials(spec)
    tls = _tls(options, credentials)
    if options.host not in LOOPBACK and tls is None:
        raise ClusterError(
            f"a Flight SQL endpoint listening on {options.host} must use TLS (--tls, or "
            "--tls-cert and --tls-key): only loopback may be plain"
        )
    if credentials is None:
        log.warning("no credentials in %s: tokens are checked by the devices only", cluster_file)
    scheme = "grpc+tls" if tls else "grpc"
    return FlightSqlServer(
        f"{scheme}://{options.host}:{options.port}",
        Sessions(spec, source=str(cluster_file)),
        verifier=_verifier(credentials),
        statements=Statements(options.query_seconds_max),
        pushdown=options.pushdown,
        tls=tls,
    )


def serve(
    cluster_file: str | Path, options: Options = Options(), ready_file: Path | None = None
) -> None:
    """Run the endpoint until it is stopped (SIGTERM / SIGINT)."""
    from quarry.device.server import write_ready

    server = start(cluster_file, options)
    address = f"{server.scheme}://{options.host}:{server.port}"
    if ready_file is not None:
        write_ready(ready_file, address, server.port, NAME)
    log.info("flight sql endpoint on %s for %s", address, cluster_file)
    try:
        server.serve()
    finally:
        server.shutdown()


def _cluster_spec(cluster_file: str | Path) -> tuple[DeviceSpec, ...]:
    """The file's devices, once they have answered (and the host profile it names applied)."""
    with connect(cluster_file) as cluster:
        return cluster.specs


def _verifier(credentials: Credentials | None) -> Verifier | None:
    """The authority's public key and its revocation list: the endpoint holds nothing that
    signs."""
    if credentials is None:
        return None
    key = credentials.verify_key()
    return Verifier(key, Revocations(key, initial=credentials.revocations()))


def _credentials(spec: tuple[DeviceSpec, ...]) -> Credentials | None:
    folder = next((d.credentials for d in spec if d.credentials), None)
    return Credentials(Path(folder)) if folder else None


def _tls(options: Options, credentials: Credentials | None) -> tuple[bytes, bytes] | None:
    if options.tls_cert is not None or options.tls_key is not None:
        if options.tls_cert is None or options.tls_key is None:
            raise ClusterError("give both --tls-cert and --tls-key")
        return read_private(options.tls_cert), read_private(options.tls_key)
    if not options.tls:
        return None
    if credentials is None:
        raise ClusterError(
            "--tls uses the cluster's certificate, and this cluster file names no credentials: "
            "give --tls-cert and --tls-key"
        )
    return read_private(credentials.cert_file), read_private(credentials.key_file)
