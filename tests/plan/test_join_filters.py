"""join_filters: which fragments a join may cut by another's keys, and where it must not."""

from __future__ import annotations

import pyarrow as pa

from quarry.plan import decompose
from quarry.plan.join_filters import join_filters

SCHEMAS = {
    "d/big": pa.schema([("k", pa.int64()), ("v", pa.float64())]),
    "d/small": pa.schema([("k", pa.int64()), ("tag", pa.string())]),
}
ROWS = {"d/big": 1_000_000, "d/small": 1_000}


def _pairs(sql: str, rows=ROWS) -> set[tuple[str, str, str, str]]:
    decomposition = decompose(sql, SCHEMAS, "always")
    fragments = {f.name: f for f in decomposition.fragments}
    return {
        (
            fragments[p.probe].dataset,
            fragments[p.probe].output_schema.names[p.probe_column],
            fragments[p.build].dataset,
            fragments[p.build].output_schema.names[p.build_column],
        )
        for p in join_filters(decomposition, rows)
    }


CUT = {("d/big", "k", "d/small", "k")}


def test_an_inner_join_on_a_filtered_small_side_cuts_the_large_one() -> None:
    sql = "SELECT sum(v) FROM d.big b JOIN d.small s ON b.k = s.k WHERE s.tag = 'x'"
    assert _pairs(sql) == CUT


def test_through_an_aggregate_grouping_by_the_key() -> None:
    sql = (
        "SELECT a.k, a.total FROM (SELECT k, sum(v) AS total FROM d.big GROUP BY k) a "
        "JOIN d.small s ON a.k = s.k WHERE s.tag = 'x'"
    )
    assert _pairs(sql) == CUT


def test_a_semi_join_cuts_its_probe() -> None:
    sql = "SELECT sum(v) FROM d.big WHERE k IN (SELECT k FROM d.small WHERE tag = 'x')"
    assert _pairs(sql) == CUT


def test_the_preserved_side_of_an_outer_join_is_never_cut() -> None:
    sql = "SELECT b.k, s.tag FROM d.big b LEFT JOIN d.small s ON b.k = s.k AND s.tag = 'x'"
    assert _pairs(sql) == set()
    anti = "SELECT sum(v) FROM d.big WHERE k NOT IN (SELECT k FROM d.small WHERE tag = 'x')"
    assert ("d/big", "k", "d/small", "k") not in _pairs(anti)


def test_a_limit_below_the_join_stops_the_cut() -> None:
    sql = (
        "SELECT sum(b.v) FROM (SELECT k, v FROM d.big LIMIT 10) b "
        "JOIN d.small s ON b.k = s.k WHERE s.tag = 'x'"
    )
    assert _pairs(sql) == set()


def test_what_does_not_pay_is_left_alone() -> None:
    unfiltered = "SELECT sum(v) FROM d.big b JOIN d.small s ON b.k = s.k"
    assert _pairs(unfiltered) == set()  # the build's keys would be all of them
    computed = "SELECT sum(v) FROM d.big b JOIN d.small s ON b.k + 1 = s.k WHERE s.tag = 'x'"
    assert _pairs(computed) == set()
    alike = {"d/big": 1_000, "d/small": 1_000}
    sql = "SELECT sum(v) FROM d.big b JOIN d.small s ON b.k = s.k WHERE s.tag = 'x'"
    assert _pairs(sql, alike) == set()  # neither side is the smaller one


def test_tpch_q17_cuts_lineitem_by_the_parts_of_one_brand(tpch) -> None:
    decomposition = decompose(tpch.queries[17], tpch.schemas, "always")
    rows = {name: table.num_rows for name, table in tpch.data.items()}
    fragments = {f.name: f for f in decomposition.fragments}
    pairs = join_filters(decomposition, rows)
    assert pairs
    for pair in pairs:
        assert fragments[pair.probe].dataset == "tpch/lineitem"
        assert fragments[pair.build].dataset == "tpch/part"
        assert "l_partkey IN (keys of" in pair.describe(fragments)
