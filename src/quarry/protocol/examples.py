"""One valid message of every class, filled in: the protocol's tests check that each comes
back as it left (and that no class lacks one); the fuzzer mutates their frames. Built here and
never sent."""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from quarry.protocol import control, ingest, work
from quarry.protocol.counters import WorkCounters
from quarry.protocol.message import Message
from quarry.protocol.stage import PushBack, Skip, Stage

SCHEMA = pa.schema([("id", pa.int64()), ("ke", pa.float64())])
RECORD = control.IngestRecord("abc", 0, 4, 1, "create", 1.5, {"0": ["dev0"]}, "p.parquet")

EXAMPLES: list[Message] = [
    dataclasses.replace(
        RECORD, redundancy="ec:2+1", stripes=(control.StripeGroup((0, 1), (5000,)),)
    ),
    control.Hello(),
    control.HelloReply(
        2,
        "id",
        "dev0",
        control.ProfileInfo("kinetic", cores=2),
        7,
        "/d",
        1.0,
        "device",
        True,
        host="10.0.0.2",
        rack="r1",
        revocations=3,
        peers=2,
    ),
    control.Inventory(),
    control.InventoryReply(
        [control.PartitionSummary("d", "t", 0, RECORD, SCHEMA, rows=3)],
        drives_down=("s0d2",),
        generation="b0a1:12",
    ),
    control.PartitionRef("d", "t", 3),
    control.PartitionDescription(
        control.PartitionSummary("d", "t", 0, RECORD, SCHEMA),
        [control.SliceDescription(3, 10, 12, 1, {"ke": control.ZoneMap(0.5, 9.0, 0, 3)})],
    ),
    control.Stats(),
    control.StatsReply(
        5,
        4096,
        1,
        0,
        running=2,
        exchanges_max=4,
        admitted=10,
        refused=1,
        copies=(control.CopyInFlight("d/t", 3, "dev1", 1 << 20, 4 << 20),),
        work=WorkCounters(
            slices_pushed_back=3, slices_pushed_back_busy=2, slices_pushed_back_forced=1
        ),
        quarantined=(
            control.QuarantinedPlan(
                "d/t",
                "substrait",
                "3f2a9c1e5b7d0a44",
                control.QuarantineCause.FAILED_STAGE,
                "the device's engine panicked",
                1.5,
                3601.5,
            ),
        ),
    ),
    control.QuarantineClear(),
    control.QuarantineCleared(1),
    control.KvGet("a/b"),
    control.KvValue(3),
    control.KvPut("a/b", 0),
    control.KvDelete("a/b", None),
    control.KvList("a/", 10),
    control.KvKeys(["a/b"]),
    control.Version(2),
    control.Deleted(4),
    control.Load(0.5, 2.0),
    control.LoadStarted(0.5, 2.0, "dev0"),
    control.LoadStatusRequest(),
    control.LoadStatus(0.25, 1.0, 0.0),
    control.Pulse(),
    control.Heartbeat(period_s=1.0, lifetime_s=300.0),
    control.PulseReply("b0a1:12", control.LoadStatus(0.25, 1.0, 0.0)),
    control.RevocationPush(
        control.RevocationList(3, 1.5, (control.RevokedToken("ab" * 16, 2.5),), "c2ln"),
        ("grpc+tls://10.0.0.2:7000",),
    ),
    control.RevocationsHeld(3, 1),
    control.RevocationsAsk(2),
    control.RevocationsReply(3, control.RevocationList(3, 1.5)),
    control.Calibrate(control.CalibratePart.KERNEL, 3),
    control.CalibrateReply(kernel_s=0.01),
    control.CalibrationReport(
        "dev0",
        "kinetic",
        control.Measured(15.0, 14.9, True, 0.01),
        control.Measured(261e6, 260e6, True),
        control.Measured(None, 2e9),
        0.1,
        1.5,
        1.0,
    ),
    ingest.PutPartition("d", "t", 0, RECORD, "zstd", {"lab": "x"}, {"sorted_by": "id"}),
    ingest.PutPartition("d", "t", 0, RECORD, copy_from="dev1", copy_bytes=1 << 20),
    ingest.Retire("d", "t", 3, "abc"),
    ingest.Holders("d", "t", 3, "abc", ("dev0", "dev4")),
    ingest.Applied(True),
    ingest.PartitionWritten(0, 100, 2, 4000),
    ingest.UpdateSlice("d", "t", 0, 1, 3),
    ingest.Commit("abc"),
    ingest.Committed([0, 1]),
    ingest.Abort("abc"),
    ingest.Drop("d", "t"),
    ingest.Renew("abc", 30.0),
    ingest.Renewed(2),
    ingest.OutcomeRequest("abc"),
    ingest.OutcomeReply(ingest.Outcome.PENDING),
    work.WorkRequest(
        unit="substrait",
        domain="d",
        dataset="t",
        partitions=(0, 2),
        forced=(
            work.ForcedDecision(0, 1, 3, Stage.FILTER),
            work.ForcedDecision(0, 3, 4, to_host=True),
        ),
        host=work.HostCost(1e-9, 0.5, 0.1, 1e9, 0.5, Stage.RAW),
        query_id="q/f0",
        chunk_slices=2,
        args={"anything": [1, 2.5, "x", None, {"nested": True}]},
        elsewhere=(work.PartitionRange(0, 0, 1),),
        generation="b0a1:12",
    ),
    work.ChunkDone(2, 4, 8),
    work.PushedBack(0, (work.SliceRange(1, 3),), Stage.RAW, 100, 4000),
    work.WorkDone(
        (
            work.PartitionReport(
                0,
                (
                    work.Decision(0, 1, Skip.PRUNED, "zone maps"),
                    work.Decision(1, 3, Stage.RAW, "raw: cheaper", 0.5, PushBack.SLOW),
                ),
                work.WorkMetrics(
                    WorkCounters(slices_total=3, slices_pruned=1),
                    times=work.WorkTimes(read_s=0.01, execute_s=0.02, execute_cpu_s=0.015),
                ),
                below=(
                    work.LevelReport(
                        "s0d1",
                        (work.Decision(1, 3, Stage.FILTER, "scan engine"),),
                        work.WorkMetrics(WorkCounters(slices_total=3, slices_scanned=2)),
                    ),
                ),
            ),
        ),
        {"cache_hits": 1},
        (work.TraceEntry(0, 1, 2, 0.1, 0.05, 100, 10),),
        load=control.LoadStatus(0.5, 1.0, 0.25),
    ),
    work.SliceRequest("substrait", "d", "t", 0, (work.SliceRange(0, 2),), Stage.FILTER, "q"),
    work.ScanRequest("d", "t", 0, 1, None, ("id",), generation="b0a1:12"),
    work.CalibrationTransfer(1 << 20),
]
