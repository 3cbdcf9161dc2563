"""join_filters: which fragments a join may cut by another's keys, and where it must not."""

from __future__ import annotations

import pyarrow as pa

from quarry.plan import decompose
from quarry.plan.join_filters import JoinFilter, _chosen, _Side, join_filters
from quarry.plan.rules.read_once import read_each_once
from quarry.protocol.stage import Stage

SCHEMAS = {
    "d/big": pa.schema([("k", pa.int64()), ("v", pa.float64())]),
    "d/small": pa.schema([("k", pa.int64()), ("tag", pa.string())]),
    "d/returns": pa.schema([("k", pa.int64()), ("v", pa.float64())]),
}
ROWS = {"d/big": 1_000_000, "d/small": 1_000, "d/returns": 600_000}


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


def test_a_join_above_a_union_cuts_each_of_its_inputs() -> None:
    """TPC-DS Q5's shape: sales and returns joined as one to a few dates."""
    sql = (
        "SELECT sum(u.v) FROM (SELECT k, v FROM d.big UNION ALL SELECT k, v FROM d.returns) u "
        "JOIN d.small s ON u.k = s.k WHERE s.tag = 'x'"
    )
    assert _pairs(sql) == {*CUT, ("d/returns", "k", "d/small", "k")}
    # an input that does not trace is left whole; the other is still cut
    sql = (
        "SELECT sum(u.v) FROM (SELECT k, v FROM d.big UNION ALL "
        "SELECT max(k), v FROM d.returns GROUP BY v) u JOIN d.small s ON u.k = s.k "
        "WHERE s.tag = 'x'"
    )
    assert _pairs(sql) == CUT


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


def test_tpch_q18_cuts_orders_and_lineitem_by_the_keys_its_having_leaves(tpch) -> None:
    """The build is the host's ``GROUP BY l_orderkey HAVING sum(l_quantity) > 300`` over a
    lineitem fragment: the pair carries that part of the super-plan, and the inner join's
    ``o_orderkey = l_orderkey`` carries the cut from orders to the lineitems joined to them."""
    decomposition = decompose(tpch.queries[18], tpch.schemas, "always")
    rows = {"tpch/orders": 1_500_000, "tpch/lineitem": 6_000_000, "tpch/customer": 150_000}
    fragments = {f.name: f for f in decomposition.fragments}
    pairs = join_filters(decomposition, rows)
    probes = {
        (fragments[p.probe].dataset, fragments[p.probe].output_schema.names[p.probe_column])
        for p in pairs
    }
    assert probes == {("tpch/orders", "o_orderkey"), ("tpch/lineitem", "l_orderkey")}
    through = [pair for pair in pairs if pair.through]
    assert {fragments[p.probe].dataset for p in through} == {"tpch/orders", "tpch/lineitem"}
    for pair in through:
        assert pair.through_column == 0
        assert fragments[pair.build].dataset == "tpch/lineitem"
        assert "after the host's filter" in pair.describe(fragments)
    # the lineitems joined to orders may also wait for the orders the HAVING leaves; the
    # HAVING's own lineitem never waits for them (it is their build)
    for pair in pairs:
        if not pair.through:
            assert fragments[pair.build].dataset == "tpch/orders"
            assert pair.probe not in {p.build for p in through}


def test_a_build_without_the_hosts_filter_is_the_fragment_itself() -> None:
    sql = "SELECT sum(v) FROM d.big WHERE k IN (SELECT k FROM d.small WHERE tag = 'x')"
    decomposition = decompose(sql, SCHEMAS, "always")
    (pair,) = join_filters(decomposition, ROWS)
    assert pair.through == b"" and pair.through_column == -1


def _side(rows: int, kept: float = 1.0) -> _Side:
    return _Side("d/x", "full", (Stage.RAW, Stage.FILTER, Stage.FULL), True, rows, kept)


def test_pairs_through_the_hosts_filter_never_wait_in_a_circle() -> None:
    """A pair through the host's filter comes first; a sized pair that would close a circle
    with it is left out."""
    fragments = {"a": _side(1_000_000), "b": _side(1_000, 0.5), "c": _side(1_000_000)}
    sized = JoinFilter("a", 0, "b", 0)
    closing = JoinFilter("b", 0, "a", 0, b"plan", 0)
    other = JoinFilter("c", 0, "a", 0, b"plan", 0)
    assert _chosen({sized, closing, other}, fragments) == {closing, other}
    assert _chosen({sized, other}, fragments) == {sized, other}
    both = {JoinFilter("a", 0, "b", 0, b"p", 0), JoinFilter("b", 0, "a", 0, b"p", 0)}
    assert len(_chosen(both, fragments)) == 1


def test_a_build_is_sized_by_what_its_filter_keeps_and_by_the_cuts_before_it() -> None:
    """TPC-H Q12's lineitem is four times orders, but its filter keeps one row in 200: its
    keys cut orders. At SF 10 the orders of Q3 that customer's keys leave, 1.4 million, are
    keys that may be sent; at SF 30, 4.3 million are more, and lineitem does not wait for them."""
    q12 = {"orders": _side(1_500_000), "lineitem": _side(6_000_000, 0.005)}
    pair = JoinFilter("orders", 0, "lineitem", 0)
    assert _chosen({pair}, q12) == {pair}
    q12["lineitem"] = _side(6_000_000, 0.5)
    assert _chosen({pair}, q12) == set()
    by_customer = JoinFilter("orders", 1, "customer", 0)
    by_orders = JoinFilter("lineitem", 0, "orders", 0)
    for scale, chosen in (
        (1, {by_customer, by_orders}),
        (10, {by_customer, by_orders}),
        (30, {by_customer}),
    ):
        q3 = {
            "customer": _side(150_000 * scale, 0.2),
            "orders": _side(1_500_000 * scale, 0.48),
            "lineitem": _side(6_000_000 * scale, 0.54),
        }
        assert _chosen({by_customer, by_orders}, q3) == chosen, scale


def test_a_build_cutting_several_columns_of_a_probe_keeps_its_share_once() -> None:
    """As TPC-DS Q17 and Q29: store sales are cut by the item, customer and ticket of the
    returns of some quarters, and by some dates. The returns' three cuts keep the sales of
    those returns, once: counted three times over, the sales looked smaller than the dates,
    the dates were cut by the sales' keys, and the sales waited for the returns alone."""
    q17 = {
        "sales": _side(2_880_404),
        "returns": _side(287_867),
        "dates": _side(73_049, 2_000 / 73_049),
        "quarters": _side(73_049, 273 / 73_049),
    }
    by_returns = {JoinFilter("sales", column, "returns", column) for column in (1, 2, 3)}
    by_dates = JoinFilter("sales", 0, "dates", 0)
    dates_by_sales = JoinFilter("dates", 0, "sales", 0)
    returns_by_quarters = JoinFilter("returns", 0, "quarters", 0)
    chosen = _chosen({*by_returns, by_dates, dates_by_sales, returns_by_quarters}, q17)
    assert chosen == {*by_returns, by_dates, returns_by_quarters}


def test_a_cut_goes_down_to_the_stored_column_its_key_comes_from() -> None:
    """The probe's key column traced through its sub-plan to what the device reads: through a
    group key and a projection that passes it on, not through a computed value."""
    from quarry.plan import tree
    from quarry.plan.join_filters import stored_column

    def stored(sql: str) -> list[str | None]:
        (fragment,) = decompose(sql, SCHEMAS, "always").fragments
        plan = tree.parse_plan(fragment.stages["full"])
        return [stored_column(plan, i) for i in range(len(fragment.output_schema))]

    assert stored("SELECT k, sum(v) FROM d.big GROUP BY k")[0] == "k"
    assert stored("SELECT v, k FROM d.big WHERE v > 1")[:2] == ["v", "k"]
    assert stored("SELECT k + 1 AS j FROM d.big") == [None]
    assert stored("SELECT sum(v) FROM d.big")[0] is None


SF1_ROWS = {
    "tpch/lineitem": 6_001_215,
    "tpch/orders": 1_500_000,
    "tpch/customer": 150_000,
    "tpch/part": 200_000,
    "tpch/partsupp": 800_000,
    "tpch/supplier": 10_000,
    "tpch/nation": 25,
    "tpch/region": 5,
}


SF1_KEPT = {"tpch/part": 0.002, "tpch/nation": 0.04}  # Q2's and Q11's filters, sampled


def _described(tpch, number: int, shares: dict[str, float] = SF1_KEPT) -> list[str]:
    decomposition = decompose(tpch.queries[number], tpch.schemas, "always")
    fragments = {f.name: f for f in decomposition.fragments}
    kept = {f.name: shares[f.dataset] for f in fragments.values() if f.dataset in shares}
    return [
        f"{fragments[p.probe].dataset} by {fragments[p.build].dataset}: {p.describe(fragments)}"
        for p in join_filters(decomposition, SF1_ROWS, kept)
    ]


def test_a_fragment_read_twice_is_cut_when_both_reads_are(tpch) -> None:
    """Q2 reads partsupp's fragment in the query and in its subquery, both joined to part's
    keys (``p_partkey = ps_partkey``); Q11 reads supplier's in both, both joined to nation."""
    (q2,) = _described(tpch, 2)
    assert q2.startswith("tpch/partsupp by tpch/part:") and "ps_partkey IN" in q2
    q11 = _described(tpch, 11)
    assert any(p.startswith("tpch/supplier by tpch/nation:") for p in q11)
    assert sum(p.startswith("tpch/partsupp by tpch/supplier:") for p in q11) == 2


def test_a_fragment_read_twice_is_not_cut_when_one_read_is_not(tpch) -> None:
    """Q21's lineitem is read for the late deliveries and again in ``NOT EXISTS (... l_suppkey
    <> ...)``: the second read needs every supplier's lines, so supplier's keys may not cut it."""
    assert not any(p.startswith("tpch/lineitem by tpch/supplier") for p in _described(tpch, 21))


def test_a_build_equal_to_a_smaller_ones_keys_cuts_by_those() -> None:
    """TPC-H Q9's shape: returns joins the big rows that joined the few tagged small ones. Its
    join's own build (big's keys, as many as big's rows) would not pay; through ``b.k = s.k``
    those keys are among small's, which do."""
    sql = (
        "SELECT sum(r.v) FROM d.small s JOIN d.big b ON s.k = b.k "
        "JOIN d.returns r ON r.k = b.k WHERE s.tag = 'x'"
    )
    assert _pairs(sql) == {*CUT, ("d/returns", "k", "d/small", "k")}
    # a join's own build that pays is kept: one found through an equality only stands in
    direct = {"d/big": 1_000, "d/small": 100, "d/returns": 600_000}
    assert _pairs(sql, direct) == {*CUT, ("d/returns", "k", "d/big", "k")}


def test_a_build_cut_only_by_the_probes_own_keys_does_not_cut_it_again(tpch) -> None:
    """Q9: partsupp, cut by the green parts through ``p_partkey = l_partkey``, holds nearly every
    supplier; the lineitems of those parts are not cut again by its suppliers, nor orders by
    those lineitems (a chain of waits for nothing)."""
    described = _described(tpch, 9, {"tpch/part": 0.053})
    assert sorted(described) == [
        "tpch/lineitem by tpch/part: __quarry_fragment_1.l_partkey IN (keys of "
        "__quarry_fragment_0.p_partkey)",
        "tpch/partsupp by tpch/part: __quarry_fragment_3.ps_partkey IN (keys of "
        "__quarry_fragment_0.p_partkey)",
    ]


def test_a_build_filtered_by_a_subquerys_value_runs_through_the_host_with_its_reads() -> None:
    """TPC-DS Q6's dates are those whose month is a subquery's value: the devices cannot know
    it, the host can once the subquery's fragment is in. The pair runs the build's filter on
    the host, reading that fragment too, and the large side waits for its keys."""
    sql = (
        "SELECT sum(v) FROM d.big b JOIN d.small s ON b.k = s.k "
        "WHERE s.tag = (SELECT max(tag) FROM d.small WHERE k < 10)"
    )
    decomposition = decompose(sql, SCHEMAS, "always")
    fragments = {f.name: f for f in decomposition.fragments}
    (pair,) = join_filters(decomposition, ROWS)
    assert fragments[pair.probe].dataset == "d/big" and pair.through
    (extra,) = pair.through_reads
    assert extra != pair.build and fragments[extra].dataset == "d/small"
    assert fragments[extra].device_filter  # the subquery's own filter still goes down


def test_a_semi_join_on_one_fragments_read_leaves_the_build_to_its_devices_cut() -> None:
    """A semi join moved onto a build (``rules.semi_join_down``) says what a join's keys cut
    on its devices already: the build's keys are taken as they come, not through the host
    (TPC-DS Q56's items of some colours; through the host, chosen before every other pair,
    Q95's web sales waited for the keys of 42,000 returned orders instead of a fortnight's)."""
    sql = (
        "SELECT sum(v) FROM d.big b JOIN d.small s ON b.k = s.k "
        "WHERE s.tag IN (SELECT tag FROM d.small WHERE k < 5)"
    )
    decomposition = decompose(sql, SCHEMAS, "always")
    kept = {f.name: 0.005 for f in decomposition.fragments if f.device_filter}  # k < 5
    pairs = join_filters(decomposition, ROWS, kept)
    fragments = {f.name: f for f in decomposition.fragments}
    assert {fragments[p.probe].dataset for p in pairs} == {"d/big", "d/small"}
    assert not any(p.through for p in pairs)


def test_a_subquerys_reads_count_as_waits() -> None:
    """Two pairs where the build's subquery of one reads the other's probe, which waits for the
    first's probe: together they would wait in a circle, so one is left out."""
    fragments = {"a": _side(1_000_000), "b": _side(1_000, 0.5), "c": _side(1_000_000)}
    c_waits_for_a = JoinFilter("c", 0, "a", 0, b"plan", 0)
    a_by_b_reading_c = JoinFilter("a", 0, "b", 0, b"other", 0, through_reads=("c",))
    assert len(_chosen({c_waits_for_a, a_by_b_reading_c}, fragments)) == 1
    a_by_b = JoinFilter("a", 0, "b", 0, b"other", 0)
    assert _chosen({c_waits_for_a, a_by_b}, fragments) == {c_waits_for_a, a_by_b}


def _union_pairs(kept_share: float) -> list[str]:
    """Big read once for two joins, each to small rows of its own tag (TPC-DS Q31's store
    sales, joined to each of three quarters' dates)."""
    sql = (
        "WITH a AS (SELECT b.k, b.v FROM d.big b JOIN d.small s ON b.k = s.k WHERE s.tag = 'x'),"
        " c AS (SELECT b.k, b.v FROM d.big b JOIN d.small s ON b.k = s.k WHERE s.tag = 'y')"
        " SELECT a.k, c.v FROM a JOIN c ON a.v = c.v"
    )
    decomposition = read_each_once(decompose(sql, SCHEMAS, "always"))
    fragments = {f.name: f for f in decomposition.fragments}
    assert sum(f.dataset == "d/big" for f in fragments.values()) == 1, "read once"
    kept = {n: kept_share for n, f in fragments.items() if f.dataset == "d/small"}
    return [p.describe(fragments) for p in join_filters(decomposition, ROWS, kept)]


def test_a_fragment_read_for_several_joins_is_cut_by_the_union_of_their_keys() -> None:
    """No one build cuts big at both its reads; the two together do, as one key set. Where
    what they keep is much of big (two fifths here), every read of it would join all of that
    on the host: big is left whole, to be read apart (``split_alike_by_join_keys``)."""
    (union,) = _union_pairs(0.01)
    assert union.startswith("__quarry_fragment_0.k IN (keys of ") and " ∪ " in union
    assert _union_pairs(0.2) == []
