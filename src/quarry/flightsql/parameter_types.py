"""The types a prepared statement's parameters take, as DataFusion infers them from where each
placeholder stands (``ke > ?`` takes a double, ``name = ?`` a string).

A client that binds by the parameter schema needs them: JDBC's binder writes each value into a
vector of the schema's type, and cannot write a number into an untyped (null) one. The statement
is planned as quarry would plan it (the same catalog registered in a DataFusion session), its
``?`` placeholders numbered, and the plan walked for the placeholders DataFusion typed. Where it
cannot tell (``SELECT ?``, ``LIMIT ?``, a placeholder in a subquery) the type stays null and the
client's own value decides, as it always does when it binds (``parameters.literal``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from datafusion import SQLOptions
from datafusion.expr import Placeholder

from quarry.flightsql.parameters import Placeholders
from quarry.plan import engine

PLAN_DEPTH_MAX = 256  # nodes and expressions deep: a walk stops there, leaving types unknown
# What a plan node's expressions are called, across DataFusion's node kinds.
EXPRESSIONS = (
    "predicate",
    "projections",
    "fetch",
    "skip",
    "group_by_exprs",
    "aggregate_exprs",
    "sort_exprs",
    "on",
    "filter",
    "filters",
)


def parameter_types(
    sql: str, placeholders: Placeholders, tables: Mapping[str, pa.Schema]
) -> list[pa.DataType]:
    """One type per parameter column (null where DataFusion leaves it open)."""
    unknown = [pa.null()] * placeholders.count
    if not placeholders.count:
        return unknown
    context = engine.session()
    engine.Catalog(dict(tables)).register(context)
    options = SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)
    try:
        plan = context.sql_with_options(_numbered(sql, placeholders), options).logical_plan()
    except Exception:  # a statement that does not plan fails, with its message, when it runs
        return unknown
    found: dict[str, pa.DataType] = {}
    _walk_plan(plan, found, 0)
    return [found.get(f"${column + 1}", pa.null()) for column in range(placeholders.count)]


def _numbered(sql: str, placeholders: Placeholders) -> str:
    """``sql`` with every placeholder written ``$n``, as DataFusion reads them."""
    pieces, last = [], 0
    for (start, end), column in zip(placeholders.spans, placeholders.columns):
        pieces += [sql[last:start], f"${column + 1}"]
        last = end
    return "".join([*pieces, sql[last:]])


def _walk_plan(plan: Any, found: dict[str, pa.DataType], depth: int) -> None:
    if depth > PLAN_DEPTH_MAX:
        return
    node = plan.to_variant()
    for name in EXPRESSIONS:
        accessor = getattr(node, name, None)
        if callable(accessor):
            for expression in _expressions(accessor()):
                _walk_expression(expression, found, depth + 1)
    for child in plan.inputs():
        _walk_plan(child, found, depth + 1)


def _expressions(value: Any) -> list[Any]:
    """The expressions in what a node's accessor returns: one, none, a list, pairs (a join's
    keys) or sort expressions."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [e for item in value for e in _expressions(item)]
    if hasattr(value, "rex_type"):
        return [value]
    inner = getattr(value, "expr", None)  # a sort expression
    return _expressions(inner()) if callable(inner) else []


def _walk_expression(expression: Any, found: dict[str, pa.DataType], depth: int) -> None:
    if depth > PLAN_DEPTH_MAX:
        return
    variant = expression.to_variant()
    if isinstance(variant, Placeholder):
        field = variant.field()
        if field is not None and not pa.types.is_null(field.type):
            found.setdefault(variant.id(), field.type)
        return
    if str(expression.rex_type()).endswith("Call"):
        children = expression.rex_call_operands()
    else:
        inner = getattr(variant, "expr", None)  # an alias
        children = [inner()] if callable(inner) else []
    for child in children:
        _walk_expression(child, found, depth + 1)
