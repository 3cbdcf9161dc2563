"""`quarry top`: a row per device, its rates over the interval, a snapshot with --once."""

from __future__ import annotations

import io

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
                work=WorkCounters(slices_scanned=30, slices_pushed_back=5),
                free_bytes=3 * (1 << 30),
            ),
            _up("dev1", read_bytes=4 * MIB, admitted=1),  # restarted: counts from zero
            DeviceStatus("dev2", "grpc://127.0.0.1:2", False, error="unreachable"),
        ),
    )
    rows = {line.split("│")[1].strip(): line for line in _shown(before, now) if "│ dev" in line}
    cells = [cell.strip() for cell in rows["dev0"].split("│")[1:-1]]
    assert cells == [
        "dev0",
        "yes",
        "3 of 8",
        "2.0 MiB",
        "4.0 MiB/s",
        "512.0 KiB/s",
        "25% of 20",
        "2.0",
        "3.0 GiB",
    ]
    assert "2.0 MiB/s" in rows["dev1"]  # 4 MiB since its restart, not minus 46
    assert "no" in rows["dev2"]


def test_once_prints_a_snapshot_of_every_device(cluster):
    shown = CliRunner().invoke(
        app,
        ["top", "--once", "--interval", "0.3", "--cluster", str(cluster.cluster_file)],
        env={"COLUMNS": "160"},
    )
    assert shown.exit_code == 0, shown.output
    assert "rates over the last" in shown.output
    for column in ("read/s", "shipped/s", "pushed back", "free"):
        assert column in shown.output
    listed = [line.split("│")[1].strip() for line in shown.output.splitlines() if "│ dev" in line]
    assert listed == sorted(cluster.devices), shown.output
