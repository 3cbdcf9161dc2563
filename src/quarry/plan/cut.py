"""The cut being made: the super-plan in progress and one draft fragment per stored-dataset read.

The starting cut isolates every read of a stored dataset: the read moves into its own fragment
and the super-plan reads, in its place, a table named after the fragment (`__quarry_fragment_k`).
Each rule then moves operators sitting right above such a placeholder from the super-plan into
the fragment. Because parents address their input's fields by position, a move is only correct
when the fragment's output has exactly the fields the moved operator produced; every rule keeps
that invariant and `decompose.finalize` asserts it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from datafusion import SessionContext
from substrait import algebra_pb2, plan_pb2

from quarry.plan import engine, tree
from quarry.plan.capabilities import Capabilities

FRAGMENT_PREFIX = "__quarry_fragment_"
SelectivityEstimate = Callable[[dict], "float | None"]


@dataclass
class FragmentDraft:
    index: int
    dataset: str
    rel: algebra_pb2.Rel  # the fragment; its one read reads the dataset
    capabilities: Capabilities
    raw_empty: bool = False  # the query reads no column: one travels for row counts
    # Fields the super-plan reads from the fragment, by position: every rule keeps it equal to
    # what the moved operators produced, and `finalize` checks the built fragment against it.
    width: int = 0
    raw_level: bool = True  # only filters absorbed so far: they see raw columns
    raw_conjuncts: list[algebra_pb2.Expression] = field(default_factory=list)
    device_conjuncts: list[algebra_pb2.Expression] | None = None  # filter stage, in order
    host_conjuncts: list[algebra_pb2.Expression] = field(default_factory=list)
    # raw conjuncts a zone map can judge, JSON-serializable (``prune_slices``)
    predicates: list[dict] = field(default_factory=list)
    pushed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    open: bool = True  # whether operators above may still move in

    @property
    def name(self) -> str:
        return f"{FRAGMENT_PREFIX}{self.index}"

    @property
    def read(self) -> algebra_pb2.ReadRel:
        reads = [rel for rel in tree.iter_rels(self.rel) if tree.kind(rel) == "read"]
        assert len(reads) == 1, f"a fragment reads one dataset, {self.name} has {len(reads)} reads"
        return reads[0].read

    def push(self, operator: str) -> None:
        if operator not in self.pushed:
            self.pushed.append(operator)


@dataclass
class Cut:
    plan: plan_pb2.Plan  # the super-plan in progress
    fragments: list[FragmentDraft]
    ctx: SessionContext  # empty dataset tables and typed fragment tables
    catalog: engine.Catalog
    selectivity: SelectivityEstimate | None = None

    def copy(self) -> Cut:
        """A deep copy of the plan and drafts: the one the optimizer's rules change in place."""
        return Cut(
            tree.copy_plan(self.plan),
            copy.deepcopy(self.fragments),
            self.ctx,
            self.catalog,
            self.selectivity,
        )

    def function_names(self) -> dict[int, str]:
        return tree.function_names(self.plan)

    def fragment_of(self, rel: algebra_pb2.Rel) -> FragmentDraft | None:
        """The open fragment whose placeholder `rel` is, if any."""
        names = tree.named_table(rel)
        if names is None or len(names) != 1 or not names[0].startswith(FRAGMENT_PREFIX):
            return None
        fragment = self.fragments[int(names[0][len(FRAGMENT_PREFIX) :])]
        return fragment if fragment.open else None

    def sites(self, rel_kind: str) -> Iterator[tuple[algebra_pb2.Rel, FragmentDraft]]:
        """Relations of `rel_kind` sitting directly on an open fragment's placeholder."""
        for rel in tree.iter_rels(self.plan):
            if tree.kind(rel) != rel_kind:
                continue
            fragment = self.fragment_of(tree.single_input(rel))
            if fragment is not None:
                yield rel, fragment

    def fragment_plan(self, fragment: FragmentDraft) -> plan_pb2.Plan:
        return tree.make_plan(self.plan, fragment.rel)

    def fragment_schema(self, fragment: FragmentDraft) -> pa.Schema:
        return engine.plan_schema(self.ctx, self.fragment_plan(fragment))

    def rel_schema(self, rel: algebra_pb2.Rel) -> pa.Schema:
        """Output schema of a relation that reads datasets or typed fragment tables only."""
        return engine.plan_schema(self.ctx, tree.make_plan(self.plan, rel))

    def register_fragment_table(self, fragment: FragmentDraft, schema: pa.Schema) -> None:
        """Type the fragment's table in the planning context, so host operators can be planned."""
        if self.ctx.table_exist(fragment.name):
            self.ctx.deregister_table(fragment.name)
        engine.register_batches(self.ctx, fragment.name, schema, [])


def placeholder(name: str) -> algebra_pb2.Rel:
    """An untyped read of a fragment's table; `decompose.finalize` types it."""
    rel = algebra_pb2.Rel()
    rel.read.named_table.names.append(name)
    return rel


def initial_cut(
    plan: plan_pb2.Plan,
    catalog: engine.Catalog,
    ctx: SessionContext,
    capabilities: Mapping[str, Capabilities],
    selectivity: SelectivityEstimate | None = None,
) -> Cut:
    """Every read of a stored dataset becomes a fragment that reads only the needed columns."""
    super_plan = tree.copy_plan(plan)
    fragments: list[FragmentDraft] = []
    for rel in list(tree.iter_rels(super_plan)):
        names = tree.named_table(rel)
        if names is None:
            continue
        dataset = catalog.dataset_of(names)
        if dataset is None:
            continue
        read = rel.read
        assert not read.HasField("filter") and not read.HasField("best_effort_filter"), (
            "filters are planned as FilterRel over in-memory tables; a read filter would be lost"
        )
        fragment_rel, raw_empty = _column_pruned_read(read)
        caps = capabilities.get(dataset, capabilities.get("*", Capabilities.full()))
        width = len(tree.read_output_fields(read))
        fragment = FragmentDraft(
            len(fragments), dataset, fragment_rel, caps, raw_empty=raw_empty, width=width
        )
        if len(tree.read_field_names(fragment.read)) < len(tree.read_field_names(read)):
            fragment.push("projection")
        fragments.append(fragment)
        tree.replace(rel, placeholder(fragment.name))
    return Cut(super_plan, fragments, ctx, catalog, selectivity)


# Byte widths used to pick the cheapest column to carry row counts when a query reads none.
_TYPE_WIDTHS = {
    "bool": 1,
    "i8": 1,
    "i16": 2,
    "i32": 4,
    "date": 4,
    "fp32": 4,
    "i64": 8,
    "fp64": 8,
    "precision_timestamp": 8,
    "precision_timestamp_tz": 8,
    "decimal": 16,
}
_VARIABLE_WIDTH = 64


def _column_pruned_read(read: algebra_pb2.ReadRel) -> tuple[algebra_pb2.Rel, bool]:
    """A read whose base schema is exactly the columns the query needs, in output order.

    The raw stage ships exactly this schema, so the host can run the full stage over raw rows.
    When no column is needed (count(*)), the cheapest column travels and a mask hides it.
    """
    slices = _name_slices(read)
    types = list(read.base_schema.struct.types)
    selected = tree.read_output_fields(read)
    raw_empty = not selected
    if raw_empty:
        widths = [_TYPE_WIDTHS.get(t.WhichOneof("kind"), _VARIABLE_WIDTH) for t in types]
        selected = [widths.index(min(widths))]
    rel = algebra_pb2.Rel()
    pruned = rel.read
    pruned.named_table.CopyFrom(read.named_table)
    if read.HasField("common"):
        pruned.common.CopyFrom(read.common)
    pruned.base_schema.struct.nullability = read.base_schema.struct.nullability
    for index in selected:
        pruned.base_schema.names.extend(slices[index])
        pruned.base_schema.struct.types.append(types[index])
    if raw_empty:
        pruned.projection.select.SetInParent()  # outputs no column, like the original read
    return rel, raw_empty


def _name_slices(read: algebra_pb2.ReadRel) -> list[list[str]]:
    """Per top-level field, its NamedStruct names (its own and its nested fields')."""
    names = list(read.base_schema.names)
    slices: list[list[str]] = []
    position = 0
    for substrait_type in read.base_schema.struct.types:
        width = 1 + tree.nested_name_count(substrait_type)
        slices.append(names[position : position + width])
        position += width
    return slices
