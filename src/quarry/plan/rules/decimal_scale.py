"""decimal_scale: decimal literals added to or subtracted from a decimal, written at the sum's
scale. A rule over the query's Substrait plan, before the cut (``decompose.PLAN_RULES``): every
fragment cut from the plan then carries the literal as rewritten.

DataFusion types the integer literal of ``1 - l_discount`` as Decimal128(20, 0). The difference
has the column's scale, 2, and the engine brings the operands to it for every batch: each value
of the column goes through a rescaling kernel, though only the literal needed it. Written once
here as Decimal128(22, 2), 100, the literal is already there. Its integer digits (20) and its
scale are those of the operation's result, so the result's type is unchanged, and with it every
type above it: the rewrite changes no answer, no output schema, only the work (TPC-H Q1's device
stage, two such literals: 73 to 59 ms of CPU per million rows).

Only addition and subtraction: their result's scale is the larger operand's, which the plan
states (the function's output type). A product's scale is the sum of its operands', so a
rescaled factor would change the product's type; and a comparison states no operand's type.
"""

from __future__ import annotations

from substrait import algebra_pb2, plan_pb2

from quarry.plan import tree
from quarry.plan.rules import Rule

ALIGNED_FUNCTIONS = frozenset({"add", "subtract"})
DECIMAL_DIGITS_MAX = 38  # Decimal128's precision
DECIMAL_BYTES = 16


def align_decimal_literals(plan: plan_pb2.Plan) -> int:
    """Rescale, in place, each decimal literal of an addition or subtraction whose result has
    a larger scale than the literal; how many were."""
    names = tree.function_names(plan)
    rescaled = 0
    for message in tree.iter_messages(plan):
        if not isinstance(message, algebra_pb2.Expression.ScalarFunction):
            continue
        if names.get(message.function_reference) not in ALIGNED_FUNCTIONS:
            continue
        if message.output_type.WhichOneof("kind") != "decimal":
            continue
        scale = message.output_type.decimal.scale
        rescaled += sum(_rescaled(argument.value, scale) for argument in message.arguments)
    return rescaled


def _align(plan: plan_pb2.Plan) -> tuple[plan_pb2.Plan, bool]:
    return plan, align_decimal_literals(plan) > 0


decimal_scale = Rule("decimal_scale", _align)


def _rescaled(expression: algebra_pb2.Expression, scale: int) -> bool:
    """``expression``, a decimal literal below ``scale``, written at it; False if it is not one
    (or would not fit Decimal128 once its digits grow by the shift)."""
    if expression.WhichOneof("rex_type") != "literal":
        return False
    if expression.literal.WhichOneof("literal_type") != "decimal":
        return False
    literal = expression.literal.decimal
    shift = scale - literal.scale
    if shift <= 0 or literal.precision + shift > DECIMAL_DIGITS_MAX:
        return False
    value = int.from_bytes(literal.value, "little", signed=True) * 10**shift
    literal.value = value.to_bytes(DECIMAL_BYTES, "little", signed=True)
    literal.precision += shift
    literal.scale = scale
    return True
