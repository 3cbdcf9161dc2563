"""The host's own profile: its ingress link is one bucket every device stream into the
coordinator passes, so pushdown pays by the ratio of what the host must take in."""

from __future__ import annotations

import time

import pytest

import quarry
from quarry.device.unit import host_emulator
from quarry.samples import particles

INGRESS_BYTES_PER_S = 10e6
PROFILES = f"""
[profiles.slowhost]
from = "host"
external_bytes_per_s = {INGRESS_BYTES_PER_S}
"""


@pytest.mark.slow
def test_the_hosts_ingress_caps_every_device_stream_into_it(tmp_path):
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(PROFILES)
    with quarry.local(devices=2, host_profile="slowhost", profiles_file=str(profiles)) as c:
        c.ingest(particles.reader(1_000_000, seed=3), "physics/particles", partitions=4)
        sql = "SELECT sum(ke) AS s FROM particles WHERE ke > 1"
        c.sql(sql, pushdown="always").read_all()  # devices load their engine on first use
        started = time.perf_counter()
        raw = c.sql(sql, pushdown="never").read_all()
        raw_s = time.perf_counter() - started
        started = time.perf_counter()
        pushed = c.sql(sql, pushdown="always").read_all()
        pushed_s = time.perf_counter() - started
        shipped = c.explain(sql, analyze=True, pushdown="never").analyze.devices
        raw_bytes = sum(d.counters.bytes_shipped for d in shipped)
        assert raw_s >= 0.8 * raw_bytes / INGRESS_BYTES_PER_S  # the link held it back
        assert pushed_s < raw_s / 3  # a few bytes back: the link does not matter
        assert raw["s"][0].as_py() == pytest.approx(pushed["s"][0].as_py(), rel=1e-12)
    assert host_emulator().external is None  # the machine as it is, once the cluster closed


@pytest.mark.slow
def test_quarry_up_names_the_host_profile_for_every_coordinator(tmp_path):
    from quarry.device.unit import set_host_profile

    from .test_cli import _quarry

    profiles = tmp_path / "profiles.toml"
    profiles.write_text(PROFILES)
    data = tmp_path / "data"
    up = ("up", "--devices", "1", "--detach", "--data", str(data))
    _quarry(*up, "--host-profile", "slowhost", "--profiles", str(profiles), cwd=tmp_path)
    try:
        cluster = quarry.connect(data / "cluster.json")
        assert host_emulator().external.bytes_per_s == INGRESS_BYTES_PER_S
        cluster.close()
    finally:
        set_host_profile(None)
        _quarry("down", "--cluster", str(data / "cluster.json"), cwd=tmp_path)
    refused = _quarry(*up, "--host-profile", "nohost", cwd=tmp_path, check=False)
    assert refused.returncode != 0 and "nohost" in refused.stderr + refused.stdout


CALIBRATED_HOST = """
[profiles.calhost]
from = "host"
cores = 1
compute_factor = 4.0
external_bytes_per_s = 40e6
"""


@pytest.mark.slow
def test_calibration_measures_the_hosts_profile_beside_the_drives(tmp_path):
    """quarry calibrate measures the host's compute factor (the kernel in one of its slots
    against the machine's own) and its ingress (devices streaming into it at once), each
    within 10% of the profile's setting."""
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(CALIBRATED_HOST)
    with quarry.local(devices=2, host_profile="calhost", profiles_file=str(profiles)) as c:
        report = c.calibrate_host()
    assert report.device == "host" and report.profile == "calhost"
    for key, expected in (("compute_factor", 4.0), ("external_bytes_per_s", 40e6)):
        entry = getattr(report, key)
        assert entry.expected == expected, entry
        assert abs(entry.measured - expected) <= 0.10 * expected, (key, entry)
        # a machine too busy for the best runs to agree gives no verdict, and says why
        assert entry.within_10_percent is (True if entry.settled else None), entry
        assert 1 <= entry.attempts <= 3
