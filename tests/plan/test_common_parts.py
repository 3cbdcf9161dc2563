"""common_parts: a part of the super-plan that occurs more than once runs once."""

from __future__ import annotations

from quarry.plan import decompose, engine, run_stage, tree
from quarry.plan.common_parts import COMMON_PREFIX, ROWS_SAVED_MIN, Inputs, run_once, same_outputs
from quarry.protocol.stage import Stage

from .harness import assert_same_rows, execute

# a CTE read twice: its aggregate (over two reads of t, alike) is one part, twice
TWICE = """
WITH g AS (SELECT k, count(*) AS n, sum(i) AS s FROM t WHERE i > 0 GROUP BY k)
SELECT x.k, x.n, x.s, y.n, y.s FROM g AS x JOIN g AS y ON x.k = y.k + 1 ORDER BY x.k
"""


def _outputs(decomposition, table):
    """Each fragment's output over the whole table, as a device running it all would ship."""
    return {
        f.name: list(run_stage(f.stages[Stage.FULL], table.schema, table.to_batches()))
        for f in decomposition.fragments
    }


def _context(decomposition, outputs):
    ctx = engine.session(2)
    for fragment in decomposition.fragments:
        engine.register_batches(ctx, fragment.name, fragment.output_schema, outputs[fragment.name])
    return ctx


def _inputs(decomposition, same=None, rows=ROWS_SAVED_MIN):
    """As many rows a fragment as make a part over it worth running once (``rows``)."""
    counts = {f.name: rows for f in decomposition.fragments}
    return Inputs.of(same or {}, counts, decomposition.output_schema)


def _reads(super_plan: bytes, name: str) -> int:
    plan = tree.parse_plan(super_plan)
    return sum(1 for rel in tree.iter_rels(plan) if tree.named_table(rel) == (name,))


def test_a_cte_read_twice_runs_once_and_answers_the_same(small) -> None:
    """Both reads of the CTE read one table of its output; the answer is DuckDB's, whether the
    devices ran everything or handed rows back."""
    decomposition = decompose(TWICE, small.schemas, "always")
    ctx = _context(decomposition, _outputs(decomposition, small.table))
    changed, tables = run_once(ctx, decomposition.super_plan, _inputs(decomposition), 1 << 30)
    assert list(tables) == [f"{COMMON_PREFIX}0"]
    assert _reads(changed, f"{COMMON_PREFIX}0") == 2
    assert engine.consume(ctx, changed).schema().types == decomposition.output_schema.types
    for choice in ("full", "random"):
        answer = execute(decomposition, small.data, choice, seed=3)
        assert_same_rows(answer, small.expected(TWICE), ordered=True, context=choice)


def test_parts_over_alike_fragments_run_once_unless_a_join_cuts_one(small) -> None:
    """Two reads of t the same way ship the same rows: the parts over them are one. A fragment
    a join's keys cut ships fewer, so parts over it are not taken for its twin's."""
    decomposition = decompose(TWICE, small.schemas, "always", decomposition_rules=())
    first, second = (f.name for f in decomposition.fragments)
    ctx = _context(decomposition, _outputs(decomposition, small.table))
    same = same_outputs(decomposition.fragments, ())
    assert same == {second: first}
    changed, tables = run_once(ctx, decomposition.super_plan, _inputs(decomposition, same), 1 << 30)
    assert _reads(changed, f"{COMMON_PREFIX}0") == 2
    assert same_outputs(decomposition.fragments, {second}) == {}
    unrelated = _inputs(decomposition)
    assert run_once(ctx, decomposition.super_plan, unrelated, 1 << 30) == (
        decomposition.super_plan,
        {},
    )


def test_a_part_past_the_bytes_it_may_hold_or_over_few_rows_runs_where_it_was(small) -> None:
    """Held whole, the part would pass its bytes; over few rows, running it apart costs more
    than running it twice."""
    decomposition = decompose(TWICE, small.schemas, "always")
    ctx = _context(decomposition, _outputs(decomposition, small.table))
    unchanged = (decomposition.super_plan, {})
    assert run_once(ctx, decomposition.super_plan, _inputs(decomposition), 16) == unchanged
    few = _inputs(decomposition, rows=ROWS_SAVED_MIN - 1)
    assert run_once(ctx, decomposition.super_plan, few, 1 << 30) == unchanged
