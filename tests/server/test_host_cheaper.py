"""A storage server's Eq. 1 one level up: complete a drive's push-back here, or pass it on."""

from __future__ import annotations

from dataclasses import replace

from quarry.protocol.stage import Stage
from quarry.protocol.work import HostCost
from quarry.server.work import SERVER_BUSY, host_cheaper

HOST = HostCost(
    full_s_per_byte=1e-9,
    raw_ratio=0.5,
    filter_ratio=0.05,
    link_bytes_per_s=1e9,
    host_share=0.5,
    filter_s_per_byte=0.4e-9,
    device_full_s_per_byte=1e-9,
)


def test_an_idle_server_as_fast_as_the_host_completes_and_a_busy_one_passes_on() -> None:
    assert not host_cheaper(HOST, Stage.RAW, busy=0.0)
    assert not host_cheaper(HOST, Stage.FILTER, busy=0.0)
    assert host_cheaper(HOST, Stage.RAW, busy=0.95)


def test_a_slow_server_passes_on_to_a_fast_host_over_a_fast_network() -> None:
    slow = replace(HOST, device_full_s_per_byte=20e-9)
    assert host_cheaper(slow, Stage.RAW, busy=0.0)
    narrow = replace(slow, link_bytes_per_s=1e6)  # raw would crawl
    assert not host_cheaper(narrow, Stage.RAW, busy=0.0)


def test_without_an_estimate_of_its_own_cost_a_server_goes_by_how_busy_it_is() -> None:
    unknown = replace(HOST, device_full_s_per_byte=0.0)
    assert not host_cheaper(unknown, Stage.RAW, busy=SERVER_BUSY - 0.01)
    assert host_cheaper(unknown, Stage.RAW, busy=SERVER_BUSY)
