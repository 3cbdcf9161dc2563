"""A sub-plan's shape: its Substrait stages with every literal's value erased, hashed.

Two queries that differ only in their constants (``ke > 2`` and ``ke > 3``) have one shape. A
plan that made a device's engine fail with one constant is expected to fail with the next, so a
device quarantines the shape (``quarry.device.quarantine``), not the one query (Exadata
quarantines a SQL plan, not a statement's binds). The hash is of the plans serialized
deterministically: the same in every process and after a restart, so a quarantine kept on disk
still names the shape it was entered for.
"""

from __future__ import annotations

import functools
import hashlib

from google.protobuf.message import DecodeError
from substrait import algebra_pb2, plan_pb2

from quarry.plan import tree

PLAN_FIELDS = plan_pb2.Plan.DESCRIPTOR.fields_by_name
SHAPE_HEX_CHARS = 16  # 64 bits: a device holds a few shapes per dataset, never billions
# Stages repeat per request; each is erased once (bounded, like ``stage.prepare``'s cache).
ERASED_CACHE_ENTRIES_MAX = 256
# a plan's lists of declarations, whose order means nothing
DECLARATIONS = tuple(
    name for name in ("extension_uris", "extension_urns", "extensions") if name in PLAN_FIELDS
)


def shape_of(*stages: bytes) -> str:
    """The shape of a sub-plan made of these stages (in order; b"": a stage it lacks)."""
    digest = hashlib.sha256()
    for stage in stages:
        erased = _erased(stage)
        digest.update(len(erased).to_bytes(8, "big"))  # stages cannot run into each other
        digest.update(erased)
    return digest.hexdigest()[:SHAPE_HEX_CHARS]


@functools.lru_cache(maxsize=ERASED_CACHE_ENTRIES_MAX)
def _erased(stage: bytes) -> bytes:
    """The stage without its literals' values (their kinds kept: ``x > 2`` and ``x > 'a'``
    differ); bytes that are not a plan are their own shape."""
    if not stage:
        return b""
    try:
        plan = tree.parse_plan(stage)
    except DecodeError:
        return stage
    for item in tree.iter_messages(plan):
        if isinstance(item, algebra_pb2.Expression.Literal):
            _erase(item)
    _canonical_anchors(plan)
    # the producer declares the functions and their URIs in no fixed order: in order of their
    # bytes, one plan is one shape
    for field in DECLARATIONS:
        declared = sorted(
            getattr(plan, field), key=lambda d: d.SerializeToString(deterministic=True)
        )
        kept = [type(d).FromString(d.SerializeToString()) for d in declared]
        del getattr(plan, field)[:]
        getattr(plan, field).extend(kept)
    return plan.SerializeToString(deterministic=True)


def _canonical_anchors(plan: plan_pb2.Plan) -> None:
    """Functions numbered in order of their names: the producer numbers them as it meets them,
    which need not be the same from one plan of a shape to the next."""
    declared = [d.extension_function for d in plan.extensions if d.HasField("extension_function")]
    order = sorted(declared, key=lambda f: (f.name, f.function_anchor))
    renumbered = {f.function_anchor: number for number, f in enumerate(order)}
    try:
        for relation in plan.relations:
            tree.remap_function_anchors(relation, renumbered)
    except KeyError:  # a reference to nothing declared: no plan a device runs; as it is
        return
    for function in declared:
        function.function_anchor = renumbered[function.function_anchor]


def _erase(literal: algebra_pb2.Expression.Literal) -> None:
    """The literal's kind and nullability, its value gone."""
    kind = literal.WhichOneof("literal_type")
    nullable = literal.nullable
    literal.Clear()
    literal.nullable = nullable
    if kind is None:
        return
    field = literal.DESCRIPTOR.fields_by_name[kind]
    if field.message_type is not None:
        getattr(literal, kind).SetInParent()
    else:
        setattr(literal, kind, field.default_value)
