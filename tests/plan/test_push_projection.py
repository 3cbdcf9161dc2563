"""push_projection: the scan reads only needed columns; computed columns move down too."""

from __future__ import annotations

from quarry.plan import Capabilities, decompose, tree
from quarry.plan.decompose import push_rows
from quarry.plan.rules.push_projection import push_projection

from .harness import assert_same_rows, cut_after, execute, kinds_down


def test_the_scan_reads_only_needed_columns(small) -> None:
    decomposition = decompose("SELECT x, id FROM t WHERE i > 0", small.schemas, pushdown="never")
    (fragment,) = decomposition.fragments
    assert set(fragment.raw_schema.names) == {"x", "id", "i"}
    assert fragment.pushed == ["projection"]


def test_computed_projection_moves_into_the_fragment(small) -> None:
    cut = cut_after(
        "SELECT x * 2 + i AS y, upper(s) AS u FROM t WHERE k = 1", small.schemas, push_rows
    )
    (fragment,) = cut.fragments
    assert kinds_down(fragment.rel) == ["project", "filter", "read"]
    # All that is left on the host is reading the fragment.
    assert tree.kind(tree.root_rel(cut.plan)) == "read"


def test_restricted_devices_take_only_column_projections(small) -> None:
    caps = {"test/t": Capabilities.scan_filter()}
    computed = cut_after(
        "SELECT x * 2 AS y FROM t", small.schemas, push_projection, capabilities=caps
    )
    assert kinds_down(computed.fragments[0].rel) == ["read"]
    columns = cut_after(
        "SELECT x, id FROM t WHERE i > 0", small.schemas, push_rows, capabilities=caps
    )
    assert kinds_down(columns.fragments[0].rel) == ["project", "filter", "read"]


def test_count_star_ships_one_cheap_column(small) -> None:
    sql = "SELECT count(*) AS n FROM t"
    decomposition = decompose(sql, small.schemas, pushdown="never")
    (fragment,) = decomposition.fragments
    assert fragment.raw_schema.names == ["i"]  # int32: the narrowest column
    for pushdown in ("never", "always"):
        decomposition = decompose(sql, small.schemas, pushdown=pushdown)
        assert execute(decomposition, small.data).to_pylist() == [{"n": small.table.num_rows}]


def test_cross_join_of_column_less_reads(small) -> None:
    # Both sides read no column; a shipped column must not shift the join's fields.
    sql = "SELECT count(*) AS n FROM t a, t b WHERE a.id < 3"
    for pushdown in ("never", "always"):
        decomposition = decompose(sql, small.schemas, pushdown=pushdown)
        actual = execute(decomposition, small.data, "random", seed=2)
        assert_same_rows(actual, small.expected(sql), ordered=False)


def test_projection_answers_match_duckdb(small) -> None:
    sql = "SELECT id, x * 2 + i AS y, lower(s) AS l, p * 3 AS q FROM t WHERE k = 1"
    for pushdown in ("never", "always"):
        decomposition = decompose(sql, small.schemas, pushdown=pushdown)
        actual = execute(decomposition, small.data, "random", seed=3)
        assert_same_rows(actual, small.expected(sql), ordered=False, context=pushdown)
