"""null_divisor: an integer divided, or taken modulo, by zero is NULL, not an error. A rule over
the query's Substrait plan, before the cut (``decompose.PLAN_RULES``), so the host and every
device compute it alike.

SQLite answers ``7 / 0`` and ``7 % 0`` with NULL, and so does DuckDB's integer division (``//``,
and ``/`` under ``integer_division``); DataFusion raises "Divide by zero" for the whole query.
The difference shows where a divisor is an aggregate over no rows (``52 / - COUNT(*)`` with a
filter nothing passes: SQLite's corpus has it), and a query that fails for one empty group is
worse than a NULL in that row. The divisor ``b`` becomes ``nullif(b, 0)``, the 0 typed as the
division's result so the types DataFusion coerces to, and with them the result's, are unchanged.
A literal non-zero divisor (``x / 2``, the common case) is left alone.

Only integer results: a floating-point division by zero is already IEEE's infinity or NaN in
both engines, and a decimal one is an error in DataFusion and a double in DuckDB, a difference
of type this rule cannot paper over.
"""

from __future__ import annotations

from substrait import algebra_pb2, plan_pb2

from quarry.plan import tree
from quarry.plan.rules import Rule

DIVISIONS = frozenset({"divide", "modulus"})
INTEGER_KINDS = frozenset({"i8", "i16", "i32", "i64"})


def null_zero_divisors(plan: plan_pb2.Plan) -> int:
    """Wrap, in place, each integer division's divisor that may be zero in ``nullif(_, 0)``;
    how many were."""
    names = tree.function_names(plan)
    divisions = [
        message
        for message in tree.iter_messages(plan)
        if isinstance(message, algebra_pb2.Expression.ScalarFunction)
        and names.get(message.function_reference) in DIVISIONS
        and message.output_type.WhichOneof("kind") in INTEGER_KINDS
        and len(message.arguments) == 2
        and not _nonzero_literal(message.arguments[1].value)
    ]
    if divisions:
        nullif = tree.declare_function(plan, "nullif")
        for division in divisions:
            _wrap(division, nullif)
    return len(divisions)


def _wrap(division: algebra_pb2.Expression.ScalarFunction, nullif: int) -> None:
    kind = division.output_type.WhichOneof("kind")
    divisor = algebra_pb2.Expression()
    divisor.CopyFrom(division.arguments[1].value)
    wrapped = division.arguments[1].value
    wrapped.Clear()
    function = wrapped.scalar_function
    function.function_reference = nullif
    function.output_type.CopyFrom(division.output_type)
    function.arguments.add().value.CopyFrom(divisor)
    setattr(function.arguments.add().value.literal, kind, 0)


def _nonzero_literal(expression: algebra_pb2.Expression) -> bool:
    if expression.WhichOneof("rex_type") != "literal":
        return False
    literal = expression.literal
    kind = literal.WhichOneof("literal_type")
    return kind in INTEGER_KINDS and getattr(literal, kind) != 0


def _null_divisors(plan: plan_pb2.Plan) -> tuple[plan_pb2.Plan, bool]:
    return plan, null_zero_divisors(plan) > 0


null_divisor = Rule("null_divisor", _null_divisors)
