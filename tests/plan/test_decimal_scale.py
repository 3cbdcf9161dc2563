"""decimal_scale: a literal added to or subtracted from a decimal is written at the result's
scale, changing no type and no value."""

from __future__ import annotations

import pytest
from substrait import algebra_pb2

from quarry.plan import decompose, tree

from .harness import assert_same_rows, execute


def decimal_literals(plan_bytes: bytes) -> list[tuple[int, int, int]]:
    """(value, precision, scale) of every decimal literal of a plan."""
    found = []
    for message in tree.iter_messages(tree.parse_plan(plan_bytes)):
        if isinstance(message, algebra_pb2.Expression.Literal) and message.HasField("decimal"):
            value = int.from_bytes(message.decimal.value, "little", signed=True)
            found.append((value, message.decimal.precision, message.decimal.scale))
    return found


def unaligned(sql: str, schemas: dict):
    """The decomposition as DataFusion typed it, literals untouched: no plan rule."""
    return decompose(sql, schemas, plan_rules=())


def test_tpch_q1_literals_take_the_columns_scale(tpch) -> None:
    """``1 - l_discount`` and ``1 + l_tax``: the integer 1, Decimal128(20, 0) as DataFusion types
    it, is 100 at Decimal128(22, 2) on the devices; every type, and the answer, are the same."""
    sql = tpch.queries[1]
    aligned, before = decompose(sql, tpch.schemas), unaligned(sql, tpch.schemas)
    (fragment,) = aligned.fragments
    assert decimal_literals(fragment.stages["full"]) == [(100, 22, 2), (100, 22, 2)]
    assert decimal_literals(before.fragments[0].stages["full"]) == [(1, 20, 0), (1, 20, 0)]
    # (the columns are named after their expressions, the literal spelled out)
    assert fragment.output_schema.types == before.fragments[0].output_schema.types
    assert aligned.output_schema.equals(before.output_schema)
    answer = execute(aligned, tpch.data)
    assert answer.equals(execute(before, tpch.data))  # to the last digit, types and all
    assert_same_rows(answer, tpch.expected(1), ordered=True)


@pytest.mark.parametrize(
    "expression",
    [
        "p - 1",  # an integer below the column's scale
        "-3 + p",  # a negative one, first operand
        "p + 0.5",  # a decimal literal of a smaller scale
        "(p - 2) * (1 + p)",  # nested: each sum's own scale
        "p - 1.255",  # already finer than the column: the sum takes the literal's scale
        "p * 2",  # a product: its scale is the operands' sum, the literal stays as it is
    ],
)
def test_sums_keep_their_types_and_values(small, expression: str) -> None:
    sql = f"SELECT id, {expression} AS v FROM t WHERE k < 4"
    aligned, before = decompose(sql, small.schemas), unaligned(sql, small.schemas)
    assert aligned.output_schema.equals(before.output_schema)
    answer = execute(aligned, small.data, "random", seed=5)
    assert answer.sort_by("id").equals(execute(before, small.data).sort_by("id"))
    assert_same_rows(answer, small.expected(sql), ordered=False)


def test_products_and_wide_literals_are_left_alone(small) -> None:
    """A factor's scale is part of the product's type; a literal already at 38 digits would not
    fit once shifted."""
    product = decompose("SELECT p * 2 AS v FROM t", small.schemas)
    assert decimal_literals(product.fragments[0].stages["full"]) in ([], [(2, 20, 0)])
    wide = decompose("SELECT p + CAST(1 AS DECIMAL(38, 0)) AS v FROM t", small.schemas).fragments[0]
    assert all(scale == 0 for _, _, scale in decimal_literals(wide.stages["full"]))
