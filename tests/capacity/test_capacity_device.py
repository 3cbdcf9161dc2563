"""The §4 kernels as device programs and the measurement of CSDPLAN's inputs, on real devices.

Two kinetic devices (15x slower compute, 261 MB/s internal read, 2 cores) run as processes on
loopback; every test reads small working sets so the module takes seconds.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

import quarry
from quarry.capacity.break_even import break_even
from quarry.capacity.cli import app
from quarry.capacity.device import CapacityProgramError
from quarry.capacity.kernel_data import as_table, make_inputs
from quarry.capacity.measure import (
    dataset_name,
    ingest_kernel_inputs,
    measure_kernel,
    pagerank_blocks_table,
    run_devices,
    run_host,
)
from quarry.capacity.model import HostConfig
from quarry.coordinator.admin.calibrate import CALIBRATION_KEY
from quarry.coordinator.processes.local import LocalCluster
from quarry.device.emulation import BUCKET_BURST_S
from quarry.errors import DatasetNotFound, QuarryError

KINETIC_COMPUTE_FACTOR = 15.0
KINETIC_INTERNAL_BYTES_PER_S = 261e6
COUNT_BYTES = 4 << 20


@pytest.fixture(scope="module")
def kinetic() -> Iterator[LocalCluster]:
    with quarry.local(devices=2, profile="kinetic") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def count_dataset(kinetic: LocalCluster) -> str:
    return ingest_kernel_inputs(kinetic, "count", COUNT_BYTES).qualified


def test_count_program_counts_every_row_of_its_partition(
    kinetic: LocalCluster, count_dataset: str
) -> None:
    entry = kinetic.entry(count_dataset)
    assert len(entry.partitions) == 2  # one partition per device: the working set is spread
    values = make_inputs("count", COUNT_BYTES)["values"]
    total = 0
    for partition in entry.partitions:
        (device,) = partition.devices
        table, summary = kinetic.devices[device].program(
            "capacity.count",
            {
                "domain": entry.domain,
                "dataset": entry.name,
                "partition": partition.partition,
                "threads": 2,
                "params": {"value": 7},
            },
        )
        assert table.column("rows").to_pylist() == [partition.rows] == [summary["rows"]]
        assert summary["result"] == table.column("count")[0].as_py()
        assert summary["threads"] == 2 and summary["cores"] == 2
        # The data transfer (store -> the drive's memory) and the computation are timed apart.
        assert summary["transfer_s"] > 0 and summary["compute_s"] > 0
        assert summary["bytes_read"] >= summary["bytes"] == 4 * partition.rows
        total += summary["result"]
    assert total == int(np.count_nonzero(values == 7))


def test_counting_a_value_every_row_holds_counts_every_row(kinetic: LocalCluster) -> None:
    rows = 300_000
    entry = kinetic.ingest(
        pa.table({"values": np.full(rows, 5, dtype=np.int32)}), "capacity/fives", partitions=2
    )
    for threads in (1, 2, 3):
        run = run_devices(kinetic, entry.qualified, "count", threads=threads, params={"value": 5})
        assert run.result == run.rows == rows
        assert [d["threads"] for d in run.per_device] == [threads, threads]


def test_the_host_and_the_drives_agree_and_only_results_cross_the_link(
    kinetic: LocalCluster, count_dataset: str
) -> None:
    host = run_host(kinetic, count_dataset, "count")
    drives = run_devices(kinetic, count_dataset, "count", threads=2)
    rows = kinetic.entry(count_dataset).rows
    assert (
        host.result
        == drives.result
        == int(np.count_nonzero(make_inputs("count", COUNT_BYTES)["values"] == 0))
    )
    assert host.rows == drives.rows == rows and host.devices == drives.devices == 2
    # The host path ships the raw working set; the drives ship a few rows of counts.
    assert host.bytes_to_host >= host.bytes == 4 * rows
    assert drives.bytes_to_host < 10_000
    assert all(d["transfer_s"] > 0 and d["compute_s"] > 0 for d in drives.per_device)


def test_the_emulated_compute_factor_shows_in_the_measured_inputs(kinetic: LocalCluster) -> None:
    measurement = measure_kernel(kinetic, "count", 16 << 20, device="dev1", repeat=3)
    inputs = measurement.inputs
    assert measurement.device == "dev1" and measurement.profile == "kinetic"
    assert measurement.device_threads == 2  # kinetic's cores
    assert inputs.name == "count-kinetic" and inputs.data_bytes == 16 << 20
    # The drive computes 15x slower per core and uses both cores: about 7.5x the host's one
    # core. (Loose bounds: the host's few milliseconds move with whatever else runs.)
    host_one_core_s = min(run.compute_s for run in measurement.host_runs)
    ratio = inputs.t_csd_comp_s / host_one_core_s
    assert KINETIC_COMPUTE_FACTOR / 2 / 2.5 < ratio < KINETIC_COMPUTE_FACTOR / 2 * 2.5, ratio
    # Its data transfer runs at the profile's internal read rate (a bucket that was idle lends
    # up to BUCKET_BURST_S of credit, which shows on a transfer this short).
    fastest_s = inputs.data_bytes / KINETIC_INTERNAL_BYTES_PER_S - BUCKET_BURST_S
    assert 0.98 * fastest_s < inputs.t_csd_tx_s < 1.5 * (fastest_s + BUCKET_BURST_S)
    # Every run of both systems gave the same answer, and the model takes the inputs as they are.
    answers = {run.result for run in measurement.host_runs + measurement.device_runs}
    assert len(answers) == 1
    assert break_even(inputs, HostConfig(host_cores=1, k_limit=8)).bep >= 1


def test_threads_use_the_drives_cores_and_queue_beyond_them(kinetic: LocalCluster) -> None:
    # 128 MiB: about 0.1 s of one drive core. At 32 MiB (25 ms) one run in five of either
    # thread count landed a scheduler's slice away from the others, and two threads measured
    # 0.75-0.96 of one now and then. A first run warms the drives; the counts then take turns.
    dataset = ingest_kernel_inputs(kinetic, "count", 128 << 20).qualified
    run_devices(kinetic, dataset, "count", threads=1)
    runs: dict[int, list[float]] = {1: [], 2: [], 4: []}
    for _ in range(3):
        for threads, seconds in runs.items():
            seconds.append(run_devices(kinetic, dataset, "count", threads=threads).compute_s)
    one, two, four = (statistics.median(runs[threads]) for threads in (1, 2, 4))
    assert two < 0.8 * one  # two cores: the pieces run two at a time
    assert four > 0.7 * two  # still two cores: more threads only queue


@pytest.mark.parametrize("kernel", ["vector_addition", "array_merge"])
def test_vector_addition_and_array_merge_match_on_host_and_drives(
    kinetic: LocalCluster, kernel: str
) -> None:
    entry = ingest_kernel_inputs(kinetic, kernel, 1 << 20)
    host = run_host(kinetic, entry.qualified, kernel, threads=2)
    drives = run_devices(kinetic, entry.qualified, kernel, threads=2)
    assert host.result == drives.result
    partition = entry.partitions[0]
    (device,) = partition.devices
    raw = kinetic.devices[device].scan(entry.domain, entry.name, partition.partition).read_all()
    raw = raw.to_pydict()
    table, _ = kinetic.devices[device].program(
        f"capacity.{kernel}",
        {
            "domain": entry.domain,
            "dataset": entry.name,
            "partition": partition.partition,
            "output": "full",
        },
    )
    if kernel == "vector_addition":
        expected = (np.array(raw["a"]) + np.array(raw["b"])).tolist()
    else:  # each partition holds sorted runs of both inputs (row groups dealt in order)
        expected = np.union1d(raw["left"], raw["right"]).tolist()
    assert table.column("value").to_pylist() == expected


def test_pagerank_runs_on_the_drive_holding_the_whole_matrix(kinetic: LocalCluster) -> None:
    inputs = make_inputs("pagerank", 40_000, seed=3)
    entry = ingest_kernel_inputs(kinetic, "pagerank", 40_000, seed=3)
    assert len(entry.partitions) == 1
    drives = run_devices(kinetic, entry.qualified, "pagerank", params={"iterations": 30})
    host = run_host(kinetic, entry.qualified, "pagerank", params={"iterations": 30})
    matrix, rank = inputs["matrix"].astype(np.float64), inputs["rank"].astype(np.float64)
    for _ in range(30):
        rank = 0.85 * matrix @ rank + 0.15 / len(rank)
    np.testing.assert_allclose(drives.result, rank, rtol=1e-4)
    np.testing.assert_allclose(host.result, rank, rtol=1e-4)

    split = kinetic.ingest(as_table(inputs), "capacity/pagerank_split", partitions=2)
    with pytest.raises(CapacityProgramError, match="one partition"):
        run_devices(kinetic, split.qualified, "pagerank")


def test_pagerank_blocks_give_each_drive_a_whole_graph(kinetic: LocalCluster) -> None:
    """One graph per drive: each partition is a whole block (its ranks sum to 1), the host and
    the drives agree, and the union's ranks are the graphs' shared equally."""
    data_bytes = 8 << 20  # blocks wider than one row group: rows arrive in several groups
    entry = ingest_kernel_inputs(
        kinetic, "pagerank", data_bytes, "capacity/pagerank_blocks", pagerank_blocks=True
    )
    assert len(entry.partitions_by_device()) == 2 and len(entry.partitions) == 2
    host = run_host(kinetic, entry.qualified, "pagerank", params={"iterations": 10})
    drives = run_devices(kinetic, entry.qualified, "pagerank", params={"iterations": 10})
    np.testing.assert_allclose(drives.result, host.result, rtol=1e-5)
    assert host.result.sum() == pytest.approx(1.0, rel=1e-4)
    width = entry.partitions[0].rows
    for block in (host.result[:width], host.result[width:]):
        assert 2 * block.sum() == pytest.approx(1.0, rel=1e-4)
    table = pagerank_blocks_table(data_bytes, 2)
    assert table.num_rows == 2 * width and table.column("matrix").type.list_size == width


def test_bad_requests_name_what_is_wrong(kinetic: LocalCluster, count_dataset: str) -> None:
    entry = kinetic.entry(count_dataset)
    partition = entry.partitions[0]
    client = kinetic.devices[partition.devices[0]]
    base = {"domain": entry.domain, "dataset": entry.name, "partition": partition.partition}
    with pytest.raises(CapacityProgramError, match="threads: must be at least 1"):
        client.program("capacity.count", {**base, "threads": 0})
    with pytest.raises(QuarryError, match="'partition'"):
        client.program("capacity.count", {"domain": entry.domain, "dataset": entry.name})
    with pytest.raises(DatasetNotFound):
        client.program("capacity.count", {**base, "dataset": "nothing_here"})
    # A dataset that is not the kernel's input: the message names the missing column.
    with pytest.raises(CapacityProgramError, match="missing"):
        client.program("capacity.vector_addition", base)


def test_measure_command_on_a_live_cluster(kinetic: LocalCluster, tmp_path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "measure",
            "--kernel",
            "count",
            "--bytes",
            str(COUNT_BYTES),
            "--repeat",
            "1",
            "--cluster",
            str(kinetic.cluster_file),
            "--device",
            "dev0",
            "--json",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["device"] == "dev0" and document["source"] == "kernel runs"
    assert all(
        document["inputs"][f"t_{k}_s"] > 0 for k in ("ssd_tx", "ssd_comp", "csd_tx", "csd_comp")
    )
    assert document["result"]["bep"] >= 1
    # The inputs file it writes is what `bep --inputs` reads.
    inputs_file = tmp_path / "measured.json"
    again = runner.invoke(
        app, ["bep", "--inputs", str(inputs_file), "-w", "count-kinetic", "--json"]
    )
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["result"]["bep"] == document["result"]["bep"]


def test_measure_command_from_a_stored_calibration(kinetic: LocalCluster) -> None:
    # What `quarry calibrate` stores on a device (measuring it for real takes a minute).
    report = {
        "device": "dev1",
        "profile": "kinetic",
        "compute_factor": {"expected": 15.0, "measured": 14.0},
        "internal_bytes_per_s": {"expected": 261e6, "measured": 250e6},
        "external_bytes_per_s": {"expected": 312.5e6, "measured": 300e6},
    }
    kinetic.devices["dev1"].kv_put(CALIBRATION_KEY, json.dumps(report).encode())
    result = CliRunner().invoke(
        app,
        [
            "measure",
            "--kernel",
            "count",
            "--bytes",
            str(COUNT_BYTES),
            "--repeat",
            "1",
            "--cluster",
            str(kinetic.cluster_file),
            "--device",
            "dev1",
            "--from-calibration",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    inputs = json.loads(result.output)["inputs"]
    assert inputs["t_csd_tx_s"] == pytest.approx(COUNT_BYTES / 250e6)
    assert inputs["t_ssd_tx_s"] == pytest.approx(COUNT_BYTES / 250e6)  # the slower of the two
    # Two device threads: the host's two-thread time, 14x.
    assert inputs["t_csd_comp_s"] > inputs["t_ssd_comp_s"]

    missing = CliRunner().invoke(
        app,
        [
            "measure",
            "--kernel",
            "count",
            "--cluster",
            str(kinetic.cluster_file),
            "--device",
            "dev0",
            "--from-calibration",
        ],
    )
    assert missing.exit_code == 2
    assert "run `quarry calibrate` first" in " ".join(missing.output.split())


def test_measure_command_without_a_cluster_says_what_to_do(tmp_path) -> None:
    result = CliRunner().invoke(
        app, ["measure", "--kernel", "count", "--cluster", str(tmp_path / "none.json")]
    )
    assert result.exit_code == 2
    message = " ".join(result.output.split())
    assert "quarry up" in message and "--host-only" in message


def test_dataset_names_say_what_they_hold() -> None:
    assert dataset_name("count", 4096) == "capacity/count_4096"
    assert dataset_name("count", 4096, "dev0") == "capacity/count_4096_dev0"
