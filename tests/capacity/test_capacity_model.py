"""Execution-time model (CSDPLAN Eq. 1-7) and input validation."""

import math

import pytest

from quarry.capacity.model import (
    CapacityInputError,
    CapacityInputs,
    HostConfig,
    k_limit_from_bus,
    m_ssd,
    t_csd_array_s,
    t_csd_system_s,
    t_ssd_array_s,
    t_ssd_system_s,
)

INPUTS = CapacityInputs(t_ssd_tx_s=1.5, t_ssd_comp_s=0.75, t_csd_tx_s=8.0, t_csd_comp_s=3.0)


def test_ssd_system_is_transfer_plus_computation_split_over_cores() -> None:
    assert t_ssd_system_s(INPUTS, HostConfig(host_cores=1)) == pytest.approx(2.25)
    assert t_ssd_system_s(INPUTS, HostConfig(host_cores=4)) == pytest.approx(1.5 + 0.75 / 4)


def test_overload_slows_each_host_term_but_not_the_csd() -> None:
    overloaded = HostConfig(sd_tx=2.0, sd_comp=3.0)
    assert t_ssd_system_s(INPUTS, overloaded) == pytest.approx(2 * 1.5 + 3 * 0.75)
    assert t_csd_system_s(INPUTS) == pytest.approx(11.0)


def test_csd_array_divides_both_terms_by_the_drive_count() -> None:
    for m in (1, 2, 7, 16):
        assert t_csd_array_s(INPUTS, m) == pytest.approx(11.0 / m)


def test_ssd_array_divides_only_transfer_and_stops_at_k_limit() -> None:
    host = HostConfig(host_cores=1, k_limit=8)
    assert [m_ssd(m, 8) for m in (1, 7, 8, 9, 16)] == [1, 7, 8, 8, 8]
    assert t_ssd_array_s(INPUTS, host, 4) == pytest.approx(1.5 / 4 + 0.75)
    assert t_ssd_array_s(INPUTS, host, 12) == t_ssd_array_s(INPUTS, host, 8)


def test_ratios_match_their_definitions() -> None:
    ratios = INPUTS.ratios(host_cores=2)
    assert ratios.r_tx == pytest.approx(1.5 / 8.0)
    assert ratios.r_comp == pytest.approx((0.75 / 2) / 3.0)
    assert ratios.r_ssd == pytest.approx(1.5 / (0.75 / 2))


def test_inputs_from_ratios_give_back_the_same_ratios() -> None:
    inputs = CapacityInputs.from_ratios(0.43, 0.2, 3.0)
    ratios = inputs.ratios(1)
    assert (ratios.r_tx, ratios.r_comp, ratios.r_ssd) == pytest.approx((0.43, 0.2, 3.0))
    assert inputs.normalized


def test_ratios_measured_on_several_cores_scale_to_one_core() -> None:
    inputs = CapacityInputs.from_ratios(1.0, 0.5, 2.0, host_cores_measured=4)
    assert inputs.ratios(4).r_comp == pytest.approx(0.5)
    assert inputs.ratios(1).r_comp == pytest.approx(2.0)


def test_scaled_csd_is_faster_by_the_given_factors() -> None:
    faster = INPUTS.scaled(csd_io_factor=2.0, csd_compute_factor=3.0)
    assert (faster.t_csd_tx_s, faster.t_csd_comp_s) == (4.0, 1.0)
    assert (faster.t_ssd_tx_s, faster.t_ssd_comp_s) == (1.5, 0.75)


def test_k_limit_from_the_papers_bus() -> None:
    assert k_limit_from_bus(32e9, 4e9) == 8


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"t_ssd_tx_s": None}, "t_ssd_tx_s"),
        ({"t_csd_comp_s": None}, "t_csd_comp_s"),
        ({"t_ssd_tx_s": -1.0}, "t_ssd_tx_s"),
        ({"t_csd_tx_s": -0.5}, "t_csd_tx_s"),
        ({"t_ssd_comp_s": 0.0}, "t_ssd_comp_s"),
        ({"t_csd_comp_s": math.nan}, "t_csd_comp_s"),
        ({"t_csd_tx_s": "fast"}, "t_csd_tx_s"),
        ({"t_csd_tx_s": 0.0, "t_csd_comp_s": 0.0}, "t_csd_tx_s"),
        ({"data_bytes": 0}, "data_bytes"),
    ],
)
def test_bad_times_name_the_field(values: dict, field: str) -> None:
    arguments = {**INPUTS.to_dict(), **values}
    with pytest.raises(CapacityInputError) as raised:
        CapacityInputs(**arguments)
    assert raised.value.field == field
    assert field in str(raised.value)
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize(
    ("ratios", "field"),
    [
        ((0.0, 1.0, 1.0), "r_tx"),
        ((1.0, 0.0, 1.0), "r_comp"),
        ((1.0, 1.0, 0.0), "r_ssd"),
        ((1.0, -2.0, 1.0), "r_comp"),
        ((None, 1.0, 1.0), "r_tx"),
    ],
)
def test_a_ratio_of_zero_or_less_names_the_ratio(ratios: tuple, field: str) -> None:
    with pytest.raises(CapacityInputError, match=f"^{field}: "):
        CapacityInputs.from_ratios(*ratios)


@pytest.mark.parametrize(
    ("host", "field"),
    [
        ({"k_limit": 0}, "k_limit"),
        ({"k_limit": -3}, "k_limit"),
        ({"host_cores": 0}, "host_cores"),
        ({"sd_tx": 0.5}, "sd_tx"),
        ({"sd_comp": 0.0}, "sd_comp"),
        ({"k_limit": 2.5}, "k_limit"),
    ],
)
def test_bad_host_configuration_names_the_field(host: dict, field: str) -> None:
    with pytest.raises(CapacityInputError, match=f"^{field}: "):
        HostConfig(**host)


def test_inputs_from_a_mapping_accept_times_or_ratios_and_reject_neither() -> None:
    assert CapacityInputs.from_mapping(INPUTS.to_dict()) == INPUTS
    from_ratios = CapacityInputs.from_mapping({"r_tx": 1.5, "r_comp": 0.5, "r_ssd": 2.0})
    assert from_ratios.ratios(1).r_ssd == pytest.approx(2.0)
    with pytest.raises(CapacityInputError, match="^t_csd_comp_s: missing"):
        CapacityInputs.from_mapping({"t_ssd_tx_s": 1, "t_ssd_comp_s": 1, "t_csd_tx_s": 1})
    with pytest.raises(CapacityInputError, match="^inputs: "):
        CapacityInputs.from_mapping({"speed": 3})


def test_inputs_from_kernel_runs_need_a_one_thread_host_run() -> None:
    host = {"threads": 1, "transfer_s": 0.2, "compute_s": 0.4, "bytes": 1000}
    device = {"threads": 4, "transfer_s": 0.1, "compute_s": 0.9}
    inputs = CapacityInputs.from_kernel_runs(host, device)
    assert (inputs.t_ssd_tx_s, inputs.t_ssd_comp_s, inputs.t_csd_tx_s, inputs.t_csd_comp_s) == (
        0.2,
        0.4,
        0.1,
        0.9,
    )
    assert inputs.data_bytes == 1000
    with pytest.raises(CapacityInputError, match="^host.threads: "):
        CapacityInputs.from_kernel_runs({**host, "threads": 8}, device)
