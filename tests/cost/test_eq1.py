"""ActivePy Eq. 1 is written once (``quarry.cost.eq1``) and every user prices with it.

push down when   DS_raw / BW + CT_host   >   CT_device + DS_processed / BW
"""

import ast
from dataclasses import replace
from pathlib import Path

import pytest

import quarry.cost
from quarry.capacity.model import (
    CapacityInputs,
    HostConfig,
    t_csd_array_s,
    t_csd_system_s,
    t_ssd_array_s,
    t_ssd_system_s,
)
from quarry.cost.eq1 import (
    cut_s_per_byte,
    device_path_s,
    device_path_s_per_byte,
    host_path_s,
    host_path_s_per_byte,
    on_host_share,
    pushes_down,
    transfer_s,
)
from quarry.cost.model import (
    HOST_RUN_S,
    STREAM_DEVICE_S,
    UNIT_RUN_DEVICE_S,
    DeviceFigures,
    HostFigures,
    SubPlanFigures,
    choose,
    estimate,
    handback_s,
    host_share,
)
from quarry.device.controller import Adaptive, declined_for
from quarry.protocol.work import HostCost, Policy

GB = 1e9

# ---- the formula ---------------------------------------------------------------------------


def test_eq1_on_a_slow_device_keeps_the_work_on_the_host() -> None:
    # 1 GB raw over a 1 GB/s link, 0.5 s on the host; the device needs 2 s and ships 10 MB
    host_s = host_path_s(transfer_s(1 * GB, 1 * GB), 0.5)
    device_s = device_path_s(2.0, transfer_s(0.01 * GB, 1 * GB))
    assert host_s == pytest.approx(1.5)
    assert device_s == pytest.approx(2.01)
    assert not pushes_down(host_s, device_s)
    # a device twice as fast makes pushing down pay
    assert pushes_down(host_s, device_path_s(1.0, transfer_s(0.01 * GB, 1 * GB)))


def test_per_byte_prices_are_the_same_sums_per_stored_byte() -> None:
    # half of each stored byte ships raw over 1 GB/s; the host needs 2 ns per byte
    assert host_path_s_per_byte(0.5, 1 * GB, 2e-9) == pytest.approx(2.5e-9)
    assert device_path_s_per_byte(3e-9, 0.01, 1 * GB) == pytest.approx(3.01e-9)
    # filter on the device (1 ns/B), ship a quarter, the host finishes (1 ns/B)
    assert cut_s_per_byte(1e-9, 0.25, 1 * GB, 1e-9) == pytest.approx(2.25e-9)


def test_host_work_stretches_over_the_share_of_the_host_a_device_may_count_on() -> None:
    assert host_share(host_cores=2, devices=4) == 0.5
    assert host_share(host_cores=8, devices=2) == 1.0  # never more than the whole host
    assert host_share(host_cores=2, devices=0) == 1.0
    assert on_host_share(2e-9, 0.5) == pytest.approx(4e-9)
    assert on_host_share(1.0, 0.0) == pytest.approx(1e6)  # no share: prohibitive, not infinite


# ---- the coordinator's choice of cut -------------------------------------------------------

FIGURES = SubPlanFigures(
    full_s_per_byte=1e-9,
    filter_s_per_byte=0.4e-9,
    raw_ratio=0.5,
    filter_ratio=0.1,
    output_ratio=0.001,
)


def _device(compute_factor: float) -> DeviceFigures:
    return DeviceFigures(
        name="d0",
        stored_bytes=int(1 * GB),
        partitions=1,
        compute_factor=compute_factor,
        cores=1,
        internal_bytes_per_s=None,
        external_bytes_per_s=1 * GB,
    )


def test_estimate_prices_each_cut_with_eq1() -> None:
    devices = [_device(compute_factor=4.0)]
    full, filtered, raw = (
        estimate(c, devices, FIGURES, HostFigures(4)) for c in ("full", "filter", "raw")
    )
    # full: 4 s of device compute, 1 MB shipped, and its one engine run's fixed cost
    run_s = UNIT_RUN_DEVICE_S
    assert full.seconds == pytest.approx(device_path_s(4.0, transfer_s(1e6, GB)) + run_s)
    assert full.seconds == pytest.approx(4.003)
    # filter: 1.6 s on the device, 100 MB shipped; the host's 0.15 s overlaps the shipping
    filter_s = device_path_s(1.6, transfer_s(1e8, GB)) + run_s
    assert filtered.per_device_s["d0"] == pytest.approx(filter_s)
    assert (filtered.seconds, filtered.host_s) == pytest.approx((1.702, 0.15))
    # raw: 500 MB shipped, the host's 0.25 s on four cores overlaps it
    assert raw.seconds == pytest.approx(host_path_s(transfer_s(5e8, GB), 0.0))
    assert (raw.seconds, raw.host_s) == pytest.approx((0.5, 0.25))
    assert choose(devices, FIGURES, HostFigures(4)).cut == "raw"


def test_a_fast_device_gets_the_whole_sub_plan() -> None:
    devices = [_device(compute_factor=0.1)]
    choice = choose(devices, FIGURES, HostFigures(4))
    assert choice.cut == "full"
    assert choice.estimates["full"].seconds == pytest.approx(0.103)


def test_ranges_handed_back_cost_a_fetch_each_whatever_their_size() -> None:
    """A small fragment in many ranges: per byte, the host's four cores make handing it back
    the cheapest cut, but every range handed back is a fetch and a run on the host, and those
    outweigh the bytes (TPC-H Q2's part, supplier and nation). A large one is priced as
    before: the fixed costs are nothing beside its bytes."""
    small = [replace(_device(compute_factor=1.0), stored_bytes=4 << 20, handbacks=16)]
    assert choose(small, FIGURES, HostFigures(4)).cut == "full"
    per_byte_only = [replace(small[0], handbacks=0)]
    assert choose(per_byte_only, FIGURES, HostFigures(4)).cut != "full"
    raw = estimate("raw", small, FIGURES, HostFigures(4))
    device_s, host_s = handback_s(16, 4)
    assert raw.per_device_s["d0"] == pytest.approx(transfer_s(2 << 20, GB) + device_s)
    assert raw.host_s == pytest.approx((4 << 20) * 1e-9 / 4 + host_s)
    large = [replace(_device(compute_factor=4.0), handbacks=64)]
    assert choose(large, FIGURES, HostFigures(4)).cut == "raw"


def test_devices_on_the_hosts_own_cores_add_their_work_to_the_hosts() -> None:
    """The embedded default: four unemulated devices on a 2-core machine. Their work does not
    overlap the host's, it adds up on the same cores; so a table of a few kilobytes is cheapest
    read by the host (a stream each, one engine run each), where four separate machines would
    each run it at once; and a large one is cheapest run whole on them, nothing shipped."""
    tiny = [
        replace(_device(1.0), name=f"d{i}", stored_bytes=4096, handbacks=1, shares_host=True)
        for i in range(4)
    ]
    host = HostFigures(2)
    raw, full = estimate("raw", tiny, FIGURES, host), estimate("full", tiny, FIGURES, host)
    run_s, stream_s = UNIT_RUN_DEVICE_S, STREAM_DEVICE_S
    assert full.seconds == pytest.approx(4 * (run_s + 4096e-9 + transfer_s(4.096, GB)) / 2)
    assert raw.seconds == pytest.approx(
        (4 * 4096e-9 + 4 * HOST_RUN_S + 4 * (stream_s + transfer_s(2048, GB))) / 2
    )
    assert choose(tiny, FIGURES, host).cut == "raw"
    apart = [replace(d, shares_host=False) for d in tiny]
    assert choose(apart, FIGURES, host).cut == "full"  # four machines run it at once
    large = [replace(d, stored_bytes=1 << 30) for d in tiny]
    assert choose(large, FIGURES, host).cut == "full"


# ---- the device's run-time decision --------------------------------------------------------


def _controller() -> Adaptive:
    host = HostCost(
        full_s_per_byte=2e-9,
        raw_ratio=0.5,
        filter_ratio=0.2,
        link_bytes_per_s=1 * GB,
        host_share=0.5,
        filter_s_per_byte=0.5e-9,
    )
    load = {"cpu_busy": 0.0, "run_queue": 0.0, "background_load": 0.0}
    return Adaptive(Policy(warmup_chunks=0), host, lambda: load)


def test_device_controller_prices_its_measurements_with_eq1() -> None:
    controller = _controller()
    assert controller.costs() is None  # nothing measured yet
    controller.observe("full", stored_bytes=1000, output_bytes=10, seconds=3e-6)
    controller.observe("filter", stored_bytes=1000, output_bytes=200, seconds=1e-6)
    costs = controller.costs()
    assert costs is not None
    host_s = on_host_share(2e-9, 0.5)
    host_rest_s = on_host_share(1.5e-9, 0.5)
    assert costs["full"] == pytest.approx(device_path_s_per_byte(3e-9, 0.01, GB))
    assert costs["raw"] == pytest.approx(host_path_s_per_byte(0.5, GB, host_s))
    assert costs["filter"] == pytest.approx(cut_s_per_byte(1e-9, 0.2, GB, host_rest_s))
    # in ns per stored byte, as the decision's reason reports them
    assert {k: round(v * 1e9, 3) for k, v in costs.items()} == {
        "full": 3.01,
        "raw": 4.5,
        "filter": 4.2,
    }
    assert pushes_down(costs["raw"], costs["full"])
    assert controller.stage_for(0)[0] == "full"


def test_device_controller_pushes_back_when_the_host_path_is_cheaper() -> None:
    controller = _controller()
    # the device is busy: 20 ns per stored byte for the whole sub-plan
    controller.observe("full", stored_bytes=1000, output_bytes=10, seconds=20e-6)
    controller.observe("full", stored_bytes=1000, output_bytes=10, seconds=20e-6)
    controller.observe("full", stored_bytes=1000, output_bytes=10, seconds=20e-6)
    costs = controller.costs()
    assert costs is not None
    assert not pushes_down(costs["raw"], costs["full"])
    decided = controller.stage_for(0)
    assert decided.stage == "raw"
    assert decided.retry_after_s is not None
    assert decided.pushed_back == "slow"  # nothing else loads the drive: it is the dearer path


def test_a_device_loaded_by_others_pushes_back_as_busy() -> None:
    """Background work on the drive, or work waiting for its cores: the decline is for load."""
    controller = _controller()
    controller.load = lambda: {"cpu_busy": 0.9, "run_queue": 0.0, "background_load": 0.9}
    for _ in range(3):
        controller.observe("full", stored_bytes=1000, output_bytes=10, seconds=20e-6)
    assert controller.stage_for(0).pushed_back == "busy"
    assert declined_for({"cpu_busy": 1.0, "run_queue": 2.0, "background_load": 0.0}) == "busy"
    # its own chunks fill its slots: busy, but not by others
    assert declined_for({"cpu_busy": 1.0, "run_queue": 0.0, "background_load": 0.0}) == "slow"


def test_device_controller_prices_a_range_handed_back_by_its_fixed_costs() -> None:
    """A device that would hand back a small range pays its fetch and the host's run on it,
    spread over the range's bytes: on 4 KB the fixed costs make running it cheaper."""
    controller = _controller()
    for _ in range(3):
        controller.observe("full", stored_bytes=1000, output_bytes=10, seconds=20e-6)
    large, small = controller.costs(handback_bytes=1 << 30), controller.costs(handback_bytes=4096)
    device_s, completer_s = handback_s(1)
    fixed_s = (device_s + on_host_share(completer_s, 0.5)) / 4096
    assert small["raw"] == pytest.approx(controller.costs()["raw"] + fixed_s)
    assert large["raw"] < large["full"] < small["raw"]
    assert controller.stage_for(0, slice_bytes=256, remaining_bytes=4096)[0] == "full"
    assert controller.stage_for(0, slice_bytes=1 << 26, remaining_bytes=1 << 30)[0] == "raw"


# ---- the capacity planner (CSDPLAN Eq. 1, 3, 5, 7) -----------------------------------------

INPUTS = CapacityInputs(t_ssd_tx_s=1.5, t_ssd_comp_s=0.75, t_csd_tx_s=8.0, t_csd_comp_s=3.0)


def test_capacity_systems_are_eq1s_two_sides() -> None:
    host = HostConfig(host_cores=3, sd_tx=2.0)
    # SSD system: the host's transfer (slowed twice) plus its computation over three cores
    assert t_ssd_system_s(INPUTS, host) == pytest.approx(host_path_s(3.0, 0.25))
    assert t_ssd_system_s(INPUTS, host) == pytest.approx(3.25)
    # CSD system: the drive's computation plus its own transfer
    assert t_csd_system_s(INPUTS) == pytest.approx(device_path_s(3.0, 8.0))
    assert t_csd_system_s(INPUTS) == pytest.approx(11.0)
    # one CSD is slower than the host here: Eq. 1 says keep the work on the host
    assert not pushes_down(t_ssd_system_s(INPUTS, host), t_csd_system_s(INPUTS))


def test_capacity_arrays_divide_the_two_sides() -> None:
    host = HostConfig(host_cores=3, sd_tx=2.0, k_limit=8)
    assert t_ssd_array_s(INPUTS, host, 4) == pytest.approx(host_path_s(3.0 / 4, 0.25))
    assert t_csd_array_s(INPUTS, 4) == pytest.approx(device_path_s(3.0, 8.0) / 4)
    # the host's bus saturates at eight SSDs (0.625 s from then on); 32 CSDs take 0.34 s
    assert t_ssd_array_s(INPUTS, host, 32) == pytest.approx(3.0 / 8 + 0.25)
    assert t_csd_array_s(INPUTS, 32) == pytest.approx(11.0 / 32)
    assert not pushes_down(t_ssd_array_s(INPUTS, host, 16), t_csd_array_s(INPUTS, 16))
    assert pushes_down(t_ssd_array_s(INPUTS, host, 32), t_csd_array_s(INPUTS, 32))


# ---- cost/ is a leaf -----------------------------------------------------------------------

FORBIDDEN = ("quarry.coordinator", "quarry.device")


def _imported_modules(path: Path, package: str) -> list[str]:
    """Every module a file imports, anywhere in it (TYPE_CHECKING blocks, function bodies)."""
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            # ``from quarry import coordinator`` imports the room by its name
            modules += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return modules


def test_cost_imports_neither_the_coordinator_nor_the_devices() -> None:
    root = Path(quarry.cost.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert files, root
    offending = []
    for path in files:
        relative = path.relative_to(root.parent).with_suffix("")
        package = ".".join(("quarry", *relative.parts[:-1]))
        for module in _imported_modules(path, package):
            if module.startswith(FORBIDDEN):
                offending.append(f"{path.relative_to(root.parent)}: {module}")
    assert offending == []


def test_the_hosts_ingress_and_speed_bound_every_cut_that_ships_to_it() -> None:
    """Kinetic Pipe's scenarios: a narrow host link or a slow host makes shipping raw rows the
    slow cut, and the model says so."""
    devices = [_device(compute_factor=4.0)]
    narrow = HostFigures(4, link_bytes_per_s=0.1 * GB)
    assert estimate("raw", devices, FIGURES, narrow).seconds == pytest.approx(5.0)  # 500 MB
    assert estimate("full", devices, FIGURES, narrow).seconds == pytest.approx(4.003)
    assert choose(devices, FIGURES, narrow).cut == "filter"  # 100 MB in 1 s, beside 1.7 s
    slow = HostFigures(1, compute_factor=20.0)
    assert estimate("raw", devices, FIGURES, slow).host_s == pytest.approx(20.0)  # 1 GB x 1 ns x 20
    assert choose(devices, FIGURES, slow).cut == "full"


def test_a_sub_plan_that_reads_one_column_reads_its_share() -> None:
    device = _device(compute_factor=0.1)
    device.internal_bytes_per_s = 0.1 * GB
    whole = estimate("full", [device], FIGURES, HostFigures(4))
    one_column = estimate("full", [device], replace(FIGURES, read_ratio=0.2), HostFigures(4))
    assert (whole.seconds, one_column.seconds) == pytest.approx((10.0, 2.0))
