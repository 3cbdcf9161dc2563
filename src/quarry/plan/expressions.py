"""Substrait expressions: field references, conjuncts, literals, and a readable rendering."""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Mapping, Sequence

from substrait import algebra_pb2, plan_pb2, type_pb2

from quarry.plan import tree

Expression = algebra_pb2.Expression

# Functions whose value differs between evaluations: evaluating them per device, or twice
# (the filter stage and again in the full stage), would change the answer.
NONDETERMINISTIC_FUNCTIONS = frozenset(
    {"random", "uuid", "rand", "now", "current_time", "current_date", "current_timestamp"}
)

COMPARISONS = {"equal": "=", "not_equal": "!=", "lt": "<", "lte": "<=", "gt": ">", "gte": ">="}
# a op b  ==  b op' a
FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
NULL_TESTS = {"is_null": "is_null", "is_not_null": "is_not_null"}

_BINARY_SYMBOLS = {
    **COMPARISONS,
    "and": "AND",
    "or": "OR",
    "add": "+",
    "subtract": "-",
    "multiply": "*",
    "divide": "/",
    "modulus": "%",
    "like": "LIKE",
    "ilike": "ILIKE",
    "is_distinct_from": "IS DISTINCT FROM",
    "is_not_distinct_from": "IS NOT DISTINCT FROM",
}


def field_ref(index: int) -> Expression:
    expression = Expression()
    expression.selection.direct_reference.struct_field.field = index
    expression.selection.root_reference.SetInParent()
    return expression


def field_index(expression: Expression) -> int | None:
    """The input field a plain column reference points at, else None."""
    if expression.WhichOneof("rex_type") != "selection":
        return None
    selection = expression.selection
    if not selection.HasField("root_reference") or not selection.HasField("direct_reference"):
        return None
    segment = selection.direct_reference
    if segment.WhichOneof("reference_type") != "struct_field":
        return None
    if segment.struct_field.HasField("child"):
        return None
    return segment.struct_field.field


def literal_int(expression: Expression) -> int | None:
    """The value of an integer literal (a fetch's count or offset), else None."""
    if expression.WhichOneof("rex_type") != "literal":
        return None
    literal = expression.literal
    which = literal.WhichOneof("literal_type")
    return int(getattr(literal, which)) if which in ("i8", "i16", "i32", "i64") else None


def function_name(expression: Expression, names: Mapping[int, str]) -> str | None:
    if expression.WhichOneof("rex_type") != "scalar_function":
        return None
    return names.get(expression.scalar_function.function_reference)


def arguments(expression: Expression) -> list[Expression]:
    return [argument.value for argument in expression.scalar_function.arguments]


def conjuncts(expression: Expression, names: Mapping[int, str]) -> list[Expression]:
    """The AND-ed parts of a predicate, flattened."""
    if function_name(expression, names) == "and":
        parts: list[Expression] = []
        for argument in arguments(expression):
            parts.extend(conjuncts(argument, names))
        return parts
    copied = Expression()
    copied.CopyFrom(expression)
    return [copied]


def conjoin(parts: Sequence[Expression], plan: plan_pb2.Plan) -> Expression:
    """AND of `parts` (at least one), left-deep so evaluation order is the list order."""
    assert parts, "conjoin needs at least one conjunct"
    result = Expression()
    result.CopyFrom(parts[0])
    if len(parts) == 1:
        return result
    anchor = tree.declare_function(plan, "and")
    for part in parts[1:]:
        combined = Expression()
        function = combined.scalar_function
        function.function_reference = anchor
        function.output_type.bool.nullability = type_pb2.Type.NULLABILITY_NULLABLE
        function.arguments.add().value.CopyFrom(result)
        function.arguments.add().value.CopyFrom(part)
        result = combined
    return result


def referenced_fields(expression: Expression) -> set[int]:
    """Input fields the expression reads at its own level (not inside subqueries)."""
    fields: set[int] = set()
    _collect_fields(expression, fields)
    return fields


def _collect_fields(message, fields: set[int]) -> None:
    if isinstance(message, Expression):
        index = field_index(message)
        if index is not None:
            fields.add(index)
            return
        if message.WhichOneof("rex_type") == "subquery":
            return  # a subquery's references are to its own input
    for child in tree.children(message):
        _collect_fields(child, fields)


def is_row_local(message, names: Mapping[int, str]) -> bool:
    """True when the expression(s) depend only on the current row of the relation's input.

    Such expressions can run on any device, per slice, and twice, with the same result.
    """
    for item in tree.iter_messages(message):
        if isinstance(item, Expression):
            rex = item.WhichOneof("rex_type")
            if rex in (
                "subquery",
                "window_function",
                "dynamic_parameter",
                "execution_context_variable",
            ):
                return False
            if rex == "scalar_function":
                name = names.get(item.scalar_function.function_reference)
                if name in NONDETERMINISTIC_FUNCTIONS:
                    return False
        if isinstance(item, Expression.FieldReference) and item.HasField("outer_reference"):
            return False
    return True


def literal_value(literal: Expression.Literal) -> tuple[object, str] | None:
    """A literal as (Python value, type tag), or None for nulls and types zone maps lack."""
    which = literal.WhichOneof("literal_type")
    if which == "boolean":
        return literal.boolean, "bool"
    if which in ("i8", "i16", "i32", "i64"):
        return getattr(literal, which), "int"
    if which in ("fp32", "fp64"):
        value = getattr(literal, which)
        return (value, "float") if math.isfinite(value) else None
    if which == "string":
        return literal.string, "str"
    if which == "var_char":
        return literal.var_char.value, "str"
    if which == "fixed_char":
        return literal.fixed_char, "str"
    if which == "date":
        return datetime.date(1970, 1, 1) + datetime.timedelta(days=literal.date), "date"
    if which == "decimal":
        unscaled = int.from_bytes(literal.decimal.value, "little", signed=True)
        return decimal.Decimal(unscaled).scaleb(-literal.decimal.scale), "decimal"
    if which == "precision_timestamp":
        return _timestamp(literal.precision_timestamp, None), "timestamp"
    if which == "precision_timestamp_tz":
        return _timestamp(literal.precision_timestamp_tz, datetime.UTC), "timestamp"
    return None


def _timestamp(value, timezone: datetime.tzinfo | None) -> datetime.datetime:
    microseconds = value.value * 10**6 // 10**value.precision
    epoch = datetime.datetime(1970, 1, 1, tzinfo=timezone)
    return epoch + datetime.timedelta(microseconds=microseconds)


def json_value(value: object, type_tag: str) -> object:
    """A literal in a JSON-serializable form; `prune.decode_value` reverses it."""
    if type_tag in ("date", "timestamp"):
        return value.isoformat()  # type: ignore[attr-defined]
    if type_tag == "decimal":
        return str(value)
    return value


def simple_predicate(
    expression: Expression, names: Mapping[int, str], field_names: Sequence[str]
) -> dict | None:
    """The zone-map-prunable form of a conjunct, or None when it is not that simple.

    Simple means: column op literal (either side), column IS NULL, column IS NOT NULL.
    """
    name = function_name(expression, names)
    if name in NULL_TESTS:
        (argument,) = arguments(expression)
        index = field_index(argument)
        if index is None:
            return None
        return {"column": field_names[index], "op": NULL_TESTS[name]}
    if name not in COMPARISONS:
        return None
    left, right = arguments(expression)
    op = COMPARISONS[name]
    left_index, right_index = field_index(left), field_index(right)
    if left_index is not None and right.WhichOneof("rex_type") == "literal":
        index, literal = left_index, right.literal
    elif right_index is not None and left.WhichOneof("rex_type") == "literal":
        index, literal, op = right_index, left.literal, FLIPPED[op]
    else:
        return None
    decoded = literal_value(literal)
    if decoded is None:
        return None
    value, type_tag = decoded
    return {
        "column": field_names[index],
        "op": op,
        "value": json_value(value, type_tag),
        "type": type_tag,
    }


def render(
    expression: Expression, names: Mapping[int, str], field_names: Sequence[str] | None = None
) -> str:
    """A SQL-like rendering for EXPLAIN; not meant to be parsed back."""
    rex = expression.WhichOneof("rex_type")
    if rex == "selection":
        index = field_index(expression)
        if index is None:
            return "<field>"
        if field_names is not None and index < len(field_names):
            return field_names[index]
        return f"#{index}"
    if rex == "literal":
        return _render_literal(expression.literal)
    if rex == "scalar_function":
        name = names.get(expression.scalar_function.function_reference, "?")
        parts = [render(argument, names, field_names) for argument in arguments(expression)]
        if name in _BINARY_SYMBOLS and len(parts) == 2:
            return f"({parts[0]} {_BINARY_SYMBOLS[name]} {parts[1]})"
        if name in ("and", "or"):
            return "(" + f" {_BINARY_SYMBOLS[name]} ".join(parts) + ")"
        if name in ("like", "ilike") and len(parts) >= 2:
            return f"({parts[0]} {_BINARY_SYMBOLS[name]} {parts[1]})"
        if name == "not" and len(parts) == 1:
            return f"NOT {parts[0]}"
        if name == "is_null" and len(parts) == 1:
            return f"{parts[0]} IS NULL"
        if name == "is_not_null" and len(parts) == 1:
            return f"{parts[0]} IS NOT NULL"
        if name == "negate" and len(parts) == 1:
            return f"-{parts[0]}"
        return f"{name}({', '.join(parts)})"
    if rex == "cast":
        inner = render(expression.cast.input, names, field_names)
        return f"CAST({inner} AS {expression.cast.type.WhichOneof('kind')})"
    if rex == "singular_or_list":
        value = render(expression.singular_or_list.value, names, field_names)
        options = ", ".join(
            render(option, names, field_names) for option in expression.singular_or_list.options
        )
        return f"{value} IN ({options})"
    if rex == "if_then":
        clauses = " ".join(
            f"WHEN {render(getattr(clause, 'if'), names, field_names)} "
            f"THEN {render(clause.then, names, field_names)}"
            for clause in expression.if_then.ifs
        )
        otherwise = render(getattr(expression.if_then, "else"), names, field_names)
        return f"CASE {clauses} ELSE {otherwise} END"
    if rex == "subquery":
        return "(subquery)"
    return f"<{rex}>"


def _render_literal(literal: Expression.Literal) -> str:
    decoded = literal_value(literal)
    if decoded is None:
        return "NULL" if literal.WhichOneof("literal_type") == "null" else "<literal>"
    value, type_tag = decoded
    if type_tag == "str":
        return "'" + str(value).replace("'", "''") + "'"
    if type_tag == "date":
        return f"DATE '{value}'"
    if type_tag == "timestamp":
        return f"TIMESTAMP '{value}'"
    return str(value)


def structurally_equal(left: Expression, right: Expression) -> bool:
    return left.SerializeToString(deterministic=True) == right.SerializeToString(deterministic=True)
