"""Surgery helpers for Substrait protobuf trees: walking relations, reads, function anchors.

Substrait relations nest in two ways: through relation inputs and through expressions (scalar
subqueries, IN / EXISTS subqueries). Every walk here goes through both, so a stored-dataset read
inside a subquery is found like any other.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from substrait import algebra_pb2, plan_pb2

# Relations with exactly one input, by oneof name; the decomposition rules only move these.
SINGLE_INPUT_RELS = ("filter", "project", "aggregate", "sort", "fetch")

# Protobuf refuses to go deeper than this when parsing; a walk deeper than it is a bug.
WALK_DEPTH_MAX = 10_000


def allow_deep_parsing() -> None:
    """Let Python's protobuf parse plans of any depth: upb refuses messages nested past 100
    levels unless told to allow oversize ones (a 64-way join's plan is about 250 levels; the
    pure-Python parser has no such bound). DataFusion's own bound is ``depth``'s."""
    try:
        from google._upb import _message
    except ImportError:  # another protobuf implementation: no bound of this kind
        return
    _message.SetAllowOversizeProtos(True)


allow_deep_parsing()


def parse_plan(data: bytes) -> plan_pb2.Plan:
    """A plan from its bytes, whatever its depth (``allow_deep_parsing``)."""
    plan = plan_pb2.Plan()
    plan.ParseFromString(data)
    return plan


def copy_plan(plan: plan_pb2.Plan) -> plan_pb2.Plan:
    copied = plan_pb2.Plan()
    copied.CopyFrom(plan)
    return copied


def copy_rel(rel: algebra_pb2.Rel) -> algebra_pb2.Rel:
    copied = algebra_pb2.Rel()
    copied.CopyFrom(rel)
    return copied


def root_rel(plan: plan_pb2.Plan) -> algebra_pb2.Rel:
    assert len(plan.relations) == 1, f"a query plan has one root, found {len(plan.relations)}"
    relation = plan.relations[0]
    return relation.root.input if relation.HasField("root") else relation.rel


def children(message: Message) -> Iterator[Message]:
    """The direct sub-messages of `message`."""
    for field, value in message.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if field.is_repeated:
            if field.message_type.GetOptions().map_entry:
                continue  # Substrait's relations and expressions hold no maps.
            yield from value
        else:
            yield value


def iter_messages(message: Message) -> Iterator[Message]:
    """Every sub-message of `message`, pre-order, `message` itself first. A stack, not nested
    generators: each item of a nested ``yield from`` passes through every level above it, so a
    walk of a plan hundreds of levels deep (a 64-way join) cost its size times its depth."""
    stack: list[tuple[Message, int]] = [(message, 0)]
    while stack:
        item, depth = stack.pop()
        assert depth < WALK_DEPTH_MAX, "Substrait tree deeper than protobuf allows"
        yield item
        below = list(children(item))
        stack.extend((child, depth + 1) for child in reversed(below))


def iter_rels(message: Message) -> Iterator[algebra_pb2.Rel]:
    """Every relation under `message` (itself included), through inputs and subqueries, in
    the order `iter_messages` meets them. Sub-messages of a kind that can hold no relation (a
    type, a literal, a field reference: most of a plan's messages) are not walked."""
    stack: list[tuple[Message, int]] = [(message, 0)]
    while stack:
        item, depth = stack.pop()
        assert depth < WALK_DEPTH_MAX, "Substrait tree deeper than protobuf allows"
        if isinstance(item, algebra_pb2.Rel):
            yield item
        below: list[Message] = []
        for field, value in item.ListFields():
            if field.type == FieldDescriptor.TYPE_MESSAGE and _may_hold_rel(field.message_type):
                below.extend(value) if field.is_repeated else below.append(value)
        stack.extend((child, depth + 1) for child in reversed(below))


def iter_rels_nested(message: Message) -> Iterator[tuple[algebra_pb2.Rel, int]]:
    """``iter_rels``' relations, each with how many relations hold it (its own subtree is the
    run of relations after it nested deeper)."""
    stack: list[tuple[Message, int, int]] = [(message, 0, 0)]
    while stack:
        item, depth, nested = stack.pop()
        assert depth < WALK_DEPTH_MAX, "Substrait tree deeper than protobuf allows"
        if isinstance(item, algebra_pb2.Rel):
            yield item, nested
            nested += 1
        below: list[Message] = []
        for field, value in item.ListFields():
            if field.type == FieldDescriptor.TYPE_MESSAGE and _may_hold_rel(field.message_type):
                below.extend(value) if field.is_repeated else below.append(value)
        stack.extend((child, depth + 1, nested) for child in reversed(below))


@functools.cache
def _may_hold_rel(descriptor: Descriptor) -> bool:
    """Whether a message of this kind can have a relation at or under it."""
    seen: set[str] = set()
    todo = [descriptor]
    while todo:
        kind = todo.pop()
        if kind.full_name == algebra_pb2.Rel.DESCRIPTOR.full_name:
            return True
        if kind.full_name in seen:
            continue
        seen.add(kind.full_name)
        todo.extend(f.message_type for f in kind.fields if f.message_type is not None)
    return False


def kind(rel: algebra_pb2.Rel) -> str:
    """The relation's oneof name: "read", "filter", "project", "aggregate", "join", ..."""
    name = rel.WhichOneof("rel_type")
    assert name is not None, "relation without a type"
    return name


def body(rel: algebra_pb2.Rel) -> Message:
    """The typed relation inside the `Rel` wrapper (a ReadRel, FilterRel, ...)."""
    return getattr(rel, kind(rel))


def single_input(rel: algebra_pb2.Rel) -> algebra_pb2.Rel | None:
    if kind(rel) in SINGLE_INPUT_RELS:
        return body(rel).input
    return None


def named_table(rel: algebra_pb2.Rel) -> tuple[str, ...] | None:
    """The named table a read relation reads, or None for anything else."""
    if kind(rel) != "read" or not rel.read.HasField("named_table"):
        return None
    return tuple(rel.read.named_table.names)


def replace(rel: algebra_pb2.Rel, replacement: algebra_pb2.Rel) -> None:
    """Replace `rel` in place, even when `replacement` is a descendant of `rel`."""
    detached = copy_rel(replacement)
    rel.CopyFrom(detached)


def function_names(plan: plan_pb2.Plan) -> dict[int, str]:
    """Function anchor -> plain function name (the signature suffix after ':' dropped)."""
    names: dict[int, str] = {}
    for declaration in plan.extensions:
        if declaration.HasField("extension_function"):
            function = declaration.extension_function
            names[function.function_anchor] = function.name.split(":", 1)[0]
    return names


def declare_function(plan: plan_pb2.Plan, name: str) -> int:
    """The anchor of function `name` in `plan`, declaring it if absent.

    DataFusion resolves functions by name alone (its producer writes no extension URN), so a
    declaration copies that convention from the plan's existing ones.
    """
    for anchor, declared in function_names(plan).items():
        if declared == name:
            return anchor
    anchors = [
        d.extension_function.function_anchor
        for d in plan.extensions
        if d.HasField("extension_function")
    ]
    anchor = max(anchors, default=-1) + 1
    declaration = plan.extensions.add()
    declaration.extension_function.function_anchor = anchor
    declaration.extension_function.name = name
    urn_reference = _urn_reference_convention(plan)
    if urn_reference is not None:
        declaration.extension_function.extension_urn_reference = urn_reference
    return anchor


def _urn_reference_convention(plan: plan_pb2.Plan) -> int | None:
    for declaration in plan.extensions:
        if declaration.HasField("extension_function"):
            return declaration.extension_function.extension_urn_reference
    return None


def used_function_anchors(message: Message) -> set[int]:
    anchors: set[int] = set()
    for item in iter_messages(message):
        if isinstance(
            item,
            (
                algebra_pb2.Expression.ScalarFunction,
                algebra_pb2.AggregateFunction,
                algebra_pb2.Expression.WindowFunction,
            ),
        ):
            anchors.add(item.function_reference)
    return anchors


def remap_function_anchors(message: Message, mapping: dict[int, int]) -> None:
    for item in iter_messages(message):
        if isinstance(
            item,
            (
                algebra_pb2.Expression.ScalarFunction,
                algebra_pb2.AggregateFunction,
                algebra_pb2.Expression.WindowFunction,
            ),
        ):
            item.function_reference = mapping[item.function_reference]


def import_rel(
    target: plan_pb2.Plan, source: plan_pb2.Plan, rel: algebra_pb2.Rel
) -> algebra_pb2.Rel:
    """A copy of `rel` (from `source`) whose function anchors are valid in `target`."""
    imported = copy_rel(rel)
    source_names = function_names(source)
    mapping = {
        anchor: declare_function(target, source_names[anchor])
        for anchor in used_function_anchors(imported)
    }
    remap_function_anchors(imported, mapping)
    return imported


def make_plan(
    template: plan_pb2.Plan, rel: algebra_pb2.Rel, names: list[str] | None = None
) -> plan_pb2.Plan:
    """A standalone plan for `rel`, declaring only the functions `rel` uses.

    Unused declarations are dropped so that a device never has to resolve a function its
    sub-plan does not call (such as a host-only merge function).
    """
    plan = plan_pb2.Plan()
    plan.version.CopyFrom(template.version)
    used = used_function_anchors(rel)
    for declaration in template.extensions:
        if (
            declaration.HasField("extension_function")
            and declaration.extension_function.function_anchor in used
        ):
            plan.extensions.append(declaration)
    for urn in template.extension_urns:
        plan.extension_urns.append(urn)
    root = plan.relations.add().root
    root.input.CopyFrom(rel)
    if names:
        root.names.extend(names)
    return plan


def set_named_table(rel: algebra_pb2.Rel, names: list[str]) -> None:
    assert kind(rel) == "read", "only a read relation names a table"
    del rel.read.named_table.names[:]
    rel.read.named_table.names.extend(names)


def read_field_names(read: algebra_pb2.ReadRel) -> list[str]:
    """Top-level column names of a read's base schema (nested struct names skipped)."""
    names = list(read.base_schema.names)
    types = list(read.base_schema.struct.types)
    # NamedStruct names are depth-first over nested structs; TPC-H-like flat schemas map 1:1,
    # nested ones are walked so the top-level names come out right.
    top: list[str] = []
    position = 0
    for substrait_type in types:
        top.append(names[position])
        position += 1 + nested_name_count(substrait_type)
    assert position == len(names), "base schema names do not match its types"
    return top


def nested_name_count(substrait_type) -> int:
    if substrait_type.WhichOneof("kind") == "struct":
        return sum(1 + nested_name_count(t) for t in substrait_type.struct.types)
    return 0


def read_output_fields(read: algebra_pb2.ReadRel) -> list[int]:
    """Indices into the base schema that the read outputs, honouring its projection mask."""
    field_count = len(read.base_schema.struct.types)
    if not read.HasField("projection"):
        return list(range(field_count))
    select = read.projection.select
    fields: list[int] = []
    for item in select.struct_items:
        assert not item.HasField("child"), "nested projection masks are not produced by DataFusion"
        fields.append(item.field)
    return fields
