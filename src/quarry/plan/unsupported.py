"""What valid SQL cannot run through Substrait, said before anything runs.

DataFusion answers these queries alone, but the Substrait plan its producer writes for them is
one its consumer cannot read back; the user gets a ``NotSupported`` naming the construct and a
way to write the query that runs, instead of DataFusion's message about its own internals.
"""

from __future__ import annotations

from substrait import plan_pb2

from quarry.plan.errors import NeedsHostEngine, NotSupported, PlanError

# DataFusion's producer writes Arrow's Null type as a user-defined type of this name, which its
# consumer does not know (DataFusion 55).
NULL_TYPE_NAME = "null"
PRODUCER_MESSAGE_CHARS_MAX = 200


def refuse_untyped_nulls(plan: plan_pb2.Plan) -> None:
    """An expression whose type is NULL (``SELECT NULL``, ``MAX(NULL)``, ``COALESCE(NULL,
    NULL)``) cannot be read back from Substrait."""
    for declaration in plan.extensions:
        if (
            declaration.HasField("extension_type")
            and declaration.extension_type.name == NULL_TYPE_NAME
        ):
            raise NotSupported(
                "a column or expression of type NULL (an untyped NULL, as in SELECT NULL or "
                "MAX(NULL)) is not supported\nhint: give the NULL a type, e.g. "
                "CAST(NULL AS INTEGER)"
            )


def producer_error(message: str) -> PlanError:
    """DataFusion's producer refused the plan: the reason, and what to do."""
    # DataFusion appends the whole plan to this message; its first clause says it all.
    reason = message.split(" {", 1)[0][:PRODUCER_MESSAGE_CHARS_MAX]
    if "OuterReferenceColumn" in message:  # its optimizer left a subquery correlated
        return NeedsHostEngine(
            "a correlated subquery that DataFusion cannot turn into a join (one correlated by "
            "more than equalities) is not supported\nhint: correlate on equalities only, or "
            "write the subquery as a join"
        )
    return PlanError(
        f"the query cannot be expressed as a Substrait plan: {reason}"
        "\nhint: only SELECT queries run on quarry"
    )
