"""NOT IN over a subquery keeps its NULL semantics through Substrait.

DataFusion plans ``x NOT IN (SELECT y FROM b)`` as a *null-aware* anti join: a row of ``a`` is
kept only if ``b`` is empty, or ``b`` holds no NULL ``y``, ``x`` is not NULL and no ``y`` equals
it. Substrait's anti join cannot say "null-aware", so DataFusion's producer writes a plain one and
the plan that comes back keeps every row no ``y`` equals: ``SELECT * FROM tab0 WHERE col0 NOT IN
(SELECT col1 FROM tab2)`` answered all of tab0 where DataFusion alone answers nothing (tab2.col1
holds a NULL). Each such join is written here as what it means, in joins Substrait has:

    anti join (anti join a, b on x = y), (count(*) AS n, count(y) AS m over b)
        on (n > 0 AND x IS NULL) OR n <> m

The inner join stays an equi-join (hashed, whatever ``b``'s size); the outer one meets a single
row. ``b`` is read twice, the second time for two counts a device computes. A null-aware join
with more than one key or a correlated filter (NOT IN over a correlated subquery) is refused:
DataFusion itself answers it wrongly or not at all.

A plan rule (``decompose``'s ``plan_rules`` phase), but not one a caller may leave out: an
answer depends on it, so ``plan_cut`` runs it first whatever list it is given, and EXPLAIN
VERBOSE shows it when it fired. It needs DataFusion's logical plan (the one place that says
which anti joins are null-aware), so the rule is made per query (``rule``).
"""

from __future__ import annotations

from substrait import algebra_pb2, plan_pb2, type_pb2

from quarry.plan import engine, expressions, tree
from quarry.plan.errors import NeedsHostEngine
from quarry.plan.rules import Rule

Expression = algebra_pb2.Expression
ANTI_JOIN_TYPES = (algebra_pb2.JoinRel.JOIN_TYPE_LEFT_ANTI,)
NULL_AWARE_MARK = " null_aware"  # how DataFusion's plan display marks such a join

CORRELATED_NOT_IN = (
    "NOT IN over a correlated subquery is not supported (DataFusion cannot keep its NULL "
    "semantics)\nhint: write it as NOT EXISTS (SELECT 1 FROM ... WHERE <the correlation> AND "
    "(y = x OR y IS NULL OR x IS NULL)), which means the same"
)


def null_aware_flags(logical_plan) -> list[bool]:
    """For each anti join of DataFusion's logical plan, in the order of its display (a node
    before its inputs, left before right), whether it is null-aware. DataFusion's Python API
    does not expose the flag on its ``Join`` node; its display is the one place that says it."""
    flags = []
    for line in logical_plan.display_indent().splitlines():
        text = line.strip()
        if text.startswith(("LeftAnti Join:", "Anti Join:")):
            flags.append(text.endswith(NULL_AWARE_MARK))
    return flags


def rule(logical_plan, ctx) -> Rule[plan_pb2.Plan]:
    """The rewrite of the plan produced from ``logical_plan`` in ``ctx``, as a named rule."""

    def apply(plan: plan_pb2.Plan) -> tuple[plan_pb2.Plan, bool]:
        return plan, keep_null_semantics(plan, logical_plan, ctx)

    return Rule("null_aware", apply)


def keep_null_semantics(plan: plan_pb2.Plan, logical_plan, ctx) -> bool:
    """Rewrite in ``plan`` (produced from ``logical_plan`` in ``ctx``) every null-aware anti
    join as the joins that mean the same; whether there was one. Raises ``NeedsHostEngine``
    for one that cannot be (DuckDB runs that super-plan)."""
    flags = null_aware_flags(logical_plan)
    if not any(flags):
        return False
    joins = [
        rel
        for rel in tree.iter_rels(plan)
        if tree.kind(rel) == "join" and rel.join.type in ANTI_JOIN_TYPES
    ]
    if len(joins) != len(flags):  # an anti join inside a subquery expression: order unsure
        raise NeedsHostEngine(CORRELATED_NOT_IN)
    # Innermost first: a rewrite copies the join's inputs, which must be rewritten already.
    for rel, null_aware in reversed(list(zip(joins, flags))):
        if null_aware:
            _rewrite(plan, rel, ctx)
    return True


def _rewrite(plan: plan_pb2.Plan, rel: algebra_pb2.Rel, ctx) -> None:
    join = rel.join
    names = tree.function_names(plan)
    equal = join.expression
    if join.HasField("post_join_filter") or expressions.function_name(equal, names) != "equal":
        raise NeedsHostEngine(CORRELATED_NOT_IN)
    width = len(engine.plan_schema(ctx, tree.make_plan(plan, join.left)))
    probe, build = expressions.arguments(equal)
    if not _reads_below(probe, width) or not _reads_from(build, width):
        raise NeedsHostEngine(CORRELATED_NOT_IN)

    inner = tree.copy_rel(rel)
    inner.join.ClearField("common")  # the outer join emits what the original did
    counts = algebra_pb2.Rel()
    counts.aggregate.input.CopyFrom(join.right)
    counts.aggregate.groupings.add()  # no keys: one row, even over no rows
    count = tree.declare_function(plan, "count")
    for argument in (_literal_i64(1), _shifted(build, -width)):
        measure = counts.aggregate.measures.add().measure
        measure.function_reference = count
        measure.invocation = algebra_pb2.AggregateFunction.AGGREGATION_INVOCATION_ALL
        measure.output_type.i64.nullability = type_pb2.Type.NULLABILITY_REQUIRED
        measure.arguments.add().value.CopyFrom(argument)

    rows, non_null = expressions.field_ref(width), expressions.field_ref(width + 1)
    empty_or_null = _call(
        plan,
        "or",
        _call(plan, "and", _call(plan, "gt", rows, _literal_i64(0)), _call(plan, "is_null", probe)),
        _call(plan, "not_equal", rows, non_null),
    )
    outer = algebra_pb2.Rel()
    if join.HasField("common"):
        outer.join.common.CopyFrom(join.common)
    outer.join.left.CopyFrom(inner)
    outer.join.right.CopyFrom(counts)
    outer.join.expression.CopyFrom(empty_or_null)
    outer.join.type = join.type
    rel.CopyFrom(outer)


def _reads_below(expression: Expression, width: int) -> bool:
    fields = _fields(expression)
    return bool(fields) and max(fields) < width


def _reads_from(expression: Expression, width: int) -> bool:
    fields = _fields(expression)
    return bool(fields) and min(fields) >= width


def _fields(expression: Expression) -> list[int]:
    """Every field the expression reads from its input; an outer reference (a correlated
    subquery inside it) makes it unreadable here."""
    found = []
    for item in tree.iter_messages(expression):
        if isinstance(item, Expression.FieldReference):
            if not item.HasField("root_reference"):
                return []
            found.append(item.direct_reference.struct_field.field)
    return found


def _shifted(expression: Expression, by: int) -> Expression:
    moved = Expression()
    moved.CopyFrom(expression)
    for item in tree.iter_messages(moved):
        if isinstance(item, Expression.FieldReference):
            item.direct_reference.struct_field.field += by
    return moved


def _literal_i64(value: int) -> Expression:
    literal = Expression()
    literal.literal.i64 = value
    return literal


def _call(plan: plan_pb2.Plan, name: str, *arguments: Expression) -> Expression:
    call = Expression()
    call.scalar_function.function_reference = tree.declare_function(plan, name)
    call.scalar_function.output_type.bool.nullability = type_pb2.Type.NULLABILITY_NULLABLE
    for argument in arguments:
        call.scalar_function.arguments.add().value.CopyFrom(argument)
    return call
