"""Break-even point: Eq. 8, 9, 12, 13 agree; BEP >= 1; k_limit as in Figure 8."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quarry.capacity.break_even import (
    bep_eq8,
    bep_eq12,
    bep_eq13,
    break_even,
    ceil_bep,
    eq13_value,
)
from quarry.capacity.model import (
    CapacityInputError,
    CapacityInputs,
    HostConfig,
    overloaded_host,
    t_csd_array_s,
    t_ssd_array_s,
)
from quarry.capacity.presets import PRESETS

times = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)
slow_downs = st.floats(min_value=1.0, max_value=20.0, allow_nan=False)
cores = st.integers(min_value=1, max_value=128)


def scan_bep(inputs: CapacityInputs, host: HostConfig, devices_max: int = 100_000) -> int:
    """The definition: the least m with T_CSD-array(m) <= T_SSD(n)-array(m) (Eq. 5-7)."""
    for m in range(1, devices_max + 1):
        if t_csd_array_s(inputs, m) <= t_ssd_array_s(inputs, host, m) * (1 + 1e-9):
            return m
    raise AssertionError("no break-even point below devices_max")


@settings(max_examples=300, deadline=None)
@given(times, times, times, times, cores)
def test_eq12_in_ratio_form_equals_eq9_in_time_form(tx, comp, csd_tx, csd_comp, n) -> None:
    inputs = CapacityInputs(tx, comp, csd_tx, csd_comp)
    ratios = inputs.ratios(n)
    assert bep_eq12(ratios.r_tx, ratios.r_comp, ratios.r_ssd) == bep_eq8(
        inputs, HostConfig(host_cores=n)
    )


@settings(max_examples=300, deadline=None)
@given(times, times, times, times, cores, slow_downs, slow_downs)
def test_eq13_equals_eq8_with_slow_downs(tx, comp, csd_tx, csd_comp, n, sd_tx, sd_comp) -> None:
    inputs = CapacityInputs(tx, comp, csd_tx, csd_comp)
    host = HostConfig(host_cores=n, sd_tx=sd_tx, sd_comp=sd_comp)
    ratios = inputs.ratios(n)
    numerator = csd_tx + csd_comp - sd_tx * tx
    denominator = sd_comp * comp / n
    assert eq13_value(ratios.r_tx, ratios.r_comp, ratios.r_ssd, sd_tx, sd_comp) == pytest.approx(
        numerator / denominator, rel=1e-9, abs=1e-9
    )
    assert bep_eq13(ratios.r_tx, ratios.r_comp, ratios.r_ssd, sd_tx, sd_comp) == bep_eq8(
        inputs, host
    )


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 100), st.floats(0.01, 100), st.floats(0.01, 100))
def test_eq13_without_overload_reduces_to_eq12(r_tx, r_comp, r_ssd) -> None:
    assert bep_eq13(r_tx, r_comp, r_ssd, 1.0, 1.0) == bep_eq12(r_tx, r_comp, r_ssd)


@settings(max_examples=300, deadline=None)
@given(times, times, times, times, cores, slow_downs, slow_downs, st.integers(1, 32))
def test_break_even_is_the_first_drive_count_where_csds_win(
    tx, comp, csd_tx, csd_comp, n, sd_tx, sd_comp, k_limit
) -> None:
    inputs = CapacityInputs(tx, comp, csd_tx, csd_comp)
    host = HostConfig(host_cores=n, k_limit=k_limit, sd_tx=sd_tx, sd_comp=sd_comp)
    result = break_even(inputs, host)
    if result.bep <= 20_000:
        assert result.bep == scan_bep(inputs, host)
    assert result.bep >= 1
    assert result.bep <= result.bep_eq8
    # Below k_limit the bus cap is irrelevant, so Eq. 8 is exact.
    if result.bep_eq8 <= k_limit:
        assert result.bep == result.bep_eq8
        assert not result.k_limit_binds


def test_bep_is_never_below_one_even_when_one_csd_beats_the_host() -> None:
    fast_csd = CapacityInputs(t_ssd_tx_s=10.0, t_ssd_comp_s=10.0, t_csd_tx_s=0.1, t_csd_comp_s=0.1)
    ratios = fast_csd.ratios(1)
    assert eq13_value(ratios.r_tx, ratios.r_comp, ratios.r_ssd, 1.0, 1.0) < 0
    assert bep_eq8(fast_csd, HostConfig()) == 1
    assert break_even(fast_csd, HostConfig()).bep == 1
    assert bep_eq12(ratios.r_tx, ratios.r_comp, ratios.r_ssd) == 1
    assert bep_eq13(ratios.r_tx, ratios.r_comp, ratios.r_ssd, 5.0, 5.0) == 1


def test_a_tie_counts_as_break_even() -> None:
    # 0.1 * 3 is 0.30000000000000004 in binary; the tie at exactly 3 drives must still be 3.
    inputs = CapacityInputs(t_ssd_tx_s=0.0, t_ssd_comp_s=0.1, t_csd_tx_s=0.0, t_csd_comp_s=0.3)
    assert ceil_bep(0.1 * 3 / 0.1) == 3
    assert break_even(inputs, HostConfig()).bep == 3


def test_k_limit_caps_the_ssd_array_as_in_figure_8() -> None:
    """Count on SmartSSD against Host(16): k_limit 8 meets CSD-S(13); 12 and 16 only after 16."""
    count = PRESETS["count-smartssd"]
    breaks = {k: break_even(count, HostConfig(host_cores=16, k_limit=k)).bep for k in (8, 12, 16)}
    assert breaks[8] == 13
    assert breaks[12] > 16 and breaks[16] > 16
    assert breaks[8] < breaks[12] < breaks[16]
    # Eq. 8 alone has no k_limit, so it cannot tell these apart: all three are its 31.
    assert {break_even(count, HostConfig(16, k)).bep_eq8 for k in (8, 12, 16)} == {31}
    for k in (8, 12, 16):
        host = HostConfig(host_cores=16, k_limit=k)
        flat = [t_ssd_array_s(count, host, m) for m in range(k, 25)]
        assert len(set(flat)) == 1, "the SSD array gains nothing past k_limit"
        rising = [t_ssd_array_s(count, host, m) for m in range(1, k + 1)]
        assert rising == sorted(rising, reverse=True) and len(set(rising)) == k


def test_break_even_reports_the_terms() -> None:
    result = break_even(PRESETS["count-newport"], HostConfig())
    assert result.bep == 12 and result.bep_eq8 == 13 and result.k_limit_binds
    assert result.eq8_numerator_s == pytest.approx(8.0 + 3.0 - 1.5)
    assert result.eq8_denominator_s == pytest.approx(0.75)
    assert result.capped_value == pytest.approx(11.0 / (1.5 / 8 + 0.75))
    assert result.t_csd_array_at_bep_s <= result.t_ssd_array_at_bep_s
    assert result.t_csd_array_before_bep_s > result.t_ssd_array_before_bep_s
    assert result.to_dict()["ratios"]["r_ssd"] == pytest.approx(2.0)


def test_ratio_form_rejects_zero_and_slow_downs_below_one() -> None:
    with pytest.raises(CapacityInputError, match="^r_comp: "):
        bep_eq12(1.0, 0.0, 1.0)
    with pytest.raises(CapacityInputError, match="^sd_tx: "):
        bep_eq13(1.0, 1.0, 1.0, 0.5, 1.0)
    assert math.isclose(eq13_value(2.0, 0.5, 4.0, 1.0, 2.0), ((0.5 - 1.0) * 4.0 + 2.0) / 2.0)


def test_an_absurd_break_even_point_is_an_error_not_a_crash() -> None:
    hopeless = CapacityInputs(
        t_ssd_tx_s=0.0, t_ssd_comp_s=1e-300, t_csd_tx_s=1e10, t_csd_comp_s=1.0
    )
    with pytest.raises(CapacityInputError, match="^inputs: the break-even point is"):
        break_even(hopeless, HostConfig())


def test_slow_down_factors_measured_on_the_host_give_the_papers_overload_bep() -> None:
    """§4.5 / Figure 15: Array Merge on Newport CSDs needs 6 drives against a 2x slower host CPU;
    the same host measured at twice the computation time gives sd_comp = 2 and that BEP."""
    normal = PRESETS["array_merge-newport"]
    slower_cpu = CapacityInputs(
        normal.t_ssd_tx_s,
        2 * normal.t_ssd_comp_s,
        normal.t_csd_tx_s,
        normal.t_csd_comp_s,
        normal.data_bytes,
    )
    host = overloaded_host(normal, slower_cpu, HostConfig(host_cores=1, k_limit=8))
    assert (host.sd_tx, host.sd_comp) == (1.0, pytest.approx(2.0))
    assert break_even(normal, host).bep == 6
    ratios = normal.ratios(1)
    assert bep_eq13(ratios.r_tx, ratios.r_comp, ratios.r_ssd, host.sd_tx, host.sd_comp) == 6


def test_a_host_measured_faster_under_overload_is_not_slowed() -> None:
    normal = PRESETS["count-newport"]
    quicker = CapacityInputs(
        0.9 * normal.t_ssd_tx_s,
        normal.t_ssd_comp_s,
        normal.t_csd_tx_s,
        normal.t_csd_comp_s,
        normal.data_bytes,
    )
    host = overloaded_host(normal, quicker, HostConfig())
    assert (host.sd_tx, host.sd_comp) == (1.0, 1.0)
    with pytest.raises(CapacityInputError, match="same working set"):
        overloaded_host(normal, CapacityInputs(1, 1, 1, 1, data_bytes=10), HostConfig())
