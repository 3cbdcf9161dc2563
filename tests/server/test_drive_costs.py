"""A storage server chooses its drives' cut and tells them its own costs, not the host's."""

from __future__ import annotations

from dataclasses import replace

from quarry.cost.model import DeviceFigures, HostFigures
from quarry.protocol.stage import Stage
from quarry.protocol.work import HostCost
from quarry.server.costs import drive_costs

# the host is four times slower than this machine; the sub-plan filters most rows away
HOST = HostCost(
    full_s_per_byte=8e-9,
    filter_s_per_byte=4e-9,
    raw_ratio=0.5,
    filter_ratio=0.01,
    link_bytes_per_s=1e9,
    host_share=0.5,
    start=Stage.RAW,
    compute_factor=4.0,
    output_ratio=0.001,
)


def _drives(compute_factor: float, n: int = 2) -> list[DeviceFigures]:
    return [DeviceFigures(f"d{i}", 64 << 20, 1, compute_factor, 1, 1e9, 2e9) for i in range(n)]


def test_fast_drives_behind_a_slow_server_run_it_all_whatever_the_host_chose() -> None:
    slow = HostFigures(cores=1, compute_factor=30.0, link_bytes_per_s=1e9)
    costs = drive_costs(HOST, slow, _drives(compute_factor=1.0))
    assert {c.start for c in costs.values()} == {Stage.FULL}


def test_slow_drives_behind_a_fast_server_hand_it_their_slices() -> None:
    fast = HostFigures(cores=8, compute_factor=1.0, link_bytes_per_s=8e9)
    costs = drive_costs(replace(HOST, start=Stage.FULL), fast, _drives(compute_factor=200.0))
    assert {c.start for c in costs.values()} == {Stage.RAW}


def test_drives_are_told_the_servers_seconds_per_byte_link_and_cores() -> None:
    server = HostFigures(cores=4, compute_factor=2.0, link_bytes_per_s=1e9)
    costs = drive_costs(HOST, server, _drives(compute_factor=1.0, n=4))
    cost = costs["d0"]
    assert cost.full_s_per_byte == 4e-9  # 8e-9 at the host's 4x is 2e-9 here, at 2x
    assert cost.filter_s_per_byte == 2e-9
    assert cost.compute_factor == 2.0
    assert cost.host_share == 1.0  # four cores over four drives
    assert cost.link_bytes_per_s == 0.25e9  # its ingress, shared by four drives
    assert cost.device_full_s_per_byte == 2e-9  # the drive at 1x: this machine's speed


def test_a_unit_whose_cut_is_not_chosen_keeps_the_hosts_start() -> None:
    server = HostFigures(cores=1, compute_factor=1.0)
    unchosen = replace(HOST, output_ratio=None, start=Stage.FILTER)
    costs = drive_costs(unchosen, server, _drives(compute_factor=1.0))
    assert {c.start for c in costs.values()} == {Stage.FILTER}
    assert {c.output_ratio for c in costs.values()} == {None}
    assert costs["d1"].full_s_per_byte == 2e-9
