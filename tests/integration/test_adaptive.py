"""Issue 4 on real devices: calibration, emulated load, and devices that decline work."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import quarry
from quarry.samples import particles
from tests.plan.harness import assert_same_rows

SQL = (
    "SELECT CAST(floor(x / 10) AS BIGINT) AS cell, count(*) AS n, avg(ke) AS ke_avg "
    "FROM physics.particles WHERE ke > 0.5 GROUP BY 1 ORDER BY 1"
)


@pytest.mark.slow
def test_calibration_finds_the_kinetic_figures():
    with quarry.local(devices=2, profile=["kinetic", "host"]) as cluster:
        reports = {r.device: r for r in cluster.calibrate()}
        kinetic = reports["dev0"]
        assert kinetic.profile == "kinetic"
        for key in ("compute_factor", "internal_bytes_per_s", "external_bytes_per_s"):
            entry = getattr(kinetic, key)
            assert entry.expected and entry.measured > 0
            assert abs(entry.measured - entry.expected) <= 0.10 * entry.expected, (key, entry)
            assert entry.within_10_percent is True
        host = reports["dev1"]
        assert host.external_bytes_per_s.expected is None  # unlimited: nothing to meet
        assert 0.8 < host.compute_factor.measured < 1.25
        # stored with the cluster: a fresh coordinator reads it back from the device
        from quarry.coordinator.admin.calibrate import stored

        assert stored(cluster.devices["dev0"]) == kinetic


@pytest.mark.slow
def test_background_load_is_bounded_and_visible(tmp_path):
    with quarry.local(devices=1, profile="kinetic", data=tmp_path / "c") as cluster:
        env = {**os.environ, "QUARRY_CLUSTER": str(cluster.cluster_file)}
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "quarry",
                "device",
                "load",
                "--device",
                "dev0",
                "--cpu",
                "0.5",
                "--seconds",
                "30",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert cluster.device_load("dev0").background_load == 0.5
        cluster.load("dev0", 0.5, seconds=0.2)
        import time

        time.sleep(0.4)
        assert cluster.device_load("dev0").background_load == 0.0  # it stopped by itself
        with pytest.raises(quarry.errors.QuarryError, match="Load.cpu: must be below 1"):
            cluster.load("dev0", 1.5)


def test_auto_avoids_a_busy_device_and_answers_right():
    with quarry.local(devices=2, profile="kinetic") as cluster:
        cluster.ingest(particles.reader(1_000_000), "physics/particles")
        expected = cluster.sql(SQL, pushdown="never").read_all()
        for device in cluster.devices:
            cluster.load(device, 0.9, seconds=120)
        planned = cluster.query(SQL, pushdown="auto")
        result = planned.execute().read_all()
        report = planned.explain(analyze=True)
        assert_same_rows(result, expected, ordered=True, context="auto under load")
        (choice,) = report.cost_model.values()
        assert choice.cut != "full"  # a 90%-busy, 15x slower drive should not aggregate
        assert choice.estimates_s["full"] > choice.estimates_s[choice.cut]


@pytest.mark.slow
def test_device_pushes_back_when_load_arrives_after_planning():
    """The host planned to push down; the drive got busy; the drive declines the rest."""
    with quarry.local(devices=2) as cluster:
        cluster.ingest(particles.reader(2_000_000), "physics/particles", partitions=2)
        expected = cluster.sql(SQL, pushdown="never").read_all()
        planned = cluster.query(SQL, pushdown="auto", chunk_slices=1)
        (start,) = {c.cut for c in planned.choices.values()}
        assert start in ("full", "filter")  # an idle host-speed drive is worth using
        for device in cluster.devices:
            cluster.load(device, 0.97, seconds=120)
        result = planned.execute().read_all()
        assert_same_rows(result, expected, ordered=True, context="pushed back mid-query")
        explained = planned.explain(analyze=True)
        partitions = explained.analyze.partitions
        stages = {d.stage for p in partitions for d in p.decisions}
        assert start in stages and "raw" in stages, partitions
        reasons = [d.reason for p in partitions for d in p.decisions if d.stage == "raw"]
        assert any("ns/B" in r and "busy" in r for r in reasons), reasons
        assert all(
            d.retry_after_s is not None
            for p in partitions
            for d in p.decisions
            if d.stage in ("raw", "filter")
        )
        json.dumps(explained.to_json())  # the annotation is plain JSON


def test_a_repeated_query_starts_where_its_devices_settled(monkeypatch):
    """The host's sample erred towards the host (figures that make ``filter`` look best); the
    devices measure, settle on ``full``, and the same query next time starts there. The answer
    is the same at every start. The devices are priced as machines of their own: on the host's
    cores, doing part of the work there is never cheaper than doing all of it."""
    from quarry.coordinator.query import cost_inputs as figures
    from quarry.coordinator.query.planning import fragment_key
    from quarry.cost.model import SubPlanFigures

    monkeypatch.setattr(figures, "shares_host", lambda address, profile: False)
    sql = "SELECT sum(ke) AS s FROM physics.particles WHERE ke > 2.0"
    with quarry.local(devices=2) as cluster:
        cluster.ingest(particles.reader(1_000_000), "physics/particles", partitions=2)
        expected = cluster.sql(sql, pushdown="never").read_all()
        (fragment,) = cluster.query(sql, pushdown="auto").decomposition.fragments
        cluster.figures_cache[fragment_key(fragment, cluster.entry(fragment.dataset))] = (
            SubPlanFigures(4e-9, 2e-9, raw_ratio=0.2, filter_ratio=0.01, output_ratio=1e-6)
        )
        starts = []
        for _ in range(2):
            planned = cluster.query(sql, pushdown="auto", chunk_slices=1)
            result = planned.execute().read_all()
            assert_same_rows(
                result, expected, ordered=True, context="auto, learning where to start"
            )
            (choice,) = planned.explain(analyze=True).cost_model.values()
            starts.append((choice.cut, choice.model_cut, choice.started))
        assert starts[0] == ("filter", None, None), starts
        assert starts[1][:2] == ("full", "filter") and "settled" in starts[1][2], starts
