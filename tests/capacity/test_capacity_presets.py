"""The paper's workloads as presets reproduce every break-even point its text states."""

import json
from pathlib import Path

import pytest

from quarry.capacity.break_even import break_even
from quarry.capacity.model import CapacityInputError, HostConfig
from quarry.capacity.presets import PRESETS, WORKLOADS, load_inputs, preset
from quarry.capacity.sweep import combinations_for_bep, csd_surface


def bep(name: str, **host: object) -> int:
    return break_even(preset(name), HostConfig(**host)).bep


def test_count_on_smartssd_meets_host_1_4_16_at_2_8_13() -> None:
    """Figure 7(a): Host(1,2) meets CSD-S(2), Host(4) meets CSD-S(8), Host(16) CSD-S(13)."""
    assert [bep("count-smartssd", host_cores=n) for n in (1, 4, 16)] == [2, 8, 13]


def test_count_and_array_merge_on_newport_meet_host_1_at_12() -> None:
    """Figure 7(a) and 7(c)."""
    assert bep("count-newport") == 12
    assert bep("array_merge-newport") == 12


def test_array_merge_needs_more_than_16_csds_against_4_or_more_cores() -> None:
    """Figure 7(c): Host(4), Host(16), Host(64) are not met within 16 drives."""
    for device in ("newport", "smartssd"):
        assert all(bep(f"array_merge-{device}", host_cores=n) > 16 for n in (4, 16, 64))
    assert bep("array_merge-smartssd") > bep("array_merge-newport")


def test_array_merge_on_newport_with_a_2x_slower_host_cpu_needs_6() -> None:
    """Figure 15 and Table 4 (A); a 3x slower CPU needs 4 by Eq. 13 (the paper prints 8)."""
    assert bep("array_merge-newport", sd_comp=2.0) == 6
    assert bep("array_merge-newport", sd_comp=3.0) == 4


def test_vector_addition_on_smartssd_is_5_and_1_with_a_5x_faster_fpga() -> None:
    """§1: "the BEP for Vector Addition would be 5 for SmartSSDs ... 1 if ... 5x"."""
    inputs = preset("vector_addition-smartssd")
    assert break_even(inputs, HostConfig()).bep == 5
    assert break_even(inputs.scaled(csd_compute_factor=5.0), HostConfig()).bep == 1


def test_vector_addition_on_newport_has_the_bep_4_stars_of_figure_10() -> None:
    surface = csd_surface(preset("vector_addition-newport"), HostConfig(), range(1, 11))
    combinations = combinations_for_bep(surface, 4)
    corners = [(c["x"], c["y"], c["bep"]) for c in combinations["corners"]]
    assert corners == [(2, 7, 4), (3, 4, 4), (4, 3, 4), (8, 2, 4)]
    assert {"x": 2.0, "y": 7.0} in combinations["exact"]


def test_throughput_ratios_between_devices_follow_section_4_2_3() -> None:
    """Newport is 2.2x SmartSSD on Array Merge, 10x on Page Rank; the host is far ahead on it."""

    def csd_time_s(name: str) -> float:
        inputs = PRESETS[name]
        return inputs.t_csd_tx_s + inputs.t_csd_comp_s

    assert csd_time_s("array_merge-smartssd") / csd_time_s("array_merge-newport") == (
        pytest.approx(2.2, rel=0.01)
    )
    assert csd_time_s("pagerank-smartssd") / csd_time_s("pagerank-newport") == (
        pytest.approx(10.0, rel=0.01)
    )
    pagerank = PRESETS["pagerank-newport"]
    assert pagerank.t_ssd_comp_s / (pagerank.t_ssd_tx_s + pagerank.t_ssd_comp_s) > 0.99


def test_every_workload_has_both_devices_and_one_host() -> None:
    assert len(PRESETS) == 2 * len(WORKLOADS) == 8
    for workload in WORKLOADS.values():
        hosts = {
            (
                PRESETS[f"{workload.kernel}-{d}"].t_ssd_tx_s,
                PRESETS[f"{workload.kernel}-{d}"].t_ssd_comp_s,
            )
            for d in workload.devices
        }
        assert len(hosts) == 1


def test_unknown_preset_lists_the_choices() -> None:
    with pytest.raises(CapacityInputError, match="count-newport"):
        preset("count-nvme")


def test_load_inputs_reads_one_object_or_a_named_workload(tmp_path: Path) -> None:
    single = tmp_path / "single.json"
    single.write_text(
        json.dumps({"t_ssd_tx_s": 1, "t_ssd_comp_s": 2, "t_csd_tx_s": 1, "t_csd_comp_s": 4})
    )
    assert load_inputs(single).t_csd_comp_s == 4.0
    calibrated = tmp_path / "calibrated.json"
    calibrated.write_text(
        json.dumps(
            {
                "workloads": {
                    "scan": {"r_tx": 2.0, "r_comp": 0.5, "r_ssd": 1.0},
                    "sum": {"t_ssd_tx_s": 1, "t_ssd_comp_s": 1, "t_csd_tx_s": 1, "t_csd_comp_s": 1},
                }
            }
        )
    )
    assert load_inputs(calibrated, "scan").ratios(1).r_tx == pytest.approx(2.0)
    assert load_inputs(calibrated, "sum").name == "sum"
    with pytest.raises(CapacityInputError, match="^workload: .*scan, sum"):
        load_inputs(calibrated)
    with pytest.raises(CapacityInputError, match="^workload: "):
        load_inputs(calibrated, "join")


def test_load_inputs_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(CapacityInputError, match="^inputs: no such file"):
        load_inputs(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(CapacityInputError, match="^inputs: .*not valid JSON"):
        load_inputs(broken)
    negative = tmp_path / "negative.json"
    negative.write_text(
        json.dumps({"t_ssd_tx_s": 1, "t_ssd_comp_s": 1, "t_csd_tx_s": -1, "t_csd_comp_s": 1})
    )
    with pytest.raises(CapacityInputError, match="^t_csd_tx_s: must be >= 0"):
        load_inputs(negative)
