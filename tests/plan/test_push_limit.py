"""push_limit: LIMIT per slice range, ORDER BY ... LIMIT as per-device top-k, final on host."""

from __future__ import annotations

from quarry.plan import Capabilities, decompose, tree
from quarry.plan.decompose import push_rows
from quarry.plan.rules.push_limit import push_limit

from .harness import assert_same_rows, cut_after, execute, kinds_down


def test_top_k_moves_down_with_offset_plus_count(small) -> None:
    sql = "SELECT id, x FROM t WHERE i > 0 ORDER BY id DESC LIMIT 5 OFFSET 2"
    cut = cut_after(sql, small.schemas, push_rows, push_limit)
    (fragment,) = cut.fragments
    assert kinds_down(fragment.rel)[:2] == ["fetch", "sort"]
    assert fragment.rel.fetch.count_expr.literal.i64 == 7
    assert not fragment.rel.fetch.HasField("offset_expr")
    # The host keeps its own sort and limit over the union of per-device top-ks.
    host = [tree.kind(r) for r in tree.iter_rels(cut.plan)]
    assert host[0] == "fetch" and "sort" in host
    decomposition = decompose(sql, small.schemas)
    for choice in ("full", "random"):
        assert_same_rows(
            execute(decomposition, small.data, choice, seed=2), small.expected(sql), ordered=True
        )


def test_plain_limit_keeps_any_matching_rows(small) -> None:
    sql = "SELECT id, i FROM t WHERE i > 0 LIMIT 10"
    decomposition = decompose(sql, small.schemas)
    assert decomposition.fragments[0].pushed[-1] == "limit"
    actual = execute(decomposition, small.data, "random", seed=3)
    assert actual.num_rows == 10
    assert all(row["i"] > 0 for row in actual.to_pylist())
    assert len(set(actual.column("id").to_pylist())) == 10


def test_limit_above_an_aggregate_stays_on_the_host(small) -> None:
    sql = "SELECT k, count(*) AS n FROM t GROUP BY k ORDER BY n DESC, k LIMIT 2"
    decomposition = decompose(sql, small.schemas)
    assert "top_k" not in decomposition.fragments[0].pushed
    assert_same_rows(execute(decomposition, small.data), small.expected(sql), ordered=True)


def test_restricted_devices_do_not_limit(small) -> None:
    decomposition = decompose(
        "SELECT id FROM t ORDER BY id LIMIT 3",
        small.schemas,
        capabilities={"test/t": Capabilities.scan_filter()},
    )
    assert "top_k" not in decomposition.fragments[0].pushed
