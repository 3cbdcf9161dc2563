"""Decomposition: SQL in, a host super-plan and one Substrait sub-plan per stored-dataset read out.

The coordinator plans the SQL with DataFusion against empty tables that have the stored datasets'
schemas, converts the optimized plan to Substrait, and cuts it: each read of a stored dataset
becomes a fragment, and each rule moves operators from the super-plan into the fragment below
them. The super-plan reads each fragment's output as a table named after it.

Every rewrite is a named rule (``rules/``) in one of three ordered lists, run by
``optimizer.optimize``, which records the rules that fired (EXPLAIN VERBOSE):

- ``PLAN_RULES``, over the query's Substrait plan before the cut (``decimal_scale``,
  ``inner_by_equality``, ``semi_join_down``);
- ``RULES``, over the cut (the pushdowns; ``pushdown="never"`` runs none);
- ``DECOMPOSITION_RULES``, over the finished decomposition (``read_once``; the coordinator runs
  ``split_alike_by_join_keys`` first, ``coordinator.query.planning.shared_rules``).

Every fragment has three stages, so a device can decide at run time how much to do and the host
can finish the rest (DESIGN.md §3, Skytether §4 "flexibility"):

- `raw`: the scan of the columns the query needs;
- `filter`: raw plus the filter conjuncts the device can evaluate (same schema as raw; applying
  it twice changes nothing);
- `full`: the whole fragment (filter, projection, partial aggregate, limit or top-k).

Completion invariant: `full(rows) == full(filter(rows)) == full(raw(rows))`, and `full` of a
union is the union of `full` of its parts up to what the super-plan merges (partial aggregates
are merged, limits re-applied). So running `full` on the host over whatever came back raw or
filtered, and taking the union with what devices ran in full, gives the same answer whatever
mix of stages the slices came back in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
from datafusion import SQLOptions
from substrait import algebra_pb2, plan_pb2

from quarry.errors import InternalError
from quarry.plan import duckdb_super, engine, expressions, merge, tree, unsupported
from quarry.plan.capabilities import Capabilities
from quarry.plan.cut import Cut, FragmentDraft, SelectivityEstimate, initial_cut
from quarry.plan.duckdb_super import HostTable
from quarry.plan.errors import NeedsHostEngine, PlanError, UnknownTable
from quarry.plan.explain import Column, FragmentExplain, PlanExplain
from quarry.plan.optimizer import Fired, optimize
from quarry.plan.rules import Fixpoint, Rule, null_aware
from quarry.plan.rules.decimal_scale import decimal_scale
from quarry.plan.rules.holistic import holistic
from quarry.plan.rules.inner_by_equality import inner_by_equality
from quarry.plan.rules.null_divisor import null_divisor
from quarry.plan.rules.prune_slices import prune_slices
from quarry.plan.rules.push_filter import push_filter
from quarry.plan.rules.push_limit import push_limit
from quarry.plan.rules.push_projection import push_projection
from quarry.plan.rules.read_once import read_once
from quarry.plan.rules.semi_join_down import semi_join_down
from quarry.plan.rules.split_aggregate import split_aggregate
from quarry.plan.rules.split_predicate_by_capability import split_predicate_by_capability
from quarry.plan.statistics import SliceStatistic, answerable
from quarry.plan.trace import CutSnapshot, FragmentSnapshot, cut_snapshot, plan_snapshot
from quarry.protocol.stage import Stage
from quarry.pushdown import Pushdown

STAGES = (Stage.RAW, Stage.FILTER, Stage.FULL)  # the order their bytes travel in

PlanRules = Sequence[Rule[plan_pb2.Plan]]
CutRules = Sequence[Rule[Cut] | Fixpoint[Cut]]
DecompositionRules = Sequence[Rule["Decomposition"]]

PLAN_RULES: PlanRules = (decimal_scale, inner_by_equality, semi_join_down)
# Filters and projections interleave in DataFusion plans; moving one can expose the other, so
# they run in turn until neither moves anything. Each round that changes something moves at
# least one operator down, so a plan settles in far fewer rounds than this.
ROW_RULE_ROUNDS_MAX = 64
push_rows = Fixpoint("push_rows", (push_projection, push_filter), ROW_RULE_ROUNDS_MAX)
RULES: CutRules = (
    push_rows,
    split_predicate_by_capability,
    holistic,
    split_aggregate,
    push_limit,
    prune_slices,
)
DECOMPOSITION_RULES: DecompositionRules = (read_once,)


@dataclass
class Fragment:
    name: str  # host-side table name for its output
    dataset: str  # "domain/name"
    stages: dict[Stage, bytes]  # raw, filter, full -> Substrait Plan bytes
    output_schema: pa.Schema  # of "full"
    raw_schema: pa.Schema  # of "raw" and "filter"
    predicates: list[dict]  # zone-map-prunable conjuncts (JSON-serializable)
    pushed: list[str]  # operators pushed down, for EXPLAIN
    device_stages: tuple[Stage, ...] = STAGES  # the stages this fragment's devices can run
    capabilities: str = "full"
    device_filter: list[str] = field(default_factory=list)  # filter stage conjuncts, in order
    host_filter: list[str] = field(default_factory=list)  # conjuncts only the host checks
    notes: list[str] = field(default_factory=list)
    # "full" without its row filter, when every conjunct of that filter is a zone-map
    # predicate: a device runs it over slices whose zone maps say every row passes (b"": none)
    unfiltered: bytes = b""
    # that sub-plan (or "full" with no row filter) as slice statistics, when it is only
    # count / sum / min / max of stored columns: such slices are answered unread (() : not)
    statistics: tuple[SliceStatistic, ...] = ()

    def explained(self) -> FragmentExplain:
        return FragmentExplain(
            name=self.name,
            dataset=self.dataset,
            pushed=tuple(self.pushed),
            device_stages=tuple(self.device_stages),
            capabilities=self.capabilities,
            predicates=tuple(self.predicates),
            device_filter=tuple(self.device_filter),
            host_filter=tuple(self.host_filter),
            notes=tuple(self.notes),
            raw_schema=Column.of(self.raw_schema),
            output_schema=Column.of(self.output_schema),
            stage_bytes={Stage(stage): len(data) for stage, data in self.stages.items()},
            statistics=tuple(self.statistics),
            plan=stage_display(self, Stage.FULL),
        )

    def to_json(self) -> dict:
        return self.explained().to_json()


@dataclass
class Decomposition:
    super_plan: bytes  # Substrait; reads fragments by name
    fragments: list[Fragment]
    output_schema: pa.Schema
    pushdown: Pushdown = Pushdown.ALWAYS
    # groups of fragments whose sub-plans are alike (two reads of one dataset, the same way):
    # one of each group may be read for all (``read_once``), unless join keys cut them apart
    alike: tuple[tuple[str, ...], ...] = ()
    # the rules that changed the plan, the cut or this, in order, each with what it left
    # (EXPLAIN VERBOSE; rendered only when asked)
    fired: tuple[Fired, ...] = field(default=(), compare=False, repr=False)
    # a super-plan DataFusion cannot run: the query's SQL, which DuckDB runs over the fragments
    # under these names (``duckdb_super``; ``super_plan`` is then empty)
    host_sql: str = ""
    host_tables: tuple[HostTable, ...] = ()
    host_reason: str = ""  # why DataFusion could not

    def fragment(self, name: str) -> Fragment:
        for fragment in self.fragments:
            if fragment.name == name:
                return fragment
        raise KeyError(name)

    def super_display(self) -> str:
        if self.host_sql:
            names = ", ".join(f"{'.'.join(t.reference)} = {t.fragment}" for t in self.host_tables)
            reason = self.host_reason.splitlines()[0] if self.host_reason else ""
            return f"DuckDB runs the query over {names} ({reason})"
        plan = tree.parse_plan(self.super_plan)
        return host_frame(plan, self.fragments).logical_plan().display_indent()

    def explain(self) -> str:
        from quarry.plan.passthrough import passthrough_fragment

        lines = [f"pushdown: {self.pushdown}"]
        only = passthrough_fragment(self)
        if self.host_sql:
            lines.append(f"super-plan (host): {self.super_display()}")
        elif only is not None:
            lines.append(f"super-plan (host): pass-through of {only.name}, streamed as it arrives")
        else:
            from quarry.plan.memory import memory_summary

            lines.append(f"super-plan (host): {memory_summary(self)}")
            lines += ["  " + line for line in self.super_display().splitlines()]
        for fragment in self.fragments:
            pushed = ", ".join(fragment.pushed) or "nothing (raw scan)"
            where = f"pushed {pushed}"
            if self.pushdown is Pushdown.NEVER and fragment.pushed:
                # the coordinator's baseline: devices ship raw slices, the host runs the sub-plan
                # itself as they arrive (same work, bounded memory)
                where = f"the host runs {pushed} over raw slices as they arrive"
            lines.append(
                f"sub-plan {fragment.name} <- {fragment.dataset} [{fragment.capabilities}]: {where}"
            )
            lines.append(f"  device stages: {', '.join(fragment.device_stages)}")
            if fragment.device_filter:
                lines.append(f"  device filter: {' AND '.join(fragment.device_filter)}")
            if fragment.host_filter:
                lines.append(f"  host re-check: {' AND '.join(fragment.host_filter)}")
            if fragment.predicates:
                lines.append(f"  zone-map predicates: {fragment.predicates}")
            for note in fragment.notes:
                lines.append(f"  note: {note}")
            lines += ["    " + line for line in stage_display(fragment, Stage.FULL).splitlines()]
        return "\n".join(lines)

    def explained(self) -> PlanExplain:
        from quarry.plan.passthrough import passthrough_fragment

        only = passthrough_fragment(self)
        return PlanExplain(
            pushdown=self.pushdown,
            super_plan=self.super_display(),
            super_plan_passthrough=only.name if only is not None else None,
            output_schema=Column.of(self.output_schema),
            fragments=tuple(fragment.explained() for fragment in self.fragments),
        )

    def to_json(self) -> dict:
        return self.explained().to_json()


def stage_display(fragment: Fragment, stage: str) -> str:
    ctx = engine.session()
    domain, name = engine.split_dataset(fragment.dataset)
    ctx.sql(f"CREATE SCHEMA IF NOT EXISTS {engine.quote_identifier(domain)}").collect()
    reference = f"{engine.quote_identifier(domain)}.{engine.quote_identifier(name)}"
    engine.register_batches(ctx, reference, fragment.raw_schema, [])
    return engine.consume(ctx, fragment.stages[stage]).logical_plan().display_indent()


# the cut with every rule, or none (the host runs everything); the modes between are the
# coordinator's (it cuts with every rule and says where each part runs: ``planning.plan``)
DECOMPOSE_MODES = frozenset({Pushdown.NEVER, Pushdown.ALWAYS})


def decompose(
    sql: str,
    tables: Mapping[str, pa.Schema],
    pushdown: Pushdown | str = Pushdown.ALWAYS,
    capabilities: Mapping[str, Capabilities | str] | None = None,
    selectivity: SelectivityEstimate | None = None,
    rules: CutRules | None = None,
    plan_rules: PlanRules = PLAN_RULES,
    decomposition_rules: DecompositionRules = DECOMPOSITION_RULES,
) -> Decomposition:
    """Cut `sql` into a super-plan and sub-plans.

    `tables` maps "domain/name" to each stored dataset's schema; SQL names a dataset as
    `domain.name`, or `name` when no other domain has that name. `capabilities` maps a dataset
    (or "*" for all) to what every device storing it can evaluate, as a `Capabilities` or its
    name ("full", "scan_filter"); the coordinator passes the intersection when a dataset spans
    profiles; missing means full. `selectivity`, if given, estimates a filter conjunct's
    selectivity from its description (`split_predicate_by_capability.describe`); when it
    returns None, textbook defaults apply.

    The rules run in three ordered lists: `plan_rules` over the Substrait plan, `rules` over the
    cut (by default `RULES` under "always" and none under "never"), `decomposition_rules` over
    the finished decomposition (by default ``read_once``: alike sub-plans are read once; ``()``
    leaves each read its own fragment, for a caller that decides which may share, as a join's
    keys may cut them apart: ``coordinator.query.planning.shared_rules``). The result carries
    the rules that fired, in order (``Decomposition.fired``).
    """
    pushdown = Pushdown.parse(pushdown, DECOMPOSE_MODES)
    if rules is None:
        rules = RULES if pushdown is Pushdown.ALWAYS else ()
    try:
        cut, output, plan_fired = plan_cut(sql, tables, capabilities, selectivity, plan_rules)
    except NeedsHostEngine as needs:
        return _for_duckdb(sql, tables, pushdown, capabilities, selectivity, rules, needs)
    cut, cut_fired = optimize(cut, rules, cut_snapshot, copy=Cut.copy)
    decomposition = finalize(cut, output, pushdown)
    decomposition.fired = (*plan_fired, *cut_fired)
    return rewritten(decomposition, decomposition_rules)


def _for_duckdb(
    sql: str,
    tables: Mapping[str, pa.Schema],
    pushdown: Pushdown,
    capabilities: Mapping[str, Capabilities | str] | None,
    selectivity: SelectivityEstimate | None,
    rules: CutRules,
    needs: NeedsHostEngine,
) -> Decomposition:
    """A query DataFusion cannot run: each dataset it reads one fragment, cut as the scan of
    the columns DataFusion's plan reads of it and those the SQL names (a column DataFusion's
    optimizer simplified away is still bound by DuckDB, and a name left out would bind to an
    output alias of that name instead); every column where DataFusion did not plan the query.
    The query's SQL is the super-plan, for DuckDB (``duckdb_super``)."""
    catalog = engine.Catalog(dict(tables))
    datasets = duckdb_super.datasets_read(sql, catalog)
    read = duckdb_super.columns_read(needs.plan, catalog) if needs.plan else None
    columns = {dataset: tables[dataset].names for dataset in datasets}
    if read is not None and not duckdb_super.selects_every_column(sql):
        named = duckdb_super.words(sql)
        columns = {
            dataset: [c for c in names if c in read.get(dataset, ()) or c.lower() in named]
            or names[:1]  # count(*) alone: a column for the rows
            for dataset, names in columns.items()
        }
    schema = duckdb_super.answer_schema(sql, _narrowed(tables, columns), catalog, datasets)
    fragments: list[Fragment] = []
    host_tables: list[HostTable] = []
    for index, dataset in enumerate(datasets):
        name = f"{engine.RESERVED_PREFIX}_fragment_{index}"
        scan = ", ".join(engine.quote_identifier(c) for c in columns[dataset])
        reference = ".".join(engine.quote_identifier(p) for p in engine.split_dataset(dataset))
        alone = decompose(
            f"SELECT {scan} FROM {reference}",
            tables,
            pushdown,
            capabilities,
            selectivity,
            rules,
            decomposition_rules=(),
        )
        (fragment,) = alone.fragments
        fragments.append(replace(fragment, name=name))
        host_tables += [HostTable(r, name) for r in duckdb_super.references(dataset, catalog)]
    # DataFusion's names and types where it planned the query as DuckDB does (a star may
    # expand otherwise over a join's USING columns)
    output = needs.output if needs.output is not None else schema
    if len(output) != len(schema):
        output = schema
    return Decomposition(
        b"",
        fragments,
        output,
        pushdown,
        host_sql=sql,
        host_tables=tuple(host_tables),
        host_reason=str(needs),
    )


def _narrowed(
    tables: Mapping[str, pa.Schema], columns: Mapping[str, list[str]]
) -> dict[str, pa.Schema]:
    return {
        dataset: pa.schema([schema.field(c) for c in columns[dataset]])
        if dataset in columns
        else schema
        for dataset, schema in tables.items()
    }


def rewritten(decomposition: Decomposition, rules: DecompositionRules) -> Decomposition:
    """``decomposition`` after ``rules``, its ``fired`` extended by those that fired. The rules
    build a new decomposition: the one given, perhaps the plan cache's, is left as it was."""
    result, fired = optimize(decomposition, rules, decomposition_snapshot)
    return replace(result, fired=(*result.fired, *fired)) if fired else result


def decomposition_snapshot(decomposition: Decomposition) -> CutSnapshot:
    """The decomposition as EXPLAIN VERBOSE shows it after a rule: its bytes, not copied."""
    fragments = tuple(
        FragmentSnapshot(
            name=f.name,
            dataset=f.dataset,
            pushed=tuple(f.pushed),
            notes=tuple(f.notes),
            predicates=tuple(f.predicates),
            # (None: no conjunct to split, as a draft before split_predicate_by_capability)
            device_filter=tuple(f.device_filter) if f.device_filter or f.host_filter else None,
            host_filter=tuple(f.host_filter),
            plan=f.stages[Stage.FULL],
        )
        for f in decomposition.fragments
    )
    return CutSnapshot(decomposition.super_plan, fragments, decomposition.alike)


def plan_cut(
    sql: str,
    tables: Mapping[str, pa.Schema],
    capabilities: Mapping[str, Capabilities | str] | None = None,
    selectivity: SelectivityEstimate | None = None,
    plan_rules: PlanRules = PLAN_RULES,
) -> tuple[Cut, pa.Schema, tuple[Fired, ...]]:
    """The starting cut of `sql` (after `plan_rules`, before any cut rule), the query's output
    schema, and the plan rules that fired."""
    try:
        catalog = engine.Catalog(dict(tables))
        resolved = {
            dataset: (Capabilities.named(c) if isinstance(c, str) else c)
            for dataset, c in (capabilities or {}).items()
        }
        unknown = sorted(set(resolved) - set(tables) - {"*"})
        if unknown:
            raise ValueError(
                f"capabilities given for unknown dataset(s) {', '.join(unknown)}; "
                f"datasets: {', '.join(sorted(tables))}"
            )
    except ValueError as error:
        raise PlanError(str(error)) from None
    ctx = engine.session()
    catalog.register(ctx)
    options = SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)
    try:
        logical = ctx.sql_with_options(sql, options).optimized_logical_plan()
        # The types as DataFusion answers them: a frame's own schema is the plan's before
        # type coercion (CASE WHEN x > 50 THEN x ELSE 1.5 END is int64 there, double after).
        output = ctx.create_dataframe_from_logical_plan(logical).schema()
    except Exception as error:  # DataFusion raises ValueError / Exception subclasses
        raise plan_error(str(error), catalog) from None
    try:
        plan = engine.produce_logical(ctx, logical)
    except Exception as error:
        raise _with_plan(unsupported.producer_error(_clean(str(error))), output, logical) from None
    unsupported.refuse_untyped_nulls(plan)
    # the plan DataFusion just produced: nobody else holds it, so the rules change it as it is;
    # null_aware and null_divisor first and always (answers depend on them), then the optional
    try:
        always = (null_aware.rule(logical, ctx), null_divisor)
        plan, fired = optimize(plan, (*always, *plan_rules), plan_snapshot)
    except NeedsHostEngine as needs:
        raise _with_plan(needs, output, logical) from None
    return initial_cut(plan, catalog, ctx, resolved, selectivity), output, fired


def _with_plan(error: PlanError, output: pa.Schema, logical) -> PlanError:
    """A query DataFusion planned but cannot run: what ``duckdb_super`` needs of its plan."""
    if isinstance(error, NeedsHostEngine):
        error.output, error.plan = output, logical.display_indent()
    return error


def _clean(message: str) -> str:
    for prefix in ("DataFusion error: ", "Error during planning: ", "Schema error: "):
        message = message.replace(prefix, "")
    return message.strip()


def plan_error(message: str, catalog: engine.Catalog) -> PlanError:
    """The parser's message plus a hint at what to do."""
    text = _clean(message)
    kind = PlanError
    if "not supported" in message and any(w in message for w in ("DDL", "DML", "Statement")):
        hint = "only SELECT queries run on quarry; datasets are loaded through quarry itself"
    elif "single SQL statement" in message:
        hint = "send one statement at a time"
    elif "ParserError" in message or "SQL error" in message:
        hint = "check the SQL syntax at the line and column given"
    elif "not found" in message and "table" in message:
        kind = UnknownTable
        hint = f"known tables: {', '.join(catalog.sql_names()) or '(none)'}"
    elif "No field named" in message:
        hint = "check the column name and its table qualifier"
    elif "unique expression names" in message or "ambiguous" in message:
        # SQL allows output names that repeat; DataFusion does not: DuckDB runs the super-plan
        kind = NeedsHostEngine
        hint = "give each output column a name of its own (AS name)"
    elif "coerce" in message or "type" in message.lower():
        hint = "convert one side explicitly, e.g. CAST(x AS DOUBLE)"
    else:
        hint = "check the query against the tables' schemas"
    return kind(f"{text}\nhint: {hint}")


@dataclass
class _Built:
    draft: FragmentDraft
    fragment: Fragment
    hidden: bool  # the placeholder masks the one column the fragment ships (count(*))


def finalize(cut: Cut, output: pa.Schema, pushdown: Pushdown) -> Decomposition:
    """Stages for every fragment, typed placeholders in the super-plan, invariants checked.
    Every read keeps its own fragment; those with alike sub-plans are grouped (``alike``)."""
    built = [_build_fragment(cut, draft) for draft in cut.fragments]
    groups: dict[tuple, list[str]] = {}
    for item in built:
        key = (
            item.fragment.dataset,
            item.hidden,
            *(item.fragment.stages[stage] for stage in STAGES),
        )
        groups.setdefault(key, []).append(item.draft.name)

    super_plan = tree.copy_plan(cut.plan)
    by_name = {item.draft.name: item for item in built}
    typed = {name: typed_read(name, item.fragment.output_schema) for name, item in by_name.items()}
    for rel in list(tree.iter_rels(super_plan)):
        names = tree.named_table(rel)
        if names is None or len(names) != 1 or names[0] not in by_name:
            continue
        name = names[0]
        # A read planned by DataFusion over the fragment table (the host half of a split
        # aggregate) may select some of its fields: keep that selection.
        mask = None
        if rel.read.HasField("projection"):
            mask = algebra_pb2.Expression.MaskExpression()
            mask.CopyFrom(rel.read.projection)
        tree.replace(rel, typed[name])
        if by_name[name].hidden:
            rel.read.projection.select.SetInParent()
        elif mask is not None:
            rel.read.projection.CopyFrom(mask)

    fragments = [item.fragment for item in built]
    schema = host_frame(super_plan, fragments).schema()
    if schema.types != output.types:  # the answer would be cast to types it does not have
        raise InternalError(
            f"decomposition changed the result types: {_types(schema)} where DataFusion "
            f"answers {_types(output)}"
        )
    alike = tuple(tuple(names) for names in groups.values() if len(names) > 1)
    return Decomposition(super_plan.SerializeToString(), fragments, output, pushdown, alike)


def _types(schema: pa.Schema) -> str:
    return ", ".join(f"{field.name} {field.type}" for field in schema)


def host_frame(
    super_plan: plan_pb2.Plan,
    fragments: list[Fragment],
    tables: Mapping[str, pa.Schema] | None = None,
):
    """The super-plan in a host context whose fragment tables (and ``tables``) are empty (for
    types, display)."""
    ctx = engine.session()
    merge.register_merge_functions(ctx, tree.function_names(super_plan).values())
    for fragment in fragments:
        engine.register_batches(ctx, fragment.name, fragment.output_schema, [])
    for name, schema in (tables or {}).items():
        engine.register_batches(ctx, name, schema, [])
    return engine.consume(ctx, super_plan)


def typed_read(name: str, schema: pa.Schema) -> algebra_pb2.Rel:
    """A read of the fragment's table typed exactly as DataFusion's producer types it."""
    ctx = engine.session()
    engine.register_batches(ctx, name, schema, [])
    plan = engine.produce(ctx, ctx.table(name))
    rel = tree.root_rel(plan)
    assert tree.kind(rel) == "read", f"SELECT * planned as {tree.kind(rel)}, not a read"
    rel.read.ClearField("projection")
    assert len(rel.read.base_schema.struct.types) == len(schema), "typed read lost fields"
    return tree.copy_rel(rel)


def _build_fragment(cut: Cut, draft: FragmentDraft) -> _Built:
    names = cut.function_names()
    domain, dataset_name = engine.split_dataset(draft.dataset)
    read = draft.read
    raw_fields = tree.read_field_names(read)

    raw_rel = algebra_pb2.Rel()
    raw_rel.read.base_schema.CopyFrom(read.base_schema)
    raw_rel.read.named_table.names.extend([domain, dataset_name])

    device_conjuncts = draft.device_conjuncts
    if device_conjuncts is None:
        device_conjuncts = [
            c for c in draft.raw_conjuncts if draft.capabilities.supports_predicate(c, names)
        ]
    if device_conjuncts:
        filter_rel = algebra_pb2.Rel()
        filter_rel.filter.input.CopyFrom(raw_rel)
        filter_rel.filter.condition.CopyFrom(expressions.conjoin(device_conjuncts, cut.plan))
    else:
        filter_rel = raw_rel

    nothing_pushed = tree.kind(draft.rel) == "read"
    hidden = nothing_pushed and draft.raw_empty
    if nothing_pushed:
        full_rel = raw_rel
    else:
        full_rel = tree.copy_rel(draft.rel)
        for rel in tree.iter_rels(full_rel):
            if tree.kind(rel) == "read":
                tree.set_named_table(rel, [domain, dataset_name])
    output = engine.plan_schema(cut.ctx, tree.make_plan(cut.plan, full_rel))
    if len(output) == 0:
        # A fragment whose parent reads no column (count(*) over a filter): ship one constant
        # column so batches carry row counts, and let the placeholder mask it away.
        full_rel = _with_constant_column(full_rel)
        output = engine.plan_schema(cut.ctx, tree.make_plan(cut.plan, full_rel))
        hidden = True
    visible = 0 if hidden else len(output)
    if visible != draft.width:
        raise InternalError(
            f"{draft.name} outputs {visible} fields where the super-plan reads {draft.width}"
        )
    output_names = engine.unique_names(output.names)
    raw_schema = engine.plan_schema(cut.ctx, tree.make_plan(cut.plan, raw_rel))
    assert raw_schema.names == raw_fields, "the raw stage ships exactly the needed columns"
    filter_schema = engine.plan_schema(cut.ctx, tree.make_plan(cut.plan, filter_rel))
    assert filter_schema.types == raw_schema.types, "the filter stage keeps the raw schema"

    def encode(rel: algebra_pb2.Rel, schema: pa.Schema, names: list[str]) -> bytes:
        flat = not any(pa.types.is_nested(f.type) for f in schema)
        return tree.make_plan(cut.plan, rel, names if flat else None).SerializeToString()

    stages = {
        Stage.RAW: encode(raw_rel, raw_schema, raw_fields),
        Stage.FILTER: encode(filter_rel, raw_schema, raw_fields),
        Stage.FULL: encode(full_rel, output, output_names),
    }
    output_schema = pa.schema(
        [pa.field(n, f.type, f.nullable) for n, f in zip(output_names, output)]
    )
    predicates = list(draft.predicates)  # ``prune_slices``: none when it did not run
    unfiltered, bare = b"", None
    if predicates and len(predicates) == len(draft.raw_conjuncts) and not nothing_pushed:
        bare = _without_row_filter(full_rel)
        unfiltered = b"" if bare is None else encode(bare, output, output_names)
    elif not draft.raw_conjuncts and not nothing_pushed:
        bare = full_rel
    fragment = Fragment(
        name=draft.name,
        dataset=draft.dataset,
        stages=stages,
        output_schema=output_schema,
        raw_schema=raw_schema,
        predicates=predicates,
        pushed=list(draft.pushed),
        device_stages=_device_stages(cut, draft, names),
        capabilities=draft.capabilities.name,
        device_filter=[expressions.render(c, names, raw_fields) for c in device_conjuncts],
        host_filter=[expressions.render(c, names, raw_fields) for c in draft.host_conjuncts],
        notes=list(draft.notes),
        unfiltered=unfiltered,
        statistics=() if bare is None else answerable(bare, cut.function_names()),
    )
    return _Built(draft, fragment, hidden)


def _without_row_filter(rel: algebra_pb2.Rel) -> algebra_pb2.Rel | None:
    """``rel`` without the filters right above its read (those of the rows as stored: the
    fragment's raw conjuncts); None when there are none."""
    copied = tree.copy_rel(rel)
    node: algebra_pb2.Rel | None = copied
    while node is not None and tree.kind(node) != "read":
        if tree.kind(node) == "filter" and _filters_down_to_read(node):
            tree.replace(node, _read_below(node))
            return copied
        node = tree.single_input(node)
    return None


def _read_below(rel: algebra_pb2.Rel) -> algebra_pb2.Rel:
    while tree.kind(rel) != "read":
        rel = tree.single_input(rel)  # type: ignore[assignment]
    return rel


def _filters_down_to_read(rel: algebra_pb2.Rel) -> bool:
    while tree.kind(rel) == "filter":
        rel = tree.single_input(rel)  # type: ignore[assignment]
    return tree.kind(rel) == "read"


def _with_constant_column(rel: algebra_pb2.Rel) -> algebra_pb2.Rel:
    wrapped = algebra_pb2.Rel()
    wrapped.project.input.CopyFrom(rel)
    wrapped.project.expressions.add().literal.boolean = True
    return wrapped


def _device_stages(cut: Cut, draft: FragmentDraft, names: Mapping[int, str]) -> tuple[str, ...]:
    """All stages for full devices; a restricted device runs `full` only if it is all simple."""
    if draft.capabilities.runs_whole(draft.rel, names):
        return STAGES
    return (Stage.RAW, Stage.FILTER)
