"""Every call carries a token of the cluster; roles bound what it may do; TLS when asked (and
required off loopback). A refused call changes nothing."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pyarrow as pa
import pytest

import quarry
from quarry.auth.credentials import Credentials
from quarry.auth.tokens import Role, mint, new_signing_key
from quarry.coordinator.cluster import Cluster
from quarry.coordinator.membership.cluster_file import DeviceSpec
from quarry.coordinator.membership.device_client import DeviceClient
from quarry.errors import DeviceUnavailable, Forbidden, QuarryError, Unauthenticated
from quarry.protocol.control import CalibratePart
from quarry.samples import particles


@pytest.fixture(scope="module")
def secured():
    with quarry.local(devices=2) as cluster:
        cluster.ingest(particles.table(20_000, seed=1), "physics/particles")
        credentials = Credentials(__import__("pathlib").Path(cluster.specs[0].credentials))
        yield cluster, credentials


def _as(cluster, token: str) -> Cluster:
    """The same devices, with another token."""
    return Cluster([DeviceSpec(d.name, d.address, token=token) for d in cluster.specs])


def test_credentials_and_cluster_file_are_the_owners_only(secured):
    cluster, credentials = secured
    assert stat.S_IMODE(credentials.folder.stat().st_mode) == 0o700
    owned = (
        credentials.signing_key_file,
        credentials.ca_key_file,
        credentials.admin_token_file,
        cluster.cluster_file,
    )
    for path in owned:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for spec in cluster.specs:  # each device's own folder, which holds nothing that signs
        enrolled = __import__("pathlib").Path(spec.data) / "credentials"
        assert stat.S_IMODE(enrolled.stat().st_mode) == 0o700
        assert not (enrolled / "signing.key").exists() and not (enrolled / "ca.key").exists()
        for path in enrolled.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_call_without_a_valid_token_is_refused_and_changes_nothing(secured):
    cluster, _ = secured
    spec = cluster.specs[0]
    bare = DeviceClient(spec.name, spec.address)
    with pytest.raises(Unauthenticated, match="no token"):
        bare.hello()
    with pytest.raises(Unauthenticated, match="no token"):
        bare.drop("physics", "particles")
    forged = DeviceClient(spec.name, spec.address, token=mint(new_signing_key(), Role.ADMIN))
    with pytest.raises(Unauthenticated, match="not issued for this cluster"):
        forged.scan("physics", "particles", 0).read_all()
    assert "physics/particles" in {d.dataset for d in cluster.datasets()}


def test_each_role_may_do_its_part_and_no_more(secured):
    cluster, credentials = secured
    reader = _as(cluster, credentials.token(Role.READER))
    writer = _as(cluster, credentials.token(Role.WRITER))
    client = reader.devices["dev0"]
    # a reader reads: scans, SQL, descriptions
    assert reader.sql("SELECT count(*) AS n FROM particles").read_all()["n"][0].as_py() == 20_000
    assert reader.scan("physics/particles").read_all().num_rows == 20_000
    client.describe(
        "physics", "particles", reader.entry("physics/particles").partitions[0].partition
    )
    # ... and nothing else
    refused = [
        lambda: reader.ingest(pa.table({"k": [1, 2]}), "t/reader"),
        lambda: reader.drop("physics/particles"),
        lambda: client.kv_put("~x", b"1"),
        lambda: client.kv_list(),
        lambda: reader.load("dev0", 0.5, 1.0),
        lambda: client.calibrate(CalibratePart.KERNEL),
        lambda: client.program(
            "capacity.count", {"domain": "physics", "dataset": "particles", "partition": 0}
        ),
    ]
    for call in refused:
        with pytest.raises(Forbidden, match="reader token may not"):
            call()
    # a writer writes and drops, but runs no program and loads no drive
    writer.ingest(pa.table({"k": pa.array(range(100), pa.int64())}), "t/written")
    writer.drop("t/written")
    for call in (lambda: writer.load("dev0", 0.5, 1.0), lambda: writer.devices["dev0"].kv_list()):
        with pytest.raises(Forbidden, match="writer token may not"):
            call()
    # the cluster's owner (admin) may all of it
    assert cluster.device_load("dev0").cpu_busy >= 0
    cluster.devices["dev0"].kv_list("~")
    assert "physics/particles" in {d.dataset for d in cluster.datasets()}  # nothing lost


def test_a_token_handed_out_from_the_command_line(secured, tmp_path):
    cluster, _ = secured
    output = tmp_path / "reader.json"
    command = [sys.executable, "-m", "quarry", "token", "create", "--role", "reader"]
    done = subprocess.run(
        [*command, "--output", str(output), "--cluster", str(cluster.cluster_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    with quarry.connect(output) as handed:
        assert handed.scan("physics/particles").read_all().num_rows == 20_000
        with pytest.raises(Forbidden):
            handed.drop("physics/particles")
    assert stat.S_IMODE(output.stat().st_mode) == 0o600


def test_tls_is_checked_against_the_clusters_ca(tmp_path):
    with quarry.local(devices=1, tls=True) as cluster:
        cluster.ingest(particles.table(5_000, seed=2), "physics/tls")
        assert cluster.scan("physics/tls").read_all().num_rows == 5_000
        spec = cluster.specs[0]
        assert spec.address.startswith("grpc+tls://")
        token = Credentials(__import__("pathlib").Path(spec.credentials)).admin_token()
        stranger_ca = Credentials(tmp_path / "other").folder
        from quarry.auth.credentials import create

        other = create(tmp_path / "other")
        for root_ca in (None, other.ca_file.read_bytes()):  # no CA, or another cluster's
            client = DeviceClient(
                spec.name, spec.address, token=token, root_ca=root_ca, timeout_s=5
            )
            with pytest.raises((DeviceUnavailable, QuarryError)):
                client.hello()
        assert stranger_ca.exists()


def test_a_device_off_loopback_must_use_tls(tmp_path):
    command = [
        sys.executable,
        "-m",
        "quarry",
        "device",
        "serve",
        "--data",
        str(tmp_path / "d"),
        "--host",
        "0.0.0.0",
        "--insecure",
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"}
    )
    assert done.returncode != 0
    assert "must use TLS" in done.stderr + done.stdout


@pytest.mark.slow
def test_quarry_up_over_an_older_quarrys_credentials_makes_new_ones(tmp_path):
    """A data folder whose credentials an older quarry made (one HMAC secret every device
    shared) is not read any more: ``quarry up`` says so and makes an authority and a folder
    per device; an enrolled folder is what a device serves with."""
    from tests.commands import run_quarry

    older = tmp_path / ".quarry" / "credentials"
    older.mkdir(parents=True)
    for name in ("secret", "admin.token", "ca.pem", "ca.key", "device.pem", "device.key"):
        (older / name).write_bytes(b"older")
    refused = run_quarry(
        "device", "serve", "--data", str(tmp_path / "d"), "--credentials", str(older),
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "older quarry" in refused.stderr
    assert "re-run `quarry up`" in " ".join(refused.stderr.split())
    try:  # `down` even after an `up` that started its device and then failed
        up = run_quarry("up", "--devices", "1", "--detach", cwd=tmp_path)
        assert "older quarry's credentials" in " ".join(up.stdout.split())
        assert not (older / "secret").exists() and (older / "signing.key").exists()
        assert (tmp_path / ".quarry" / "dev0" / "credentials" / "device.token").exists()
        status = json.loads(run_quarry("status", "--json", cwd=tmp_path).stdout)
        assert [row["up"] for row in status] == [True]
    finally:
        run_quarry("down", cwd=tmp_path, check=False)
