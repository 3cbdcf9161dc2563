"""Liveness is about silence, not duration: work that sends nothing for several times the
silence bound is not taken for a lost device (its gRPC answers the host's pings, and its
heartbeat stream keeps them welcome). The bound's other side, a silent link, needs real cuts:
tests/integration/test_partitions.py."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

import quarry
from quarry import settings
from quarry.protocol.control import CalibratePart

# A drive that reads 100 KB/s and computes 150 times slower than this machine: each 256 KiB
# slice of a scan takes it 2.6 s, the calibration kernel about 5 s, each with nothing sent.
PROFILES = (
    '[profiles.crawl]\nfrom = "host"\ninternal_bytes_per_s = 100000.0\n'
    "compute_factor = 150.0\nkv_bytes_max = 262144\n"
)
BOUND_S = 1.0


@pytest.mark.slow
def test_work_silent_for_longer_than_the_bound_is_not_lost(tmp_path, monkeypatch):
    monkeypatch.setenv(settings.DEVICE_SILENCE_S.name, str(BOUND_S))
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(PROFILES)
    with quarry.local(devices=1, profile="crawl", profiles_file=str(profiles)) as cluster:
        client = cluster.devices["dev0"]
        assert client.liveness.silence_s == BOUND_S
        started = time.perf_counter()
        client.calibrate(CalibratePart.KERNEL, timeout_s=120)  # one silent action
        assert time.perf_counter() - started > 3 * BOUND_S
        table = pa.table({"k": pa.array(range(90_000), pa.int64())})
        cluster.ingest(table, "t/crawl", partitions=1)
        started = time.perf_counter()
        scanned = cluster.scan("t/crawl").read_all()  # a slice every 2.6 s, nothing between
        assert time.perf_counter() - started > 3 * BOUND_S
        assert scanned.num_rows == 90_000
        assert client.heartbeat.beats > 0 and not client.heartbeat.silent
        assert cluster.down == {}
