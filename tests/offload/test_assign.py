"""Algorithm 1 (ActivePy §III.B) on hand-made estimates: a reducing scan moves to the devices
when the link is the bottleneck, stays when the devices are too slow, and a line whose output
is bigger than its input does not follow."""

from __future__ import annotations

import pytest

from quarry.offload.assign import assign, host_time
from quarry.offload.estimate import LineEstimate
from quarry.offload.fit import Fit

FLAT = Fit("O(1)", 0.0, 0.0, 0.0)
GB = 1e9


def line(
    number, host_s, device_s, stored=0.0, din=0.0, dout=0.0, pinned=False, reads="", binds=""
) -> LineEstimate:
    return LineEstimate(
        number,
        f"line {number}",
        FLAT,
        FLAT,
        host_s,
        device_s,
        stored,
        din,
        dout,
        pinned,
        True,
        reads=frozenset(reads.split()),
        binds=frozenset(binds.split()),
    )


def program(c: float) -> list[LineEstimate]:
    """read 8 GB; filter to 0.8 GB; sum to 8 bytes; print (device time = c x host time)."""
    return [
        line(1, 2.0, 2.0 * c, stored=8 * GB, dout=8 * GB, binds="df"),
        line(2, 1.0, 1.0 * c, din=8 * GB, dout=0.8 * GB, reads="df", binds="hot"),
        line(3, 0.2, 0.2 * c, din=0.8 * GB, dout=8, reads="hot", binds="total"),
        line(4, 0.0, 0.0, din=8, dout=0, pinned=True, reads="total"),  # print(total)
    ]


def test_a_reducing_scan_moves_to_the_devices_when_the_link_is_slow():
    lines = program(c=3.0)
    cut = assign(lines, link_bytes_per_s=1 * GB)
    assert cut.host_s == pytest.approx(3.2 + 8.0)  # compute + 8 GB over 1 GB/s
    assert cut.device_lines == {1, 2, 3}
    # read, filter and sum on the devices: 9.6 s of device compute, 8 bytes back
    assert cut.csd_s == pytest.approx(3 * 3.2 + 8 / GB, rel=1e-9)
    assert cut.csd_s < cut.host_s


def test_slow_devices_and_a_fast_link_keep_everything_on_the_host():
    cut = assign(program(c=15.0), link_bytes_per_s=100 * GB)
    assert cut.device_lines == set()
    assert cut.csd_s == cut.host_s == pytest.approx(host_time(program(15.0), 100 * GB))


def test_a_line_that_grows_its_data_stays_on_the_host():
    lines = [
        line(1, 1.0, 1.0, stored=4 * GB, dout=0.1 * GB, binds="df"),  # a selective read
        line(2, 0.5, 0.5, din=0.1 * GB, dout=10 * GB, reads="df", binds="big"),  # an explosion
        line(3, 0.0, 0.0, pinned=True, reads="big"),
    ]
    cut = assign(lines, link_bytes_per_s=1 * GB)
    assert cut.device_lines == {1}
    assert [s.moved for s in cut.steps] == [True, False, False]


def test_a_run_moves_when_only_the_whole_run_pays():
    """Alone, the read ships what it read; with the reduction after it, 8 bytes come back."""
    lines = program(c=1.0)
    shown = line(2, 0.0, 0.0, pinned=True, reads="df")  # print(df): every row to the host
    assert assign([lines[0], shown], link_bytes_per_s=1 * GB).device_lines == set()
    assert assign(lines, link_bytes_per_s=1 * GB).device_lines == {1, 2, 3}


def test_a_frame_read_by_many_reductions_is_saved_once():
    """Four sums of one frame: the frame does not cross, and nothing is saved four times."""
    lines = [line(1, 1.0, 1.0, stored=4 * GB, dout=4 * GB, binds="df")]
    for n in range(2, 6):
        lines.append(line(n, 0.1, 0.1, din=4 * GB, dout=8, reads="df", binds=f"s{n}"))
    lines.append(line(6, 0.0, 0.0, pinned=True, reads="s2 s3 s4 s5"))
    cut = assign(lines, link_bytes_per_s=1 * GB)
    assert cut.device_lines == {1, 2, 3, 4, 5}
    assert cut.csd_s == pytest.approx(1.4 + 4 * 8 / GB)  # compute, and four sums back


def test_a_line_that_looks_across_partitions_ends_the_run():
    lines = program(c=1.0)
    across = LineEstimate(
        2,
        "hot = df.sort_values('ke')",
        *(FLAT, FLAT, 1.0, 1.0, 0.0, 8 * GB, 0.8 * GB, False, False),
        reads=frozenset({"df"}),
        binds=frozenset({"hot"}),
    )
    cut = assign([lines[0], across, *lines[2:]], link_bytes_per_s=1 * GB)
    assert 2 not in cut.device_lines and 1 not in cut.device_lines  # alone, the read never pays
