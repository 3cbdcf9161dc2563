"""Three storage hosts deployed from the command line (docs/deploy.md), each device with a
folder of its own: data stored with replicas answers as DuckDB does; nothing on a storage
host can mint a token; tokens expire and can be revoked, and a device that was down when a
token was revoked learns it from its peers within the stated bound. Each host in a network
namespace of its own on its own address (``quarry.netns``) where root, `ip` and `tc` are
here, on loopback where they are not (the same steps; one of the two, not both, to keep the
suite short): from the command line only (``deployment.deploy``)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import subprocess
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import quarry
from quarry import netns
from quarry.auth.tokens import Role, read_claims
from quarry.coordinator.membership.device_client import DeviceClient
from quarry.device.peers import ASK_TIMEOUT_S, PeerCredentials, ask_revocations
from quarry.errors import DeviceUnavailable, Forbidden, QuarryError, Unauthenticated
from quarry.samples import particles
from tests.integration.deployment import Deployment, Host, deploy
from tests.plan.harness import assert_same_rows, duckdb_answer

pytestmark = pytest.mark.slow

ADDRESSES = ["127.0.0.1", "127.0.0.1", "127.0.0.1"]
RACKS = ["r1", "r1", "r2"]
SYNC_S = 1.0  # QUARRY_REVOCATION_SYNC_S for these devices
# docs/security.md: a device that missed a push refuses the token within a sync period and a
# call's timeout of reaching a peer that has the list
REVOCATION_BOUND_S = SYNC_S + ASK_TIMEOUT_S
ROWS = 30_000


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """The steps with each storage host in a network namespace of its own on its own address,
    or on loopback where namespaces cannot be made (``netns.missing`` says why, once)."""
    root = tmp_path_factory.mktemp("deploy")
    env = {"QUARRY_REVOCATION_SYNC_S": str(SYNC_S), "QUARRY_FAULT_FILE": str(root / "faults")}
    with contextlib.ExitStack() as stack:
        if (reason := netns.missing()) is not None:
            print(f"deploy: on loopback, not namespaces: {reason}")
            deployment = deploy(root, ADDRESSES, RACKS, env=env)
        else:
            network = _network(stack)
            links = [network.add(f"dev{i}") for i in range(len(ADDRESSES))]
            prefix = lambda host: network.exec_prefix(host.name)  # noqa: E731
            deployment = deploy(root, [link.address for link in links], RACKS, prefix, env)
        stack.callback(deployment.close)
        yield from _loaded(deployment, root)


def _network(stack: contextlib.ExitStack) -> netns.Network:
    return stack.enter_context(contextlib.closing(netns.Network()))


def _loaded(deployment: Deployment, root):
    table = particles.table(ROWS, seed=7)
    source = root / "particles.parquet"
    pq.write_table(table, source)
    cluster = str(deployment.cluster_file)
    deployment.quarry("ingest", str(source), "--dataset", "lab/particles", "--replicas", "2",
                      "--partitions", "6", "--cluster", cluster)  # fmt: skip
    yield deployment, table


def _client(deployment: Deployment, host: Host, token: str) -> DeviceClient:
    """A caller from the admin's machine (its CA and certificate) with ``token``."""
    authority = deployment.authority
    identity = ((authority / "host.pem").read_bytes(), (authority / "host.key").read_bytes())
    root_ca = (authority / "ca.pem").read_bytes()
    return DeviceClient(host.name, host.url, 10, token, root_ca, identity)


def _token(deployment: Deployment, *args: str) -> str:
    done = deployment.quarry("token", "create", *args, "--cluster", str(deployment.cluster_file))
    return done.stdout.strip()


def test_three_hosts_store_with_replicas_and_answer_as_duckdb(deployed):
    deployment, table = deployed
    file = str(deployment.cluster_file)
    with quarry.connect(deployment.cluster_file) as cluster:
        entry = cluster.entry("lab/particles")
        assert all(len(p.devices) == 2 for p in entry.partitions)
        assert {d for p in entry.partitions for d in p.devices} == {"dev0", "dev1", "dev2"}
        for sql, ordered in (
            ("SELECT count(*) AS n, sum(ke) AS s FROM particles WHERE ke > 1.0", False),
            (
                "SELECT CAST(floor(x / 25) AS BIGINT) AS b, count(*) AS n, avg(ke) AS a "
                "FROM particles GROUP BY 1 ORDER BY 1",
                True,
            ),
        ):
            expected = duckdb_answer(table, "particles", sql)
            actual = cluster.sql(sql).read_all()
            assert_same_rows(actual, expected, ordered, float_absolute=1e-9, context=sql)
            printed = deployment.quarry("sql", sql, "--format", "json", "--cluster", file)
            answered = pa.Table.from_pylist(json.loads(printed.stdout)["result"])
            assert_same_rows(answered, expected, ordered, float_absolute=1e-9, context=sql)


def test_each_device_reports_the_labels_it_was_enrolled_with(deployed):
    deployment, _ = deployed
    with quarry.connect(deployment.cluster_file) as cluster:
        for host in deployment.hosts:
            hello = cluster.devices[host.name].hello()
            assert (hello.name, hello.host, hello.rack) == (host.name, host.address, host.rack)
            assert hello.peers == len(deployment.hosts) - 1  # the admin's status handed them


def _private_keys(path) -> list:
    """Every private key a file holds, in any PEM block or as the whole file."""
    found = []
    text = path.read_bytes()
    for block in text.split(b"-----END ")[:-1]:
        start = block.rfind(b"-----BEGIN ")
        if start >= 0 and b"PRIVATE KEY" in block[start:]:
            label = block[start + 11 : block.index(b"-----", start + 11)]
            pem = block[start:] + b"-----END " + label + b"-----\n"
            found.append(serialization.load_pem_private_key(pem, None))
    return found


def test_a_storage_hosts_folder_holds_nothing_that_signs(deployed):
    deployment, _ = deployed
    authority = deployment.authority
    ca_key = (authority / "ca.key").read_bytes()
    signing = serialization.load_pem_private_key((authority / "signing.key").read_bytes(), None)
    raw_signing = signing.private_bytes_raw()
    for host in deployment.hosts:
        files = sorted(p.name for p in host.credentials.iterdir())
        assert files == [
            "ca.pem", "device.key", "device.pem", "device.token", "labels.json", "revoked.json",
            "verify.pem",
        ]  # fmt: skip
        own_key = serialization.load_pem_private_key(
            (host.credentials / "device.key").read_bytes(), None
        )
        for path in host.credentials.iterdir():
            body = path.read_bytes()
            assert ca_key not in body and raw_signing not in body, path
            assert base64.b64encode(raw_signing) not in body, path
            keys = _private_keys(path)
            if path.name == "device.key":
                assert len(keys) == 1 and isinstance(keys[0], ec.EllipticCurvePrivateKey)
            else:
                assert keys == [], f"{path} holds a private key"
        cert = (host.credentials / "device.pem").read_bytes()
        from cryptography import x509

        assert (
            x509.load_pem_x509_certificate(cert).public_key().public_numbers()
            == own_key.public_key().public_numbers()
        )
        claims = read_claims((host.credentials / "device.token").read_text())
        assert (claims.role, claims.subject) == (Role.DEVICE, host.name)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _forgeries(host: Host) -> list[str]:
    """Admin tokens made with every file of a device's folder as the key."""
    claims = {"role": "admin", "id": "f" * 32, "sub": "", "iat": time.time(), "exp": 4e9}
    body = _b64(json.dumps(claims).encode())
    older = _b64(json.dumps({"role": "admin", "id": "f" * 32, "issued_at": time.time()}).encode())
    forged = []
    for path in sorted(host.credentials.iterdir()):
        secret = path.read_bytes()
        for text in (body, older):  # HMAC with the file as the secret, both token shapes
            forged.append(
                f"{text}.{_b64(hmac.new(secret, text.encode(), hashlib.sha256).digest())}"
            )
        seed = hashlib.sha256(secret).digest()  # an Ed25519 key made from the file
        forged.append(
            f"{body}.{_b64(Ed25519PrivateKey.from_private_bytes(seed).sign(body.encode()))}"
        )
    key = serialization.load_pem_private_key((host.credentials / "device.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    forged.append(f"{body}.{_b64(key.sign(body.encode(), ec.ECDSA(hashes.SHA256())))}")
    return forged


def test_a_token_minted_with_a_devices_files_is_refused(deployed):
    deployment, _ = deployed
    target = deployment.hosts[0]
    for host in deployment.hosts:
        for forged in _forgeries(host):
            with pytest.raises(Unauthenticated):
                _client(deployment, target, forged).kv_list("~")
    credential = (deployment.hosts[1].credentials / "device.token").read_text()
    as_device = _client(deployment, target, credential)
    for call in (
        lambda: as_device.kv_list("~"),
        lambda: as_device.drop("lab", "particles"),
        lambda: as_device.hello(),
    ):
        with pytest.raises(Forbidden, match="a device token may not"):
            call()
    # what a device's credential is for, it may: ask a peer for its revocation list
    host = deployment.hosts[1]
    peer = PeerCredentials(
        credential,
        (host.credentials / "ca.pem").read_bytes(),
        (
            (host.credentials / "device.pem").read_bytes(),
            (host.credentials / "device.key").read_bytes(),
        ),
    )
    assert ask_revocations(target.url, 0, peer) is not None


def test_a_caller_without_a_certificate_of_the_cluster_cannot_connect(deployed):
    deployment, _ = deployed
    host = deployment.hosts[0]
    admin = (deployment.authority / "admin.token").read_text()
    bare = DeviceClient(
        host.name, host.url, 5, admin, (deployment.authority / "ca.pem").read_bytes()
    )
    with pytest.raises((DeviceUnavailable, QuarryError)):
        bare.hello()
    assert _client(deployment, host, admin).hello().name == host.name


def test_an_expired_token_is_refused_with_a_clear_error(deployed):
    deployment, _ = deployed
    token = _token(deployment, "--role", "reader", "--ttl", "1")
    client = _client(deployment, deployment.hosts[0], token)
    assert client.hello().name == "dev0"
    time.sleep(1.1)
    expired = r"reader token expired at .* ago\): ask the cluster.s admin"
    with pytest.raises(Unauthenticated, match=expired):
        client.hello()


def _exited(host: Host, timeout_s: float = 5.0) -> bool:
    """Whether the device's process ended (a fault point hit it) within ``timeout_s``."""
    assert host.process is not None
    try:
        host.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_a_device_that_missed_a_commit_asks_the_decider_over_mutual_tls(deployed):
    """Every device requires a certificate of its callers here: the device that crashed at
    commit learns the outcome from the decider with its own certificate and credential."""
    deployment, table = deployed
    faults = deployment.hosts[0].root.parent / "faults"
    with quarry.connect(deployment.cluster_file) as cluster:
        for victim in deployment.hosts:
            faults.write_text(f"{victim.name}:commit")
            try:
                cluster.ingest(table, f"lab/missed_{victim.name}", replicas=2, partitions=6)
                stands = True
            except QuarryError:  # it was the decider: its crash aborted the ingest
                stands = False
            finally:
                faults.write_text("")
            crashed = _exited(victim)
            if crashed:
                deployment.serve(victim)  # back, on its data: it asks the decider
            if crashed and stands:
                break
        else:
            raise AssertionError("no device missed a commit of an ingest that stood")
    admin = _client(deployment, victim, (deployment.authority / "admin.token").read_text())
    deadline = time.monotonic() + 20
    while not any(p.dataset == f"missed_{victim.name}" for p in admin.inventory()):
        assert time.monotonic() < deadline, "the decider's outcome never reached it"
        time.sleep(0.1)
    with quarry.connect(deployment.cluster_file) as cluster:
        counted = cluster.sql(f"SELECT count(*) AS n FROM missed_{victim.name}").read_all()
        assert counted["n"][0].as_py() == ROWS
        assert all(
            len(p.devices) == 2 for p in cluster.entry(f"lab/missed_{victim.name}").partitions
        )


def _refuses(client: DeviceClient) -> bool:
    try:
        client.hello()
    except Unauthenticated as error:
        assert "was revoked" in str(error)
        return True
    return False


def test_a_revoked_token_is_refused_and_a_device_down_meanwhile_learns_it(deployed, tmp_path):
    deployment, _ = deployed
    token = _token(deployment, "--role", "reader")
    clients = {h.name: _client(deployment, h, token) for h in deployment.hosts}
    assert all(c.hello() for c in clients.values())
    away = deployment.hosts[2]
    deployment.stop(away)
    file = tmp_path / "reader.token"
    file.write_text(token)
    done = deployment.quarry(
        "token", "revoke", "--file", str(file), "--cluster", str(deployment.cluster_file)
    )
    assert "dev2: not reached" in done.stdout, done.stdout
    for host in deployment.hosts[:2]:  # pushed: refused at once
        assert _refuses(clients[host.name])
    deployment.serve(away)  # back, as it was: it learns from its peers, no coordinator asks
    started = time.monotonic()
    back = _client(deployment, away, token)
    while not _refuses(back):
        assert time.monotonic() - started < REVOCATION_BOUND_S, "not learnt within the bound"
        time.sleep(0.1)
    other = _token(deployment, "--role", "reader")  # a token not revoked still works there
    assert _client(deployment, away, other).hello().name == away.name
