"""plan.keys: a join's key set on the wire, and the cut it makes of a fragment's output."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quarry.plan import keys
from quarry.plan.keys import KeyCut, keep, keep_in


def _expected(values: pa.Array, key_set: pa.Array) -> list[bool]:
    """The rows whose value equals a key, compared as values whatever their types."""
    wanted = {key for key in key_set.to_pylist() if key is not None}
    return [value is not None and value in wanted for value in values.to_pylist()]


@pytest.mark.parametrize(
    "values, key_set",
    [
        (pa.array([1, 5, None, 7, -3, 10**6], pa.int64()), pa.array([5, 7, None, -3], pa.int64())),
        (pa.array([1, 2, 3], pa.int32()), pa.array([2, 3, 2**40], pa.int64())),  # a key past int32
        (pa.array([1, 2**40, 3], pa.int64()), pa.array([3, 2**40], pa.int64())),  # wide range
        (  # wide range, nulls, keys out of the values' range on both ends
            pa.array([None, -(2**40), 0, 2**41, 7, 2**40 + 1], pa.int64()),
            pa.array([2**41, -(2**50), 7, None, 2**60, 2**41], pa.int64()),
        ),
        (  # a range for a bit per value, values at both ends of int64 and just past the keys
            pa.array([-(2**63), 2**63 - 1, -1, 0, 2**25, 2**25 + 1, None, 12345], pa.int64()),
            pa.array([0, 2**25, 12345, None], pa.int64()),
        ),
        (  # keys at both ends of int64: no table, a search
            pa.array([-(2**63), 2**63 - 1, 0, 1], pa.int64()),
            pa.array([-(2**63), 2**63 - 1, 1], pa.int64()),
        ),
        (pa.array(range(-5, 30), pa.int64()).slice(7, 20), pa.array([3, 4, 22, 40])),  # offset
        (pa.array(["a", None, "c"]), pa.array(["c", "z"])),
        (  # every integer between two keys: two comparisons, bounds past a narrow column's
            pa.array([None, 4, 5, 9, 10, -(2**31), 2**31 - 1], pa.int32()),
            pa.array([5, 6, 7, 8, 9], pa.int64()),
        ),
        (pa.array([2**31 - 1, 0, None], pa.int32()), pa.array([2**31 - 1, 2**31, 2**31 + 1])),
        (pa.array([2**31 - 1, 0], pa.int32()), pa.array([2**31, 2**31 + 1, 2**31 + 2])),  # above
        (pa.array([-(2**31), 0], pa.int32()), pa.array([-(2**31) - 3, -(2**31) - 2])),  # below
        (pa.array([-128, 5, 6, 127, None], pa.int8()), pa.array([126, 127, 128, 129])),
        (pa.array([0, 3, 4, 2**32 - 1], pa.uint32()), pa.array([-1, 0, 1, 2, 3])),  # below 0
        (pa.array([7, 8, 9, 10], pa.int16()).slice(1, 2), pa.array([8, 9, 10])),  # offset
        (pa.array([1, 2, 3], pa.uint32()), pa.array([], pa.int64())),
    ],
)
def test_a_cut_keeps_exactly_the_rows_whose_key_is_in_the_set(values, key_set) -> None:
    assert KeyCut(0, key_set).mask(values).to_pylist() == _expected(values, key_set)


def test_keep_ands_several_cuts_and_keys_travel_as_ipc() -> None:
    rng = np.random.default_rng(3)
    batch = pa.record_batch(
        [pa.array(rng.integers(0, 100, 1000)), pa.array(rng.integers(0, 10, 1000))],
        names=["a", "b"],
    )
    first = keys.decode(keys.encode(pa.array([1, 2, 3, 50])))
    second = keys.decode(keys.encode(pa.array([0, 9])))
    assert first.type == pa.int32(), "64-bit keys that fit in 32 bits travel as 32"
    assert keys.decode(keys.encode(pa.array([1, 2**31]))).type == pa.int64()
    kept = keep(batch, [KeyCut(0, first), KeyCut(1, second)])
    a, b = batch.column(0).to_numpy(), batch.column(1).to_numpy()
    assert kept.num_rows == int((np.isin(a, [1, 2, 3, 50]) & np.isin(b, [0, 9])).sum())


def test_a_chunk_is_cut_fewest_first_and_keeps_the_same_rows_in_any_order() -> None:
    """Three cuts over a chunk of 40 slices (a twelfth, a tenth, a fiftieth of the rows, as
    TPC-DS Q96's store sales): whichever order they come in, the rows kept are the same, and
    the cut that keeps fewest goes first."""
    rng = np.random.default_rng(11)
    slices = [
        pa.record_batch(
            {
                "store": rng.integers(0, 12, 5000),
                "household": rng.integers(0, 7200, 5000),
                "time": rng.integers(0, 86400, 5000),
                "price": rng.random(5000),
            }
        )
        for _ in range(40)
    ]
    cuts = [
        ("store", KeyCut(0, pa.array([3]))),
        ("household", KeyCut(1, pa.array(rng.choice(7200, 720, replace=False)))),
        ("time", KeyCut(2, pa.array(np.arange(73800, 75528)))),
    ]
    assert [name for name, _ in keys._fewest_first(pa.Table.from_batches(slices), cuts)][0] == (
        "time"
    )
    whole = pa.Table.from_batches(slices)
    wanted = (
        np.isin(whole["store"].to_numpy(), [3])
        & np.isin(whole["household"].to_numpy(), cuts[1][1].keys.to_numpy())
        & np.isin(whole["time"].to_numpy(), np.arange(73800, 75528))
    )
    expected = whole.filter(pa.array(wanted)).sort_by("price")
    for order in (cuts, cuts[::-1], cuts[1:] + cuts[:1]):
        assert keep_in(slices, order).sort_by("price").equals(expected)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    offset=st.integers(0, 9),
    wanted=st.lists(
        st.tuples(st.sampled_from(["a", "b", "t"]), st.lists(st.integers(-3, 30), max_size=12)),
        min_size=1,
        max_size=3,
    ),
    seed=st.integers(0, 2**16),
)
def test_a_chunk_in_any_pieces_keeps_the_rows_every_cut_keeps_in_order(
    sizes, offset, wanted, seed
) -> None:
    """Slices of any sizes (empty ones too, views at an offset), integer and text columns with
    nulls, one to three cuts: the rows kept are those every cut keeps, in their order, every
    column's values and nulls as they were."""
    rng = np.random.default_rng(seed)
    total = sum(sizes) + offset

    def column(kind: pa.DataType) -> pa.Array:
        numbers = rng.integers(-3, 30, total)
        nulls = rng.random(total) < 0.2
        if kind == pa.string():
            return pa.array([None if n else f"k{v}" for v, n in zip(numbers, nulls, strict=True)])
        return pa.array(numbers, kind, mask=nulls)

    whole = pa.table(
        {
            "a": column(pa.int64()),
            "b": column(pa.int32()),
            "t": column(pa.string()),
            "p": pa.array(rng.random(total), pa.float64(), mask=rng.random(total) < 0.3),
            "d": pa.array(
                [None if v < 0 else int(v) for v in rng.integers(-5, 10**6, total)],
                pa.decimal128(9, 2),
            ),
        }
    ).slice(offset)
    batches, at = [], 0
    for size in sizes:  # views of the table's buffers, an empty one included
        (batch,) = whole.slice(at, size).to_batches() or [_empty(whole.schema)]
        batches.append(batch)
        at += size
    cuts = []
    for name, values in wanted:
        key_set = [f"k{v}" for v in values] if name == "t" else values
        cuts.append((name, KeyCut(0, pa.array(key_set, pa.string() if name == "t" else None))))
    expected = np.ones(whole.num_rows, np.bool_)
    for name, cut in cuts:
        expected &= np.array(_expected(whole.column(name).combine_chunks(), cut.keys), np.bool_)
    assert keep_in(batches, cuts).equals(whole.filter(pa.array(expected)).combine_chunks())


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.record_batch([pa.array([], field.type) for field in schema], schema=schema)


def test_a_malformed_or_oversized_key_set_is_refused(monkeypatch) -> None:
    with pytest.raises(ValueError, match="does not decode"):
        keys.decode(b"not arrow")
    monkeypatch.setattr(keys, "KEYS_MAX", 2)
    with pytest.raises(ValueError, match="at most 2"):
        keys.decode(keys.encode(pa.array([1, 2, 3])))


@pytest.mark.parametrize(
    "chunks, kind",
    [
        ([[3, 1, None, 3], [1, 2**40, -(2**63)], []], pa.int64()),
        ([[7, 7, 7], [None]], pa.int32()),
        ([[None, None]], pa.int64()),
        ([[1, 2], [2, 3]], pa.uint64()),
        ([["b", None, "a"], ["b"]], pa.string()),
    ],
)
def test_distinct_keys_are_each_non_null_value_once(chunks, kind) -> None:
    values = pa.chunked_array([pa.array(c, kind) for c in chunks], kind)
    unique = keys.distinct(values)
    assert unique.type == kind and unique.null_count == 0
    assert sorted(unique.to_pylist()) == sorted({v for c in chunks for v in c if v is not None})


def test_a_zone_map_that_holds_no_key_says_so_and_doubt_keeps_the_slice() -> None:
    cut = KeyCut(0, pa.array([10, 20, 30, None], pa.int64()))
    stats = lambda low, high, nulls=0: {"min": low, "max": high, "rows": 5, "null_count": nulls}  # noqa: E731
    assert (
        cut.may_hold(stats(5, 10)) and cut.may_hold(stats(11, 25)) and cut.may_hold(stats(30, 99))
    )
    assert not cut.may_hold(stats(11, 19)) and not cut.may_hold(stats(31, 99))
    assert not cut.may_hold(stats(None, None, nulls=5))  # all null: a join never matches NULL
    assert cut.may_hold(None) and cut.may_hold({"min": 1.5, "max": 2.5})  # unsure: kept
    assert KeyCut(0, pa.array(["a"])).may_hold(stats("b", "c"))  # text keys: not judged
    assert not KeyCut(0, pa.array([], pa.int64())).may_hold(stats(0, 99))  # no key, no row


def test_every_slice_is_judged_at_once_as_each_is_alone() -> None:
    """``may_hold_each`` over a partition's zone maps as arrays says what each map, judged
    alone, says: maps missing, all null, float or text bounds, past 64 bits, no keys."""
    from quarry.store.zonemap import integer_bounds

    rng = np.random.default_rng(3)

    def stats() -> dict | None:
        pick = rng.integers(0, 8)
        if pick == 0:
            return None
        if pick == 1:
            return {"min": None, "max": None, "rows": 4, "null_count": 4}
        if pick == 2:
            return {"min": 1.5, "max": 9.5, "rows": 4, "null_count": 0}
        if pick == 3:
            return {"min": "a", "max": "z"}
        if pick == 4:
            return {"min": 0, "max": 1 << 64, "rows": 4, "null_count": 1}
        low = int(rng.integers(-50, 150))
        return {"min": low, "max": low + int(rng.integers(0, 30)), "rows": 4, "null_count": 0}

    for trial in range(60):
        chosen = rng.choice(np.arange(0, 100), int(rng.integers(0, 12)), replace=False)
        kind = pa.int64() if trial % 5 else pa.string()
        values = chosen.tolist() if kind == pa.int64() else [str(v) for v in chosen]
        cut = KeyCut(0, pa.array(values, kind))
        maps = [stats() for _ in range(40)]
        each = cut.may_hold_each(integer_bounds(maps))
        assert each.tolist() == [_may_hold(cut, m) for m in maps], trial


def _may_hold(cut: KeyCut, stats: dict | None) -> bool:
    """The judgement of one zone map, written out plainly: the reference."""
    if not stats:
        return True
    rows, nulls = stats.get("rows"), stats.get("null_count")
    if rows is not None and nulls is not None and nulls >= rows:
        return False
    low, high = stats.get("min"), stats.get("max")
    if not (pa.types.is_integer(cut.keys.type) and isinstance(low, int) and isinstance(high, int)):
        return True
    return any(low <= key <= high for key in cut.keys.to_pylist())


def test_too_many_keys_are_not_judged_against_zone_maps(monkeypatch) -> None:
    from quarry.plan import keys

    monkeypatch.setattr(keys, "PRUNING_KEYS_MAX", 2)
    cut = KeyCut(0, pa.array([10, 20, 30], pa.int64()))
    assert cut.may_hold({"min": 11, "max": 19, "rows": 5, "null_count": 0})
