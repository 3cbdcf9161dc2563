"""`quarry top`: a row per device, its rates over the interval, a snapshot with --once."""

from __future__ import annotations

import io
import re

from rich.console import Console
from typer.testing import CliRunner

from quarry.cli import app
from quarry.coordinator.membership.listing import DeviceStatus
from quarry.protocol.control import StatsReply
from quarry.protocol.counters import WorkCounters
from quarry.top import Sample, table

MIB = 1 << 20


def _up(name: str, **figures) -> DeviceStatus:
    stats = StatsReply(keys=1, file_bytes=MIB, exchanges_max=8, **figures)
    return DeviceStatus(name, "grpc://127.0.0.1:1", True, profile="host", stats=stats)


def _shown(before: Sample, now: Sample) -> list[str]:
    out = Console(width=160, record=True, file=io.StringIO())
    out.print(table(before, now))
    return out.export_text().splitlines()


def test_rates_are_the_difference_of_two_answers_over_the_time_between():
    before = Sample(
        10.0,
        (
            _up("dev0", read_bytes=0, shipped_bytes=0, work=WorkCounters(slices_scanned=10)),
            _up("dev1", read_bytes=50 * MIB, admitted=9),
        ),
    )
    now = Sample(
        12.0,
        (
            _up(
                "dev0",
                running=3,
                queued_bytes=2 * MIB,
                read_bytes=8 * MIB,
                shipped_bytes=MIB,
                refused=4,
                work=WorkCounters(
                    slices_scanned=30,
                    slices_pushed_back=5,
                    slices_pushed_back_busy=3,
                    slices_pushed_back_capability=2,
                ),
                free_bytes=3 * (1 << 30),
            ),
            _up("dev1", read_bytes=4 * MIB, admitted=1),  # restarted: counts from zero
            DeviceStatus("dev2", "grpc://127.0.0.1:2", False, error="unreachable"),
        ),
    )
    rows = {line.split()[0]: line for line in _shown(before, now) if line.strip().startswith("dev")}
    # work, queued, read/s, sent/s, pushed (5 of the 20 slices read meanwhile), busy/s, free
    shown = " ".join(rows["dev0"].split())
    assert shown == "dev0 3 of 8 2.0 MiB 4.0 MiB 512.0 KiB 25% 2.0 3.0 GiB", rows["dev0"]
    assert "2.0 MiB" in rows["dev1"]  # 4 MiB since its restart, not minus 46
    assert "down" in rows["dev2"]
    # why they went back, under the table
    assert _shown(before, now)[-1].strip() == "why: dev0 pushed back 5 (busy 3, capability 2)"


def test_once_prints_a_snapshot_of_every_device(cluster):
    shown = CliRunner().invoke(
        app,
        ["top", "--once", "--interval", "0.3", "--cluster", str(cluster.cluster_file)],
        env={"COLUMNS": "80"},
    )
    assert shown.exit_code == 0, shown.output
    assert "rates over" in shown.output
    for column in ("work", "read/s", "sent/s", "pushed", "free"):
        assert column in shown.output
    rows = shown.output.splitlines()
    assert max(len(row.rstrip()) for row in rows) <= 80
    listed = [row.split()[0] for row in rows if re.match(r"\s*dev\d", row)]
    assert listed == sorted(cluster.devices), shown.output
