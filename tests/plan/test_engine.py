"""engine: what the host hands DataFusion."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

from quarry.plan import engine


def _over_ipc(batch: pa.RecordBatch, pad: int) -> pa.RecordBatch:
    """``batch`` as a Flight stream leaves it: decoded in place from a buffer, ``pad`` bytes in."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    data = pa.py_buffer(bytes(pad) + sink.getvalue().to_pybytes())[pad:]
    return pa.ipc.open_stream(data).read_next_batch()


def test_a_decimal_column_off_a_16_byte_boundary_is_copied_onto_one_and_nothing_else_is():
    prices = pa.array([Decimal("1.25"), None, Decimal("-3.50")], pa.decimal128(15, 2))
    batch = pa.record_batch([pa.array([1, 2, 3]), prices], names=["k", "price"])
    seen_misaligned = False
    for pad in (0, 8):
        received = _over_ipc(batch, pad)
        seen_misaligned |= received.column(1).buffers()[1].address % 16 != 0
        fixed = engine.aligned(received)
        assert fixed.equals(batch)
        assert fixed.column(1).buffers()[1].address % 16 == 0
        assert fixed.column(0).buffers()[1].address == received.column(0).buffers()[1].address
    assert seen_misaligned  # one of the two placements is what a Flight stream may give
    assert engine.aligned(batch) is batch


def test_a_join_whose_condition_is_always_true_consumes_and_answers():
    """SQLite's corpus: DataFusion's producer writes such a join with no condition, which its
    own consumer refuses; every row of the left side meets every row of the right."""
    ctx = engine.session()
    ctx.register_record_batches("a", [[pa.record_batch({"x": [1, 2]})]])
    ctx.register_record_batches("b", [[pa.record_batch({"y": [3]})]])
    frame = ctx.sql("SELECT * FROM a LEFT JOIN b ON NOT CAST(NULL AS INTEGER) IS NOT NULL")
    answer = engine.consume(ctx, engine.produce(ctx, frame)).to_arrow_table()
    assert sorted(answer.to_pylist(), key=lambda r: r["x"]) == [
        {"x": 1, "y": 3},
        {"x": 2, "y": 3},
    ]
